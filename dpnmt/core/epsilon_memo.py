"""The ε of events this process computed already (`accounting.event_epsilon`'s memo).

ε is a pure function of the event, δ and the accountant, so a repeat (a run's
report at the σ its calibration just evaluated, a resumed run's plan, the same
calibration twice) is looked up instead of recomputed: a PLD of T steps takes
seconds. Keys hold every field of the event exactly; an event with a field that
cannot be keyed so (e.g. a NumPy value) is not remembered.
"""

import dp_accounting

_EPSILONS: dict = {}
_MAX_REMEMBERED = 4096
_EXACT_SCALARS = (bool, int, str, type(None))  # A float is keyed by its hex.


def key(event, delta: float, accountant: str):
    """The memo's key of (event, δ, accountant), or None where event or δ cannot be keyed."""
    event_key, delta_key = _value_key(event), _value_key(delta)
    if event_key is None or delta_key is None:
        return None
    return (event_key, delta_key, str(accountant))


def recall(memo_key) -> float | None:
    """The remembered ε of `memo_key` (None: not remembered, or not keyable)."""
    return None if memo_key is None else _EPSILONS.get(memo_key)


def remember(memo_key, epsilon: float) -> float:
    """Stores ε under `memo_key` (unless None) and returns it; forgets all at 4096 entries."""
    if memo_key is not None:
        if len(_EPSILONS) >= _MAX_REMEMBERED:
            _EPSILONS.clear()
        _EPSILONS[memo_key] = epsilon
    return epsilon


def _value_key(value):
    """A hashable key holding every field of a `DpEvent` exactly, or None if it cannot."""
    if isinstance(value, dp_accounting.DpEvent):
        fields = vars(type(value)).get("__attrs_attrs__")  # attrs; its own, not a parent's.
        if fields is None:
            return None
        keys = tuple(_value_key(getattr(value, field.name)) for field in fields)
        if None in keys:
            return None
        names = tuple(field.name for field in fields)
        return (type(value), names, keys)  # The class itself: two of one name differ.
    if isinstance(value, (list, tuple)):
        keys = tuple(_value_key(item) for item in value)
        return None if None in keys else ("sequence", keys)
    if type(value) is float:
        # hex: -0.0 and 0.0 stay apart; a NaN (equal to no float) is never remembered.
        return None if value != value else ("float", value.hex())
    if type(value) in _EXACT_SCALARS:
        return (type(value).__name__, value)
    return None
