"""σ hints: each noise calibration's answer, kept for the next calibration of the same plan.

`privacy.plan_privacy` calibrates through `calibrate`, which looks a hint up
first and records the answer after (start-up time: a PLD calibration takes several ε evaluations of
seconds each). The calibration never trusts a hint: it returns one only when
two fresh ε evaluations prove it the search's answer within its tolerance
(`dpnmt.core.accounting`), so a stale, edited or foreign file costs those two
evaluations and nothing else. A key holds public quantities only (the
sampling, target ε, q or epochs, T, δ, accountant); the file lives in the
user's cache folder (`cache_dir`), never in a workdir. A cache: a file that
cannot be read or written is ignored.
"""

import importlib.metadata
import json
import logging
import os

from dpnmt import atomic_file, cache_dir

FILE = "sigma_hints.json"
_KEY_VERSION = 1  # Bump when `dpnmt.core.sigma_search` changes what it returns.
_ACCOUNTING = importlib.metadata.version("dp-accounting")
MAX_ENTRIES = 1000  # The oldest go first.


def path() -> str:
    """The hints file: `cache_dir.folder("privacy")/sigma_hints.json`."""
    return os.path.join(cache_dir.folder("privacy"), FILE)


def key(sampling: str, *numbers: float | int, accountant: str) -> str | None:
    """The exact key of a calibration, or None (no hint) where a number is not an int or float.

    Floats by `float.hex`, so no rounding merges two; the dp_accounting version
    and `_KEY_VERSION` too, so that a new accountant or search calibrates afresh.
    """
    exact = []
    for n in numbers:
        if isinstance(n, float):
            exact.append(n.hex())
        elif isinstance(n, int) and not isinstance(n, bool):
            exact.append(n)
        else:
            return None
    return json.dumps([_KEY_VERSION, _ACCOUNTING, sampling, *exact, accountant])


def _read() -> dict:
    try:
        with open(path(), encoding="utf-8") as f:
            hints = json.load(f)
    except (OSError, ValueError, RecursionError):  # RecursionError: absurdly nested JSON.
        return {}
    return hints if isinstance(hints, dict) else {}


def lookup(hint_key: str | None) -> float | None:
    """The σ recorded for `hint_key`, or None (no key, none recorded, or not a float)."""
    if hint_key is None:
        return None
    value = _read().get(hint_key)
    return value if isinstance(value, float) else None


def record(hint_key: str | None, sigma: float) -> None:
    """Keeps `sigma` for `hint_key` (atomically; a failure is logged at debug level only)."""
    if hint_key is None:
        return
    hints = _read()
    if hints.get(hint_key) == sigma:
        return
    hints.pop(hint_key, None)
    hints[hint_key] = float(sigma)
    for old in list(hints)[: max(0, len(hints) - MAX_ENTRIES)]:
        del hints[old]
    try:
        os.makedirs(os.path.dirname(path()), exist_ok=True)
        atomic_file.write_atomic(path(), json.dumps(hints))
    except OSError as error:
        logging.debug("σ hints not kept (%s): %s", path(), error)


def calibrate(calibration, plan: tuple, dp_config, dataset_size: int) -> float:
    """`calibration(*plan[1:], δ, accountant, dataset_size=, hint=)`, hinted and recorded.

    Args:
      calibration: `core.calibrate_noise_multiplier` or its shuffled twin.
      plan: (sampling, target ε, then the calibration's q and T, or its epochs).
      dp_config: `config.dp` (delta, accountant).
      dataset_size: N, for the calibration's δ warning.

    Returns:
      The calibration's σ (the hint only where the calibration proved it).
    """
    sampling, *arguments = plan
    delta, accountant = dp_config.delta, dp_config.accountant
    hint_key = key(sampling, *arguments, delta, accountant=accountant)
    sigma = calibration(
        *arguments, delta, accountant, dataset_size=dataset_size, hint=lookup(hint_key)
    )
    record(hint_key, sigma)
    return sigma
