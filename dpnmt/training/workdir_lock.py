"""One writer per workdir: an exclusive lock a training process holds while it runs.

Two `dpnmt.train` on one workdir would both learn the DP vocabulary and both
train on the same private data, the second one's noise unaccounted. The
process that writes a workdir takes `fcntl.flock` on `private/.dpnmt.lock`
(never published: its time is the run's start) after the config's checks
and before it writes anything; a second process is refused in one line
naming the holder (its process id and command, no host and no path). The
lock is the open file's: it goes when the process ends, however it ends (a
kill included), and a stale file locks nothing.
"""

import contextlib
import fcntl
import logging
import os
import sys
from collections.abc import Iterator

from dpnmt import atomic_file
from dpnmt.errors import ConfigError
from dpnmt.training.run_dir import PRIVATE_DIR

LOCK_FILE = os.path.join(PRIVATE_DIR, ".dpnmt.lock")  # Under the workdir.

_held: dict[str, object] = {}  # Real path of a workdir -> its locked file, in this process.


def _holder(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or "its process is starting"
    except OSError:
        return "unknown"


def acquire(workdir: str, command: str) -> None:
    """Locks `workdir` for this process (creating the folder); nothing if it already holds it.

    Args:
      workdir: the run's folder.
      command: what holds it, for the refusal another process prints (e.g. "python -m
        dpnmt.train").

    Raises:
      ConfigError: another process holds the lock (one line naming it and the fix).
    """
    key = os.path.realpath(workdir)
    if key in _held:
        return
    try:
        atomic_file.make_private_folder(os.path.join(workdir, PRIVATE_DIR))
    except OSError as error:
        raise ConfigError(f"--workdir={workdir} cannot be created: {error}") from error
    path = os.path.join(workdir, LOCK_FILE)
    handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held until `release`.
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise ConfigError(
            f"--workdir={workdir} is in use by another process ({_holder(path)}): one process "
            "writes a workdir at a time; wait for it to end (or stop it), or use another --workdir."
        ) from None
    except OSError as error:  # E.g. a file system without locks: say so, carry on.
        logging.warning("Cannot lock %s (%s): make sure no other process trains it.", path, error)
    handle.seek(0)
    handle.truncate()
    handle.write(f"process {os.getpid()}: {command}\n")
    handle.flush()
    _held[key] = handle


def release(workdir: str) -> None:
    """Unlocks `workdir` if this process holds it (closing the file drops the lock)."""
    handle = _held.pop(os.path.realpath(workdir), None)
    if handle is not None:
        handle.close()


@contextlib.contextmanager
def released_at_exit(workdir: str) -> Iterator[None]:
    """A block after which this process no longer holds `workdir` (taken inside, or not)."""
    try:
        yield
    finally:
        release(workdir)


def this_command() -> str:
    """The running command for the holder line: `python -m dpnmt.train`, or the script's name.

    Never a path: `sys.argv[0]` may be absolute, and the lock file is kept in the workdir.
    """
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return f"python -m {spec.name}"
    return os.path.basename(sys.argv[0])
