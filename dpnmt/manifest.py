"""A folder's sha256 manifest (`SHA256SUMS`, `sha256sum -c` format): written once, checked on load.

An exported model is a folder of files that later runs start from; a file
changed, truncated or missing after the export would silently change what a
run starts from (and what its privacy record describes). The manifest names
every file of the folder with its sha256; `problems` lists each file that
differs from it, is missing, or was added.

    sha256sum -c SHA256SUMS        # the same check with coreutils, in the folder
"""

import hashlib
import os

from dpnmt.atomic_file import write_atomic

FILE = "SHA256SUMS"
_CHUNK = 1 << 20


def sha256(path: str) -> str:
    """The hex sha256 of the file at `path`."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(folder: str) -> list[str]:
    return sorted(
        name
        for name in os.listdir(folder)
        if name != FILE and not name.startswith(".") and os.path.isfile(os.path.join(folder, name))
    )


def write(folder: str) -> dict[str, str]:
    """Writes `folder/SHA256SUMS` for every file in `folder` (not hidden ones); returns it."""
    hashes = {name: sha256(os.path.join(folder, name)) for name in _files(folder)}
    write_atomic(os.path.join(folder, FILE), "".join(f"{h}  {n}\n" for n, h in hashes.items()))
    return hashes


def read(folder: str) -> dict[str, str] | None:
    """File name -> sha256 from `folder/SHA256SUMS`; None when the folder has none."""
    path = os.path.join(folder, FILE)
    if not os.path.isfile(path):
        return None
    hashes = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            digest, _, name = line.rstrip("\n").partition("  ")
            if len(digest) != 64 or not name:
                raise ValueError(f"{path} line {number}: not '<sha256>  <file>'; export again.")
            hashes[name] = digest
    return hashes


def problems(folder: str) -> list[str]:
    """A line for each file of `folder` its manifest does not vouch for ([] without one)."""
    expected = read(folder)
    if expected is None:
        return []
    present = set(_files(folder))
    found = [f"{name}: listed in {FILE} but missing" for name in sorted(set(expected) - present)]
    found += [
        f"{name}: not listed in {FILE} (added after the export)"
        for name in sorted(present - set(expected))
    ]
    found += [
        f"{name}: its sha256 differs from {FILE}'s (changed or truncated after the export)"
        for name in sorted(present & set(expected))
        if sha256(os.path.join(folder, name)) != expected[name]
    ]
    return found
