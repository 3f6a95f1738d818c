"""Names, not paths, in what a run publishes (results, vocabulary record, model card).

A local path tells whose machine ran the job and how its folders are laid
out; a published file carries only the path's last component
(`files:/home/me/mydata` -> `files:mydata`). Hub ids and other names are kept.
"""

import os

from dpnmt.errors import ConfigError


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


def _public_entry(registry_name: str) -> str:
    kind, sep, argument = registry_name.partition(":")
    return f"{kind}{sep}{public_name(argument)}" if sep and argument else registry_name


def public_corpus(spec: str) -> str:
    """A corpus list with each entry's path argument named.

    `"files:/a,detok:files:/home/me/b"` -> `"files:a,detok:files:b"`: each entry
    of `data.corpus` (`corpora.mixture.parse_corpus_names`) becomes
    `[detok:]kind:public_name(argument)`. A list the registry does not parse (a
    card of a run from another version) is named entry by entry the same way.
    """
    from dpnmt.data.corpora import mixture  # noqa: PLC0415 - datasets only when named.

    try:
        entries = [
            (entry.detokenize, entry.registry_name)
            for entry in mixture.parse_corpus_names(str(spec))
        ]
    except ConfigError:
        parts = [part.strip() for part in str(spec).split(",")]
        entries = [
            (part.startswith(mixture.DETOK_PREFIX), part.removeprefix(mixture.DETOK_PREFIX))
            for part in parts
        ]
    prefix = {True: mixture.DETOK_PREFIX, False: ""}
    return ",".join(prefix[detok] + _public_entry(name) for detok, name in entries)


def as_given(text: str, path: str) -> str:
    """`text` with `path`'s absolute (and resolved) form written as `path` was given.

    A library (orbax, the OS error of a write under it) names a relative
    workdir by its absolute path; a private run's log names it as the user did.
    An absolute `path` leaves `text` unchanged.
    """
    if os.path.isabs(path):
        return text
    given = os.path.normpath(path)
    for full in sorted({os.path.realpath(path), os.path.abspath(path)}, key=len, reverse=True):
        text = text.replace(full, given)
    return text
