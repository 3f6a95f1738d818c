"""What every dpnmt app shares: config-field checks on the flags, one-line errors, quiet logs.

`run(main)` replaces `absl.app.run(main)`: a `--config.<field>` naming no field
fails in one line with the closest field; an `InputError` (a bad input the
user fixes), a full disk or an unwritable path prints as one line on stderr
with exit status 2, without a traceback; any other exception keeps its
traceback (it is a bug).
"""

import difflib
import errno
import logging
import os
import sys
from collections.abc import Callable, Sequence

from absl import app, flags
from absl import logging as absl_logging

from dpnmt.config import RunConfig, check_override_flags
from dpnmt.errors import InputError
from dpnmt.public_names import as_given

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


def _root_cause(error: BaseException) -> BaseException:
    """The innermost exception `error` was raised from (or while handling)."""
    while error.__cause__ is not None or error.__context__ is not None:
        error = error.__cause__ or error.__context__
    return error


def given(argv: Sequence[str], name: str) -> str | None:
    """The value of flag `--name` in `argv` (`--name=v` or `--name v`), or None."""
    for index, arg in enumerate(argv):
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
        if arg == f"--{name}" and index + 1 < len(argv):
            return argv[index + 1]
    return None


def config_path_problem(value: str) -> str | None:
    """`--config=PATH[:variant]` naming no file: one line with the closest file, else None."""
    path = value.split(":", 1)[0]
    if not path or os.path.isfile(path):
        return None
    folder = os.path.dirname(path) or "."
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    close = difflib.get_close_matches(os.path.basename(path), names, n=1)
    hint = f"did you mean {os.path.join(os.path.dirname(path), close[0])}?" if close else ""
    return (
        f"--config={value}: no such file {path}; {hint or 'give a config file'} (configs/ "
        "holds the shipped ones, e.g. configs/first_run.py or configs/tiny.py:eps8)."
    )


def parse_flags(argv: Sequence[str]) -> list[str]:
    """Parses flags as absl does; a bad `--config.<field>` fails in one line.

    A field the config lacks is named with the closest field (of
    `RunConfig.fields()`: `dpnmt.config.check_override_flags`); a `--config` file
    that does not exist is named with the closest file; other errors in one line too.
    """
    config = given(argv[1:], "config")
    problem = config_path_problem(config) if config is not None else None
    if problem:
        fail(problem)
    try:
        return flags.FLAGS(list(argv))
    except Exception as error:  # noqa: BLE001 - any parse failure is the user's input.
        problems = check_override_flags(argv[1:], RunConfig.fields())
        if problems:
            fail("\n".join(problems))
        root = _root_cause(error)
        if root is not error and isinstance(root, (ValueError, InputError)):
            first_line = str(error).strip().splitlines()[0].rstrip(":")
            # E.g. an unknown :variant or a value of the wrong type, no traceback.
            fail(first_line if str(root) in first_line else f"{first_line}: {root}")
        if isinstance(error, flags.Error):
            fail(f"{error}\nPass --helpfull to see help on flags.")
        # ml_collections raises plain errors for a bad --config.<field>=<value>,
        # a config file's own checks (an unknown :variant) raise ValueError.
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
    absl_logging.set_verbosity(absl_logging.INFO if primary else absl_logging.WARNING)
    handler = absl_logging.get_absl_handler()
    if not any(isinstance(f, _OwnInfoOnly) for f in handler.filters):
        handler.addFilter(_OwnInfoOnly())
    import datasets  # noqa: PLC0415 - heavy; only apps need it. After the filter: it logs INFO.

    datasets.utils.logging.set_verbosity_warning()
    datasets.disable_progress_bars()


UNTIMED_FORMAT = "%(levelname).1s %(filename)s:%(lineno)d] %(message)s"


def untimed_logging() -> None:
    """Log lines without absl's timestamp: for a private run's log (a published output).

    Progress lines every `train.log_every_steps` lots, stamped to the
    microsecond, would time a few lots (how many micro-batches they took: the
    realised lot sizes); rates are published only over >= 50 lots
    (`training.metrics.RateWindow`).
    """
    absl_logging.get_absl_handler().setFormatter(logging.Formatter(UNTIMED_FORMAT))


_FULL = (
    "free space there (or give a folder on another disk) and rerun the same command: a "
    "training run resumes from its last checkpoint, and nothing half-written was published"
)
_UNWRITABLE = "make it writable (or give another folder) and rerun the same command"
_DISK_FIXES = {
    errno.ENOSPC: _FULL,
    errno.EDQUOT: _FULL,
    errno.EFBIG: _FULL,
    errno.EROFS: _UNWRITABLE,
    errno.EACCES: _UNWRITABLE,
    errno.EPERM: _UNWRITABLE,
}
# Libraries that wrap the OS error in their own (tensorstore, under orbax) keep only its text.
_DISK_TEXTS = {"No space left on device": _FULL, "Disk quota exceeded": _FULL}


def disk_problem(error: BaseException, workdir: str | None = None) -> str | None:
    """One line for a full disk or an unwritable path anywhere in `error`'s chain, else None.

    Args:
      error: what the app raised.
      workdir: the app's --workdir as given: a relative one stays relative in
        the line (orbax writes `checkpoints/` by its absolute path).
    """
    seen, line = error, None
    while seen is not None and line is None:
        if isinstance(seen, OSError) and seen.errno in _DISK_FIXES:
            where = seen.filename if seen.filename is not None else "a file"
            line = f"{where}: {seen.strerror}; {_DISK_FIXES[seen.errno]}."
        seen = seen.__cause__ or seen.__context__
    for text, fix in _DISK_TEXTS.items():
        if line is None and text in str(error):
            first = str(error).strip().splitlines()[0][:300]
            line = f"{text} ({type(error).__name__}: {first}); {fix}."
    return line if line is None or workdir is None else as_given(line, workdir)


def _given_workdir() -> str | None:
    """The app's --workdir flag as given, when the app has one and it is set."""
    try:
        value = flags.FLAGS["workdir"].value
    except (KeyError, flags.Error):
        return None
    return value if isinstance(value, str) else None


def guard(main: Callable[[list[str]], None]) -> Callable[[list[str]], None]:
    """`main` with quiet, untimed logs; an `InputError`, a full disk or unwritable path: one line.

    Each exits with status 2 and no traceback; any other exception keeps its
    traceback. Every app's lines are untimed (`untimed_logging`): dpnmt.train,
    dpnmt.sweep, dpnmt.audit and dpnmt.memorization train private runs, and an
    app that trains none gains nothing from stamps.
    """

    def guarded(argv):
        setup_logging()  # Before JAX starts logging; the app may narrow it.
        untimed_logging()
        try:
            return main(argv)
        except InputError as error:
            workdir = _given_workdir()
            fail(str(error) if workdir is None else as_given(str(error), workdir))
        except Exception as error:
            problem = disk_problem(error, _given_workdir())
            if problem is None:
                raise
            fail(problem)

    return guarded


def run(main: Callable[[list[str]], None], *, flags_parser=parse_flags) -> None:
    """`absl.app.run(main)` with one-line errors for bad inputs (exit status 2)."""
    app.run(guard(main), flags_parser=flags_parser)
