"""What every corpus loader shares: the split layout, local folders, carving validation."""

import json
import os
import re
from collections.abc import Sequence

import datasets
from absl import logging

from dpnmt.data import text_files
from dpnmt.data.groups import GROUP_COLUMN
from dpnmt.data.languages import LanguagePair
from dpnmt.errors import ConfigError, MissingInputError, UnreachableError

DATA_DIR_ENV = "DPNMT_DATA_DIR"
SPLITS = ("train", "validation", "test")
# File stems accepted for each split in local folders, in order of preference.
SPLIT_FILE_STEMS = {
    "train": ("train",),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test",),
}

# (source, target) rows, or (source, target, group) where the corpus names each
# pair's privacy unit (a case report, a dialogue, a user): `dpnmt.data.groups`.
Pairs = list[tuple[str, str]] | list[tuple[str, str, str]]


def corpus_pair(corpus: datasets.DatasetDict | datasets.Dataset) -> LanguagePair:
    """Returns the direction a loaded corpus was built for (its translation key order)."""
    dataset = next(iter(corpus.values())) if isinstance(corpus, datasets.DatasetDict) else corpus
    keys = list(dataset.features["translation"].keys())
    return LanguagePair(keys[0], keys[1])


def translation_features(pair: LanguagePair, grouped: bool = False) -> datasets.Features:
    """Features of a corpus split: translation = {source: string, target: string}[, group]."""
    string = datasets.Value("string")
    features = {"translation": {pair.source: string, pair.target: string}}
    if grouped:
        features[GROUP_COLUMN] = string
    return datasets.Features(features)


def make_corpus(pair: LanguagePair, splits: dict[str, Pairs], origins: dict[str, str]):
    """Builds the standard DatasetDict from (source, target) lists.

    Args:
      pair: the direction; its source code becomes the first translation key.
      splits: split name -> list of (source text, target text) or of (source,
        target, group); needs all of SPLITS. A split whose rows all name a group
        gets a `group` column (the pair's privacy unit).
      origins: split name -> where it came from (file paths), for errors and
        `info.description`.

    Returns:
      DatasetDict with train/validation/test.

    Raises:
      ValueError: a split is empty.
    """
    result = {}
    for split in SPLITS:
        rows = splits[split]
        if not rows:
            raise ConfigError(
                f"The {split} split is empty (from {origins[split]}); add sentence pairs to it "
                "or point the loader at a folder whose split files are not empty."
            )
        grouped = len(rows[0]) == 3
        if any((len(row) == 3) != grouped for row in rows):
            raise ConfigError(
                f"The {split} split (from {origins[split]}) names a group for some pairs and "
                "not for others; give every pair a group, or none."
            )
        features = translation_features(pair, grouped)
        info = datasets.DatasetInfo(description=f"{split}: {origins[split]}", features=features)
        columns = {"translation": [{pair.source: row[0], pair.target: row[1]} for row in rows]}
        if grouped:
            columns[GROUP_COLUMN] = [row[2] for row in rows]
        result[split] = datasets.Dataset.from_dict(columns, features=features, info=info)
    return datasets.DatasetDict(result)


def validation_cut(num_train: int, validation_size: int | None, origin: str) -> int:
    """Where train ends when its LAST `validation_size` rows become validation.

    Args:
      num_train: rows of the train split before carving.
      validation_size: rows carved off its end.
      origin: where train came from, for the error.

    Returns:
      num_train - validation_size.

    Raises:
      ConfigError: no size given, a size below 1, or not at least one train row left.
    """
    if validation_size is None or validation_size < 1 or num_train <= validation_size:
        raise ConfigError(
            f"Cannot carve {validation_size} validation pairs from {num_train} training "
            f"pairs of {origin}; set data.validation_size (validation_size=) between 1 and "
            f"{num_train - 1}."
        )
    return num_train - validation_size


def carve_validation(train: Pairs, validation_size: int, origin: str) -> tuple[Pairs, Pairs]:
    """Splits off the LAST `validation_size` training pairs as validation (deterministic).

    Raises:
      ConfigError: fewer than validation_size + 1 training pairs, or a size below 1.
    """
    cut = validation_cut(len(train), validation_size, origin)
    return train[:cut], train[cut:]


def carve_validation_split(
    splits: dict[str, Pairs], origins: dict[str, str], validation_size: int, unit: str = "pairs"
) -> None:
    """Carves validation off the end of `splits["train"]`, in place, recording both origins.

    Args:
      splits: split name -> pairs; "train" is cut, "validation" added.
      origins: split name -> where it came from; both entries rewritten.
      validation_size: rows carved.
      unit: what a row is in the origin text ("pairs", "lines").
    """
    source = origins["train"]
    splits["train"], splits["validation"] = carve_validation(
        splits["train"], validation_size, source
    )
    origins["validation"] = f"last {validation_size} {unit} of {source}"
    origins["train"] = f"{source} less its last {validation_size} {unit}"


def offline_hint(folder_names: Sequence[str]) -> str:
    """What to do when no local copy was found: name $DPNMT_DATA_DIR and what it holds."""
    root = os.environ.get(DATA_DIR_ENV)
    wanted = " or ".join(folder_names)
    if not root:
        where = f"${DATA_DIR_ENV} is unset"
    else:
        held = sorted(os.listdir(root)) if os.path.isdir(root) else []
        where = f"${DATA_DIR_ENV}={root} holds {held or 'nothing'}"
    return (
        f"No local copy was found ({where}). Offline: set ${DATA_DIR_ENV} to a folder holding "
        f"{wanted}, or set data.dir to the corpus folder."
    )


