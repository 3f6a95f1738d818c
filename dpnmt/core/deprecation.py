"""Deprecated spellings of the core's arguments: they keep working, with a warning.

A renamed keyword, or a privacy parameter that was positional and is now
keyword-only, is accepted for at least one minor release after the release that
deprecated it, with an `ArgumentDeprecationWarning` naming the new spelling
(the result is the same). `DEPRECATED` lists every such spelling;
`tests/core/test_changelog.py` checks that CHANGELOG.md names each one.
"""

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import NamedTuple


class ArgumentDeprecationWarning(DeprecationWarning):
    """An old argument name or an old positional use of a `dpnmt.core` function."""


class DeprecatedSpelling(NamedTuple):
    """One deprecated spelling: `function(old)`, now `function(new)`."""

    function: str
    old: str
    new: str


DEPRECATED: list[DeprecatedSpelling] = []


def _warn(message: str) -> None:
    # The fixed prefix lets a warnings filter (setup.cfg's, for our tests) match
    # these without importing dpnmt; stacklevel 3: past this helper and the
    # wrapper, at the caller's line.
    warnings.warn(f"dpnmt.core: {message}", ArgumentDeprecationWarning, stacklevel=3)


def deprecated_arguments(
    *, renamed: dict[str, str] | None = None, positional: tuple[str, ...] = ()
) -> Callable[[Callable], Callable]:
    """Decorator: a function's old keyword names and old positional uses still work, with a warning.

    Args:
      renamed: `{old keyword: new keyword}`; `f(old=v)` warns and calls `f(new=v)`.
      positional: the new names, in their old order, of arguments that followed
        the function's positional parameters and are now keyword-only;
        `f(a, v)` warns and calls `f(a, name=v)`.

    Returns:
      The decorator. Passing both spellings of one argument raises TypeError.
    """
    renamed = dict(renamed or {})

    def wrap(fn: Callable) -> Callable:
        params = inspect.signature(fn).parameters.values()
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        num_positional = sum(p.kind in kinds for p in params)
        name = fn.__name__
        DEPRECATED.extend(DeprecatedSpelling(name, old, new) for old, new in renamed.items())
        DEPRECATED.extend(DeprecatedSpelling(name, f"positional {new}", new) for new in positional)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            extra = args[num_positional:]
            if extra:
                if len(extra) > len(positional):
                    raise TypeError(
                        f"{name}() takes {num_positional} positional arguments but "
                        f"{len(args)} were given."
                    )
                names = positional[: len(extra)]
                for new, value in zip(names, extra, strict=True):
                    _set_once(kwargs, name, new, value)
                spelled = ", ".join(f"{new}=..." for new in names)
                _warn(
                    f"{name}(): passing {', '.join(names)} by position is deprecated; "
                    f"pass {spelled} by keyword (the same call)."
                )
                args = args[:num_positional]
            for old, new in renamed.items():
                if old in kwargs:
                    _set_once(kwargs, name, new, kwargs.pop(old))
                    _warn(f"{name}({old}=...) is deprecated: use {name}({new}=...) (the same).")
            return fn(*args, **kwargs)

        return wrapper

    return wrap


def _set_once(kwargs: dict, function: str, name: str, value) -> None:
    if name in kwargs:
        raise TypeError(f"{function}() got {name} twice (old and new spelling): pass {name}= only.")
    kwargs[name] = value
