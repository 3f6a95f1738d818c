"""The user's dpnmt cache folder: never published, safe to delete."""

import os

ENV_VAR = "DPNMT_CACHE_DIR"


def folder(name: str) -> str:
    """`$DPNMT_CACHE_DIR/<name>`, else `$XDG_CACHE_HOME/dpnmt/<name>` or `~/.cache/dpnmt/<name>`."""
    root = os.environ.get(ENV_VAR)
    if root:
        return os.path.join(root, name)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "dpnmt", name)
