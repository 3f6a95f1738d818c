"""Names, not paths, in what a run publishes (results, vocabulary record, model card).

A local path tells whose machine ran the job and how its folders are laid
out; a published file carries only the path's last component
(`files:/home/me/mydata` -> `files:mydata`). Hub ids and other names are kept.
"""

import os


def public_name(path_or_id: str) -> str:
    """The last component of a local path (absolute, `~`, `.`, or existing); else unchanged.

    Args:
      path_or_id: a folder or file path, or a name such as a hub id
        (`google/mt5-small`), which is returned as it is.
    """
    text = str(path_or_id)
    local = os.path.isabs(os.path.expanduser(text)) or text.startswith(".")
    if local or os.path.exists(text):
        return os.path.basename(os.path.normpath(os.path.expanduser(text))) or text
    return text


def public_corpus(spec: str) -> str:
    """A corpus spec with its path argument named (`files:<folder>` -> `files:<name>`)."""
    kind, sep, argument = str(spec).partition(":")
    return f"{kind}{sep}{public_name(argument)}" if sep and argument else str(spec)
