"""`files:<folder>`: a user's own parallel text, one file (or a file per language) a split.

Each split is ONE of, by file stem (train; validation|valid|dev|val; test):
  * `<stem>.tsv`: tab-separated, its FIRST line a header naming the two language
    codes (e.g. `de<TAB>en`, either order); one pair a line after it.
  * `<stem>.jsonl`: one JSON object a line with both codes as keys
    (`{"de": "...", "en": "..."}`; other keys ignored).
  * `<stem>.<src>` + `<stem>.<tgt>`: line-aligned plain text, one sentence a line.
Several formats for one split are an error. Without a validation file,
`validation_size` pairs are carved off the end of train.

Monolingual text (pre-training objectives, `data.objective`): with
`monolingual_language=L`, a split that has no parallel file may be one file
`<stem>.L`, one text a line; each row then holds that text on both sides (the
objective reads language L's side only).
"""

import dataclasses
import json
import os

import datasets

from dpnmt.data.corpora.common import (
    DATA_DIR_ENV,
    SPLIT_FILE_STEMS,
    SPLITS,
    carve_validation_split,
    languages_in_folder,
    make_corpus,
    read_local_split,
)
from dpnmt.data.languages import LanguagePair, parse_pair
from dpnmt.data.text_files import is_language_code, read_parallel_text
from dpnmt.errors import ConfigError, MissingInputError


@dataclasses.dataclass(frozen=True)
class FilesOptions:
    """Options of `files:<folder>` (the folder is in the corpus name, not data.dir).

    Attributes:
      validation_size: when the folder has no validation file, carve this many
        pairs off the end of train; None makes a missing validation file an error.
      monolingual_language: a language of the pair whose `<stem>.<language>`
        file alone may hold a split (module docstring); set by objective runs.
    """

    validation_size: int | None = None
    monolingual_language: str | None = None


def resolve_folder(path: str) -> str:
    """The folder `files:<path>` names: `path` itself, else `$DPNMT_DATA_DIR/<path>`.

    A relative name that is no folder here is looked up under the data root, so
    a config can say `files:multi30k` and stay independent of where the offline
    corpora live. Returns `path` unchanged when neither exists.
    """
    root = os.environ.get(DATA_DIR_ENV)
    if os.path.isdir(path) or os.path.isabs(path) or not root:
        return path
    under_root = os.path.join(root, path)
    return under_root if os.path.isdir(under_root) else path


def _monolingual_split(path: str, split: str, language: str | None):
    """(rows with the text on both sides, origin) from `<stem>.<language>`, else None."""
    if language is None:
        return None
    for stem in SPLIT_FILE_STEMS[split]:
        file = os.path.join(path, f"{stem}.{language}")
        if os.path.isfile(file):
            try:
                return read_parallel_text(file, file), file + " (monolingual)"
            except ValueError as e:  # Names the file, the line and the fix.
                raise ConfigError(str(e)) from e
    return None


def load_files(
    path: str,
    pair: str | LanguagePair,
    *,
    validation_size: int | None = None,
    monolingual_language: str | None = None,
) -> datasets.DatasetDict:
    """Loads a user's local folder of parallel files (formats: the module docstring).

    Args:
      path: the folder (a relative one not found here is read under
        `$DPNMT_DATA_DIR`, see `resolve_folder`).
      pair: direction, e.g. "de-en".
      validation_size: see `FilesOptions`.
      monolingual_language: see `FilesOptions`.

    Returns:
      DatasetDict with train/validation/test.

    Raises:
      MissingInputError: the folder or a split's file is missing.
      ConfigError: malformed lines (file and line named), wrong pair, empty split.
    """
    pair = parse_pair(pair)
    path = resolve_folder(path)
    if not os.path.isdir(path):
        raise MissingInputError(
            f"files: folder {path} does not exist (here or under ${DATA_DIR_ENV}); give a "
            "folder holding train/validation/test files (.tsv, .jsonl, or one file per "
            "language like train.de + train.en)."
        )
    languages = languages_in_folder(path)
    splits, origins = {}, {}
    for split in SPLITS:
        found = read_local_split(path, split, pair)
        if found is None:
            found = _monolingual_split(path, split, monolingual_language)
        if found is None:
            if split == "validation" and validation_size is not None:
                continue
            wrong_pair = (
                f" Text files there are in languages {languages}; is the pair right?"
                if languages and not pair.languages <= set(languages)
                else ""
            )
            carve_hint = " Or set data.validation_size=N to carve it from train."
            raise MissingInputError(
                f"No {split} file in {path}: expected one of "
                f"{[f'{s}.tsv' for s in SPLIT_FILE_STEMS[split]]}, .jsonl, or "
                f"{SPLIT_FILE_STEMS[split][0]}.{pair.source} + {SPLIT_FILE_STEMS[split][0]}."
                f"{pair.target}.{wrong_pair}" + (carve_hint if split == "validation" else "")
            )
        splits[split], origins[split] = found
    if "validation" not in splits:
        carve_validation_split(splits, origins, validation_size)
    return make_corpus(pair, splits, origins)


def folder_languages(folder: str) -> list[str]:
    """The languages a folder's train split holds, read cheaply (names, a header, a line).

    `train.tsv`'s header, `train.jsonl`'s first object's keys, or the suffixes of
    its line-aligned text files (`train.de` -> de); [] when none says.
    """
    tsv, jsonl = os.path.join(folder, "train.tsv"), os.path.join(folder, "train.jsonl")
    try:
        if os.path.isfile(tsv):
            with open(tsv, encoding="utf-8") as f:
                names = [c.strip() for c in f.readline().split("\t") if c.strip() != "group"]
        elif os.path.isfile(jsonl):
            with open(jsonl, encoding="utf-8") as f:
                first = json.loads(f.readline() or "{}")
            names = sorted(first) if isinstance(first, dict) else []
        else:
            names = None
    except (OSError, UnicodeDecodeError, ValueError):
        return []  # Named, with its line, when the corpus is read.
    if names is not None:
        # Only language codes: a first line that is no header is a private pair, never quoted.
        return names if all(is_language_code(name) for name in names) else []
    return [
        lang for lang in languages_in_folder(folder) if os.path.isfile(f"{folder}/train.{lang}")
    ]


def pair_problem(folder: str, pair: LanguagePair) -> str | None:
    """What the folder's train split lacks of `pair`, in words; None when it has both sides.

    Args:
        folder: A `files:` folder (read under $DPNMT_DATA_DIR as `resolve_folder`); None
            when it does not exist (a problem of its own).
        pair: The run's direction.
    """
    folder = resolve_folder(folder)
    if not os.path.isdir(folder):
        return None
    held = folder_languages(folder)
    missing = [lang for lang in (pair.source, pair.target) if lang not in held]
    if not held or not missing:
        return None
    could = f"{held[0]}-{held[1]} or {held[1]}-{held[0]}" if len(held) == 2 else "two of them"
    holds = ", ".join(held[:-1]) + f" and {held[-1]}" if len(held) > 1 else held[0]
    return (
        f"{folder} holds {holds} text, no {' or '.join(missing)}; set data.pair "
        f"to {could}, or add {missing[0]} files to the folder (train.{missing[0]} beside "
        f"train.{held[0]}, or a column in train.tsv)."
    )
