"""The ConfigDict edge: dotted field names, unknown-field messages, rule helpers.

Sections (`dpnmt.config.sections`) derive from `Section` and describe their
problems with these helpers, so every message has one form: the dotted field,
its value, what it must be.
"""

import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any, Literal

import ml_collections


def flatten(tree: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def field_value(config: ml_collections.ConfigDict, field: str) -> Any:
    """The value of dotted `field` ("dp.delta") in `config`."""
    value = config
    for part in field.split("."):
        value = value[part]
    return value


def config_fields(config: ml_collections.ConfigDict) -> list[str]:
    """Every leaf field of `config`, dotted."""
    return sorted(flatten(config.to_dict()))


def unknown_field_message(field: str, known: Iterable[str]) -> str:
    """The line for an unknown field, with the closest known one (`no field dp.epsilon; ...`)."""
    known = list(known)
    close = difflib.get_close_matches(field, known, n=1, cutoff=0.5)
    if not close:  # Same group, closest leaf name ("dp.epsilon" -> "dp.target_epsilon").
        group, _, leaf = field.rpartition(".")
        leaves = [k for k in known if k.rpartition(".")[0] == group]
        by_leaf = [k for k in leaves if leaf and leaf in k.rpartition(".")[2]]
        close = by_leaf[:1] or difflib.get_close_matches(field, leaves, n=1, cutoff=0.3)
    hint = f"did you mean {close[0]}?" if close else "see dpnmt/config_lib.py for the fields."
    return f"no field {field}; {hint}"


def check_override_flags(argv: Iterable[str], known: Iterable[str]) -> list[str]:
    """One line for each `--config.<field>` flag naming a field the config lacks.

    Args:
      argv: command-line arguments (`--config.dp.epsilon=1`, `--noconfig.x`, ...).
      known: the config's fields (`RunConfig.fields()`).

    Returns:
      Problems, one line each with the closest field; empty when all are known.
    """
    known = set(known)
    problems = []
    for arg in argv:
        match = re.match(r"^--(?:no)?config\.([^=\s]+)", arg)
        if match and match.group(1) not in known:
            problems.append(
                f"--config.{match.group(1)}: {unknown_field_message(match.group(1), known)}"
            )
    return problems


def choice_problems(field: str, value: Any, allowed: Iterable[str]) -> list[str]:
    """`field=value is unknown (did you mean ...); use one of [...]` unless `value` is allowed."""
    allowed = tuple(allowed)
    if value in allowed:
        return []
    close = difflib.get_close_matches(str(value), allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return [f"{field}={value!r} is unknown{hint}; use one of {list(allowed)}."]


def range_problems(field: str, value: Any, test: Callable[[Any], bool], must: str) -> list[str]:
    """`field=value must be <must>.` unless `test(value)`; None (unset) passes."""
    if value is None:
        return []
    try:
        ok = bool(test(value))
    except TypeError:
        ok = False
    return [] if ok else [f"{field}={value!r} must be {must}."]


def at_least(low: int) -> Callable[[Any], bool]:
    """A test: the value is >= low."""
    return lambda v: v >= low


def whole_at_least(low: int) -> Callable[[Any], bool]:
    """A test: the value is an int (not a bool) >= low."""
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


def positive_finite(v: Any) -> bool:
    """A test: 0 < v < inf."""
    return v > 0 and math.isfinite(v)


def unit_open(v: Any) -> bool:
    """A test: 0 < v < 1."""
    return 0 < v < 1


def unit_right_open(v: Any) -> bool:
    """A test: 0 <= v < 1."""
    return 0 <= v < 1


def lot_size(dp, train) -> tuple[int, str]:
    """L of a run and the field it comes from: the one rule the plan and the config share.

    `dp.unit="group"`: L_groups, the expected number of GROUPS per lot, is
    `dp.group_lot_size`; unset, `train.expected_lot_size` counts groups
    instead (runs written before `dp.group_lot_size` existed, e.g.
    docs/results/groups_*). Otherwise L is `train.expected_lot_size`, in
    examples (`dp.group_lot_size` is not read).

    Args:
      dp: `config.dp` (a `PrivacyConfig` or its ConfigDict).
      train: `config.train` (a `TrainConfig` or its ConfigDict).

    Returns:
      (L, "dp.group_lot_size" or "train.expected_lot_size").
    """
    if getattr(dp, "unit", "example") == "group":
        groups = getattr(dp, "group_lot_size", None)
        if groups is not None:
            return groups, "dp.group_lot_size"
    return train.expected_lot_size, "train.expected_lot_size"


class Section:
    """Shared by the sections: `NAME` (the ConfigDict key) and the rule helpers."""

    NAME: typing.ClassVar[str]

    def choices(self) -> dict[str, tuple[str, ...]]:
        """Every `Literal` field of this section and its allowed values."""
        hints = typing.get_type_hints(type(self))
        out = {}
        for field in dataclasses.fields(self):
            hint = hints[field.name]
            if typing.get_origin(hint) is Literal:
                out[field.name] = typing.get_args(hint)
            elif typing.get_origin(hint) in (typing.Union, types.UnionType):
                literals = [a for a in typing.get_args(hint) if typing.get_origin(a) is Literal]
                if literals:
                    out[field.name] = typing.get_args(literals[0])
        return out

    def choice_problems(self) -> list[str]:
        """A value outside its `Literal` (None passes where the type allows it)."""
        hints = typing.get_type_hints(type(self))
        problems = []
        for name, allowed in self.choices().items():
            value = getattr(self, name)
            if value is None and type(None) in typing.get_args(hints[name]):
                continue
            problems += choice_problems(f"{self.NAME}.{name}", value, allowed)
        return problems

    def ranges(self, rules) -> list[str]:
        """Problems of (field, test, what it must be) rules; unset (None) fields pass."""
        problems = []
        for name, test, must in rules:
            problems += range_problems(f"{self.NAME}.{name}", getattr(self, name), test, must)
        return problems
