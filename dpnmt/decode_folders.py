"""The folders `dpnmt.decode` writes in a run's folder: `decode_<split>` or `decode_<split>_<tag>`.

One owner for the names that the decode app, its library, the publisher's
carved-validation check and the report (`--decodings`) all read. No heavy
imports: the apps check a tag before JAX loads.
"""

import re

TAG_PATTERN = r"[A-Za-z0-9_-]+"  # A tag is a plain part of a folder name.
# The privacy record of a zero-shot decode (`--zero_shot`): no training data was used.
ZERO_SHOT_NOTE = "zero-shot: no training data used"


def is_tag(text: str) -> bool:
    """Whether `text` may name a decoding (`TAG_PATTERN`: no separator, no dot)."""
    return re.fullmatch(TAG_PATTERN, text) is not None


def folder(split: str, tag: str | None = None) -> str:
    """`decode_<split>`, or `decode_<split>_<tag>` for another decoding setting."""
    return f"decode_{split}" + (f"_{tag}" if tag else "")
