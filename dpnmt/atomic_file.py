"""Writing a file so that a kill or a concurrent writer leaves the old or the new, never half."""

import os
import tempfile


def write_atomic(path: str, data: bytes | str) -> None:
    """Writes `data` to `path` through a temporary file in the same folder and a rename.

    Args:
      path: the file to write (its folder must exist).
      data: bytes, or text written as UTF-8.
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".tmp-")
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
