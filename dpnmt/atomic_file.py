"""Writing a file so that a kill or a concurrent writer leaves the old or the new, never half."""

import os
import tempfile


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
    """Writes `data` to `path` through a temporary file in the same folder and a rename.

    Args:
      path: the file to write (its folder must exist).
      data: bytes, or text written as UTF-8.
      private: the owner alone may read it (0600); else the mode `open()` gives
        (0666 less the umask: 0644 as a rule), not the temporary file's 0600.
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".tmp-")
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(data)
        os.chmod(temporary, 0o600 if private else 0o666 & ~_umask())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
