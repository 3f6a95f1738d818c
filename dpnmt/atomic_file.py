"""Files and folders written so that a kill, a full disk or a second writer leaves old or new.

Each write goes to a temporary name beside its target, is flushed to the disk
(`fsync`), then renamed into place; the folder is then synced too, so the
rename itself survives a power cut. A reader (another process, a resumed run)
sees the whole file or none of it.
"""

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

TEMPORARY_PREFIX = ".tmp-"  # Temporary names start so: hidden, never published.


def _sync_folder(folder: str) -> None:
    """Flushes a folder's entries (a rename in it) to the disk; a no-op where unsupported."""
    try:
        handle = os.open(folder or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:  # Some file systems cannot sync a folder; the rename still happened.
        pass
    finally:
        os.close(handle)


def _write_temporary(folder: str, data: bytes) -> str:
    """A new temporary file in `folder` holding `data`, synced to the disk; its path."""
    handle, temporary = tempfile.mkstemp(dir=folder or ".", prefix=TEMPORARY_PREFIX)
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        os.remove(temporary)
        raise
    return temporary


def _bytes(data: bytes | str) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else data


def _umask() -> int:
    """The process's umask, read without changing it where Linux allows (threads write too)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


def write_atomic(path: str, data: bytes | str, *, private: bool = False) -> None:
    """Writes `data` to `path` through a synced temporary file in the same folder and a rename.

    Args:
      path: the file to write (its folder must exist).
      data: bytes, or text written as UTF-8.
      private: the owner alone may read it (0600); else the mode `open()` gives
        (0666 less the umask: 0644 as a rule), not the temporary file's 0600.
    """
    folder = os.path.dirname(path)
    temporary = _write_temporary(folder, _bytes(data))
    try:
        os.chmod(temporary, 0o600 if private else 0o666 & ~_umask())
        os.replace(temporary, path)
    except BaseException:
        os.remove(temporary)
        raise
    _sync_folder(folder)


def create_exclusive(path: str, data: bytes | str) -> bool:
    """Creates `path` holding `data` whole, unless it exists; never overwrites it.

    The content is written and synced under a temporary name, then hard-linked
    to `path` (which fails if `path` exists, like `O_CREAT | O_EXCL`): of two
    processes creating it at once exactly one wins, and no reader ever sees it
    empty or cut short.

    Args:
      path: the file to create (its folder must exist).
      data: bytes, or text written as UTF-8.

    Returns:
      True if this call created it; False if it already existed (left as it was).
    """
    folder = os.path.dirname(path)
    temporary = _write_temporary(folder, _bytes(data))
    try:
        os.link(temporary, path)
    except FileExistsError:
        return False
    finally:
        os.remove(temporary)
    _sync_folder(folder)
    return True


@contextlib.contextmanager
def folder_built_beside(path: str) -> Iterator[str]:
    """Yields a new temporary folder beside `path`; once the block ends, renames it to `path`.

    Every file in it is synced before the rename, so `path` appears whole or
    not at all: a kill while the block runs leaves only a hidden temporary
    folder (`.tmp-<name>-...`), which is removed when the block raises.

    Args:
      path: the folder to publish; it must not exist or be empty.

    Raises:
      OSError: `path` became non-empty meanwhile (nothing is replaced).
    """
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    name = os.path.basename(os.path.normpath(path))
    temporary = tempfile.mkdtemp(dir=parent, prefix=f"{TEMPORARY_PREFIX}{name}-")
    try:
        yield temporary
        for folder, _, files in os.walk(temporary):
            for file in files:
                with open(os.path.join(folder, file), "rb") as f:
                    os.fsync(f.fileno())
            _sync_folder(folder)
        os.chmod(temporary, 0o777 & ~_umask())  # mkdtemp's 0700 -> an ordinary folder's mode.
        os.rename(temporary, path)  # Replaces an empty folder; refuses a non-empty one.
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    _sync_folder(parent)


def make_private_folder(path: str) -> str:
    """Creates folder `path` (and its parents) readable by its owner alone (0700); returns it.

    For a run's `private/` (the secret seed, sampler states, logs that may
    quote private text): a 0700 folder keeps every file in it from other local
    users whatever the file's own mode. `os.makedirs` ignores `mode` for a
    folder that exists, so an existing one is changed too.
    """
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    return path
