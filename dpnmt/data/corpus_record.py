"""An export's training corpora, as its `dpnmt.json` records them; this run's among them?

An export records each entry of its run's `data.corpus` by public name
(`public_names.public_corpus`: `files:/home/me/data` -> `files:data`, no local
path) and, for a NON-private run only, a digest of its train split's text
(the set of its normalised sentences, `overlap.normalised`: reordered, re-cased
or re-spaced copies match). A private run's export records names only: a
digest of private text is a function of every record outside the DP guarantee
(whoever knows all records but one could test candidates for the last).

A run that declares its starting export's data disjoint
(`model.pretrained_data_disjoint=True`) is refused when the record names its
private corpus (`same_corpus_problems`: the same registry name, a `files:`
name that resolves to the same folder here, or a private stage's `files:`
name equal to this corpus's public name: no digest tells them apart) or holds its text
(`same_text_problems`: the same digest, or a recorded `files:` corpus found
here that holds more than `overlap.OVERLAP_LIMIT` of a private side).
"""

import hashlib
import logging
import os
from typing import Any

from dpnmt.data import corpora, overlap
from dpnmt.data.checks import corpus_identity
from dpnmt.errors import InputError
from dpnmt.public_names import public_corpus

KEY = "training_corpora"  # Its key in dpnmt.json.
NAME, DIGEST = "corpus", "train_text_digest"


def text_digest(train) -> str:
    """SHA-256 of the sorted distinct normalised sentences of every side of `train`."""
    rows = train["translation"]
    sentences = overlap.sentence_set(text for row in rows for text in row.values())
    return hashlib.sha256("\n".join(sorted(sentences)).encode("utf-8")).hexdigest()


def _load_train(registry_name: str, pair: str, options: dict[str, Any]):
    return corpora.load_corpora(registry_name, pair, **options)["train"]


def _entries(data) -> list[tuple[Any, dict[str, Any]]]:
    """(entry, its loader options) of `data.corpus`: options apply to the first only."""
    entries = corpora.parse_corpus_names(data.corpus)
    options = data.corpus_options()
    return [(entry, options if i == 0 else {}) for i, entry in enumerate(entries)]


def training_corpora(run) -> list[dict[str, str]]:
    """What an export of `run` (a `RunConfig`) records: [{corpus, train_text_digest?}].

    The digest only for a non-private run whose corpora load here (else a warning).
    """
    record = []
    for entry, options in _entries(run.data):
        item = {NAME: public_corpus(entry.name)}
        if not run.dp.enabled:
            try:
                item[DIGEST] = text_digest(_load_train(entry.registry_name, run.data.pair, options))
            except (InputError, OSError, ValueError) as error:
                logging.warning("No text digest of %s recorded (%s).", item[NAME], error)
        record.append(item)
    return record


def _recorded(settings: dict[str, Any] | None) -> list[dict[str, Any]]:
    items = (settings or {}).get(KEY)
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def _same_entry(recorded_name: str, registry_name: str, *, text_unknown: bool = False) -> bool:
    """Whether a recorded public name is `registry_name` (a `files:` one: the same folder here).

    With `text_unknown` (a private stage's record: no digest of its text), a
    `files:` corpus of the same public name is taken to be the same too: its
    text cannot tell them apart, so the declaration is refused, never trusted.
    """
    recorded = recorded_name.removeprefix(corpora.mixture.DETOK_PREFIX)
    same_name = recorded == public_corpus(registry_name)
    if same_name and (text_unknown or not registry_name.startswith("files:")):
        return True
    try:
        return corpus_identity(recorded) == corpus_identity(registry_name)
    except InputError:
        return False


def same_corpus_problems(settings: dict[str, Any] | None, data, where: str) -> list[str]:
    """The recorded corpora that name this run's private corpus (by name or folder)."""
    try:
        private = [entry.registry_name for entry, _ in _entries(data)]
    except InputError:
        return []  # Named by the data checks.
    found = [
        str(i.get(NAME))
        for i in _recorded(settings)
        if isinstance(i.get(NAME), str)
        and any(_same_entry(i[NAME], p, text_unknown=DIGEST not in i) for p in private)
    ]
    return [_message(where, found, "the same corpus as", data.corpus)] if found else []


def same_text_problems(settings: dict[str, Any] | None, data, private_corpus, where: str):
    """The recorded corpora holding this run's private text (same digest, or overlap here).

    Args:
      settings: the export's dpnmt.json.
      data: this run's `DataConfig`.
      private_corpus: this run's corpus as trained on (`training.pieces.load_corpus`).
      where: the field named in the message.
    """
    recorded = _recorded(settings)
    if not recorded:
        return []
    digests = {i[DIGEST]: i.get(NAME) for i in recorded if isinstance(i.get(DIGEST), str)}
    found = []
    if digests:
        for entry, options in _entries(data):
            digest = text_digest(_load_train(entry.registry_name, data.pair, options))
            if digest in digests:
                found.append(str(digests[digest]))
    splits = (
        ["train", "validation"]
        if corpora.common.validation_is_carved_from_train(private_corpus)
        else ["train"]
    )
    sides = overlap.private_sides(private_corpus, splits)
    for item in recorded:
        name = item.get(NAME)
        if not isinstance(name, str) or name in found or not _local_files(name):
            continue
        try:
            public = _load_train(name.removeprefix(corpora.mixture.DETOK_PREFIX), data.pair, {})
        except (InputError, OSError, ValueError):
            continue  # Not this pair, or unreadable: nothing to compare.
        text = overlap.sentence_set(t for row in public["translation"] for t in row.values())
        if overlap.large_overlaps(text, sides):
            found.append(name)
    return [_message(where, found, "the text of", data.corpus)] if found else []


def _local_files(name: str) -> bool:
    """Whether a recorded `files:` name resolves to a folder here."""
    registry_name = name.removeprefix(corpora.mixture.DETOK_PREFIX)
    try:
        corpus, argument = corpora.lookup(registry_name)
    except InputError:
        return False
    return corpus.name == "files" and os.path.isdir(corpora.files.resolve_folder(argument))


def _message(where: str, found: list[str], how: str, private: str) -> str:
    return (
        f"{where}, but its dpnmt.json records that it was trained on {found}: {how} this "
        f"run's private corpus (data.corpus={private!r}), so its training data are not disjoint "
        "from this run's, and declaring them so would take the larger ε instead of the "
        "sum (a non-private export's data would be left out of the report). "
        "Unset model.pretrained_data_disjoint (a private export's ε is then "
        "composed), or start from a model not trained on this corpus."
    )
