"""What every dpnmt app shares: config-field checks on the flags, one-line errors, quiet logs.

`run(main)` replaces `absl.app.run(main)`: a `--config.<field>` naming no field
fails in one line with the closest field; an `InputError` (a bad input the
user fixes) prints as one line on stderr with exit status 2, without a
traceback; any other exception keeps its traceback (it is a bug).
"""

import logging
import os
import sys
from collections.abc import Callable, Sequence

from absl import app, flags
from absl import logging as absl_logging

from dpnmt import config_check
from dpnmt.errors import InputError

USAGE_EXIT_CODE = 2
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def program_name() -> str:
    """The app's name for messages, e.g. "dpnmt.train"."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return spec.name if spec is not None and spec.name else os.path.basename(sys.argv[0])


def fail(message: str) -> None:
    """Prints `<app>: <message>` on stderr and exits with status 2."""
    print(f"{program_name()}: {message}", file=sys.stderr, flush=True)
    sys.exit(USAGE_EXIT_CODE)


def parse_flags(argv: Sequence[str]) -> list[str]:
    """Parses flags as absl does, after checking every `--config.<field>` names a field."""
    problems = config_check.check_override_flags(argv[1:])
    if problems:
        fail("\n".join(problems))
    try:
        return flags.FLAGS(list(argv))
    except flags.Error as error:
        fail(f"{error}\nPass --helpfull to see help on flags.")
    except InputError as error:  # A config file's own check (e.g. an unknown :variant).
        fail(str(error))
    except (AttributeError, KeyError, ValueError, TypeError) as error:
        # ml_collections raises these for a bad --config.<field>=<value> or config file.
        fail(f"bad --config flag or config file: {type(error).__name__}: {error}")
    return []  # Not reached.


class _OwnInfoOnly(logging.Filter):
    """Passes dpnmt's INFO lines and everyone's warnings; library INFO is DEBUG-only."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING or absl_logging.get_verbosity() >= absl_logging.DEBUG:
            return True
        return os.path.abspath(record.pathname).startswith(_PACKAGE_DIR)


def setup_logging(*, primary: bool = True) -> None:
    """INFO from dpnmt (plan, progress, evaluations, where results went), WARNING from others.

    Orbax, absl checkpoint internals and datasets log many INFO lines per
    checkpoint; they show only with `--verbosity=1` (DEBUG). A process other than
    the primary logs warnings only.
    """
    import datasets  # noqa: PLC0415 - heavy; only apps need it.

    absl_logging.set_verbosity(absl_logging.INFO if primary else absl_logging.WARNING)
    handler = absl_logging.get_absl_handler()
    if not any(isinstance(f, _OwnInfoOnly) for f in handler.filters):
        handler.addFilter(_OwnInfoOnly())
    datasets.utils.logging.set_verbosity_warning()
    datasets.disable_progress_bars()


def guard(main: Callable[[list[str]], None]) -> Callable[[list[str]], None]:
    """`main` with quiet logs, and an `InputError` printed as one line (exit status 2)."""

    def guarded(argv):
        setup_logging()  # Before JAX starts logging; the app may narrow it.
        try:
            return main(argv)
        except InputError as error:
            fail(str(error))

    return guarded


def run(main: Callable[[list[str]], None], *, flags_parser=parse_flags) -> None:
    """`absl.app.run(main)` with one-line errors for bad inputs (exit status 2)."""
    app.run(guard(main), flags_parser=flags_parser)