def resolve_corpus_dir(data_dir: str | None, folder_names: Sequence[str]) -> str | None:
    """Finds the local folder of a corpus, or None to download it.

    Args:
      data_dir: explicit folder: the corpus folder itself, or a folder holding one
        of `folder_names`. Must exist.
      folder_names: names of the corpus's sub-folder under a data root
        (e.g. "bsd_ja_en").

    Returns:
      The folder to read, or None when neither `data_dir` nor $DPNMT_DATA_DIR has it.

    Raises:
      MissingInputError: `data_dir` or $DPNMT_DATA_DIR is set but is not a folder.
    """
    if data_dir is not None:
        if not os.path.isdir(data_dir):
            raise MissingInputError(
                f"data.dir={data_dir} is not a folder; pass the corpus folder (or the data "
                "root holding it), or leave data.dir unset to download."
            )
        for name in folder_names:
            if os.path.isdir(os.path.join(data_dir, name)):
                return os.path.join(data_dir, name)
        return data_dir
    root = os.environ.get(DATA_DIR_ENV)
    if root:
        if not os.path.isdir(root):
            raise MissingInputError(
                f"${DATA_DIR_ENV}={root} is not a folder; point it at the data root "
                f"(e.g. ../shared/data) or unset it to download."
            )
        for name in folder_names:
            if os.path.isdir(os.path.join(root, name)):
                return os.path.join(root, name)
        logging.info("%s=%s has none of %s; downloading instead.", DATA_DIR_ENV, root, folder_names)
    return None


def languages_in_folder(folder: str) -> list[str]:
    """Language suffixes of line-aligned text files (train.de -> de) in a folder."""
    languages = set()
    for name in os.listdir(folder):
        stem, _, suffix = name.partition(".")
        if stem in sum(SPLIT_FILE_STEMS.values(), ()) + ("newstest",) and suffix:
            if suffix not in ("tsv", "jsonl", "json", "txt", "md"):
                languages.add(suffix)
    return sorted(languages)


def read_local_split(
    folder: str, split: str, pair: LanguagePair, extra_stems: Sequence[str] = ()
) -> tuple[Pairs, str] | None:
    """Reads one split from <stem>.tsv, <stem>.jsonl, or <stem>.<src> + <stem>.<tgt>.

    Returns:
      (pairs, origin description), or None if the folder has no file for the split.

    Raises:
      ConfigError: several formats for one split, or the pair is missing.
    """
    stems = SPLIT_FILE_STEMS[split] + tuple(extra_stems)
    candidates = []
    for stem in stems:
        for kind, paths in (
            ("tsv", [os.path.join(folder, f"{stem}.tsv")]),
            ("jsonl", [os.path.join(folder, f"{stem}.jsonl")]),
            (
                "text",
                [os.path.join(folder, f"{stem}.{lang}") for lang in (pair.source, pair.target)],
            ),
        ):
            if all(os.path.isfile(p) for p in paths):
                candidates.append((kind, paths))
        if candidates:
            break
    if not candidates:
        return None
    if len(candidates) > 1:
        names = [", ".join(paths) for _, paths in candidates]
        raise ConfigError(
            f"Several files hold the {split} split in {folder}: {names}; keep one format."
        )
    kind, paths = candidates[0]
    try:
        if kind == "tsv":
            rows = text_files.read_tsv(paths[0], pair.source, pair.target)
        elif kind == "jsonl":
            rows = text_files.read_jsonl(paths[0], pair.source, pair.target)
        else:
            rows = text_files.read_parallel_text(paths[0], paths[1])
    except text_files.MissingLanguageError as e:
        available = e.available
        raise ConfigError(
            f"{e} Files in {folder} have the pair {'-'.join(available[:2])} (either "
            f"direction), not {pair}; pick that pair (data.pair)."
        ) from e
    except FileNotFoundError as e:
        raise MissingInputError(str(e)) from e
    except ValueError as e:  # text_files names the file, the line and the fix.
        raise ConfigError(str(e)) from e
    return rows, " + ".join(paths)


def read_json(path: str):
    """Loads a JSON file, naming the file and line on a syntax error."""
    if not os.path.isfile(path):
        raise MissingInputError(f"{path} does not exist; download the corpus file to it.")
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ConfigError(
                f"{path}:{e.lineno}: not valid JSON ({e.msg}); restore the file from the "
                "corpus's original copy."
            ) from e


def download(url_template: str, splits: Sequence[str], folder_names: Sequence[str]):
    """Downloads (and caches) one file per split with the datasets download manager.

    Returns:
      split -> local path of the downloaded file.

    Raises:
      UnreachableError: the download failed (offline?), naming the offline fix.
    """
    manager = datasets.DownloadManager()
    urls = {split: url_template.format(split=split) for split in splits}
    try:
        return manager.download(urls)
    except Exception as e:  # noqa: BLE001 - surfaced with the fix.
        raise UnreachableError(
            f"Could not download {list(urls.values())} ({type(e).__name__}: {e}). "
            + offline_hint(folder_names)
        ) from e


# How `dpnmt.data.corpora` records a validation split carved off the end of train
# (its `info.description`): "last N pairs of <file>" or a hub "<split>[cut:]".
_CARVED_VALIDATION = re.compile(r"^validation: (last \d+ \w+ of |hub .* split \S+\[\d+:\]$)")


def validation_is_carved_from_train(corpus) -> bool:
    """Whether the corpus's validation pairs were carved from its (private) train split.

    Read from the origins the corpus loader records in each split's
    `info.description`. Such pairs are private data: their loss and BLEU are
    published unnoised, outside the guarantee.
    """
    if "validation" not in corpus:
        return False
    description = corpus["validation"].info.description or ""
    return bool(_CARVED_VALIDATION.match(description))
