"""Corpus registry: load a named parallel corpus as train/validation/test in one direction.

Every loader returns a `datasets.DatasetDict` with splits "train", "validation"
and "test", each with one column `translation` holding {source: str, target: str}
(source key first; `corpus_pair` reads the direction back). Each split's
`info.description` says which file(s) or hub split it came from.

Where the data comes from:
  * `data_dir` given: that folder (or its corpus sub-folder, e.g.
    `<data_dir>/bsd_ja_en`); it must exist.
  * else env `DPNMT_DATA_DIR`, when it has the corpus's sub-folder;
  * else the real download (Hugging Face hub or the corpus's URL).

Offline split mappings (the shared folder lacks some splits) are explicit:
  * wmt16, local folder without validation files: validation is the LAST
    `validation_size` (default 500) lines of train.*, train the lines before;
    test is test.* or, failing that, newstest.*. For `wmt_sample_de_en`: train
    9,500, validation 500, test 50 (newstest).
  * bsd without train.json (the shared copy): an error unless
    `train_split="dev"`; then train is dev.json less its LAST `validation_size`
    (default 200) pairs, validation those pairs, test is test.json.
"""

import json
import os
from collections.abc import Callable, Sequence

import datasets
from absl import logging

from dpnmt.data import text_files
from dpnmt.data.languages import LanguagePair, check_pair_available, parse_pair

DATA_DIR_ENV = "DPNMT_DATA_DIR"
SPLITS = ("train", "validation", "test")
# File stems accepted for each split in local folders, in order of preference.
SPLIT_FILE_STEMS = {
    "train": ("train",),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test",),
}

WMT16_PAIRS = ("cs-en", "de-en", "fi-en", "ro-en", "ru-en", "tr-en")
WMT16_HUB_NAME = "wmt/wmt16"
BSD_URL = "https://raw.githubusercontent.com/tsuruoka-lab/BSD/master/{split}.json"
CLINSPEN_URL = (
    "https://raw.githubusercontent.com/trusthlt/dp-nmt/main/data/clinspen_clinicalcases/"
    "{split}.json"
)

Pairs = list[tuple[str, str]]


def corpus_pair(corpus: datasets.DatasetDict | datasets.Dataset) -> LanguagePair:
    """Returns the direction a loaded corpus was built for (its translation key order)."""
    dataset = next(iter(corpus.values())) if isinstance(corpus, datasets.DatasetDict) else corpus
    keys = list(dataset.features["translation"].keys())
    return LanguagePair(keys[0], keys[1])


def translation_features(pair: LanguagePair) -> datasets.Features:
    """Features of a corpus split: translation = {source: string, target: string}."""
    string = datasets.Value("string")
    return datasets.Features({"translation": {pair.source: string, pair.target: string}})


def make_corpus(pair: LanguagePair, splits: dict[str, Pairs], origins: dict[str, str]):
    """Builds the standard DatasetDict from (source, target) lists.

    Args:
      pair: the direction; its source code becomes the first translation key.
      splits: split name -> list of (source text, target text); needs all of SPLITS.
      origins: split name -> where it came from (file paths), for errors and
        `info.description`.

    Returns:
      DatasetDict with train/validation/test.

    Raises:
      ValueError: a split is empty.
    """
    features = translation_features(pair)
    result = {}
    for split in SPLITS:
        rows = splits[split]
        if not rows:
            raise ValueError(
                f"The {split} split is empty (from {origins[split]}); add sentence pairs to it "
                "or point the loader at a folder whose split files are not empty."
            )
        info = datasets.DatasetInfo(description=f"{split}: {origins[split]}", features=features)
        result[split] = datasets.Dataset.from_dict(
            {"translation": [{pair.source: s, pair.target: t} for s, t in rows]},
            features=features,
            info=info,
        )
    return datasets.DatasetDict(result)


def carve_validation(train: Pairs, validation_size: int, origin: str) -> tuple[Pairs, Pairs]:
    """Splits off the LAST `validation_size` training pairs as validation (deterministic).

    Raises:
      ValueError: fewer than validation_size + 1 training pairs, or a size below 1.
    """
    if validation_size < 1 or len(train) <= validation_size:
        raise ValueError(
            f"Cannot carve {validation_size} validation pairs from {len(train)} training "
            f"pairs of {origin}; pass a validation_size between 1 and {len(train) - 1}."
        )
    return train[:-validation_size], train[-validation_size:]


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
      FileNotFoundError: `data_dir` or $DPNMT_DATA_DIR is set but is not a folder.
    """
    if data_dir is not None:
        if not os.path.isdir(data_dir):
            raise FileNotFoundError(
                f"data_dir {data_dir} is not a folder; pass the corpus folder (or the data "
                "root holding it), or leave data_dir unset to download."
            )
        for name in folder_names:
            if os.path.isdir(os.path.join(data_dir, name)):
                return os.path.join(data_dir, name)
        return data_dir
    root = os.environ.get(DATA_DIR_ENV)
    if root:
        if not os.path.isdir(root):
            raise FileNotFoundError(
                f"${DATA_DIR_ENV}={root} is not a folder; point it at the data root "
                f"(e.g. ../shared/data) or unset it to download."
            )
        for name in folder_names:
            if os.path.isdir(os.path.join(root, name)):
                return os.path.join(root, name)
        logging.info("%s=%s has none of %s; downloading instead.", DATA_DIR_ENV, root, folder_names)
    return None


def _find_split_files(folder: str, split: str, suffixes: Sequence[str]) -> list[str]:
    """Returns the existing files <stem>.<suffix> for a split, all of them (ambiguity check)."""
    found = []
    for stem in SPLIT_FILE_STEMS[split]:
        for suffix in suffixes:
            path = os.path.join(folder, f"{stem}.{suffix}")
            if os.path.isfile(path):
                found.append(path)
    return found


# ----------------------------------------------------------------------------- files:


def _languages_in_folder(folder: str) -> list[str]:
    """Language suffixes of line-aligned text files (train.de -> de) in a folder."""
    languages = set()
    for name in os.listdir(folder):
        stem, _, suffix = name.partition(".")
        if stem in sum(SPLIT_FILE_STEMS.values(), ()) + ("newstest",) and suffix:
            if suffix not in ("tsv", "jsonl", "json", "txt", "md"):
                languages.add(suffix)
    return sorted(languages)


def _read_local_split(
    folder: str, split: str, pair: LanguagePair, extra_stems: Sequence[str] = ()
) -> tuple[Pairs, str] | None:
    """Reads one split from <stem>.tsv, <stem>.jsonl, or <stem>.<src> + <stem>.<tgt>.

    Returns:
      (pairs, origin description), or None if the folder has no file for the split.

    Raises:
      ValueError: several formats for one split, or the pair is missing.
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
        raise ValueError(
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
        raise ValueError(
            f"{e} Files in {folder} have the pair {'-'.join(available[:2])} (either "
            f"direction), not {pair}; pick that pair."
        ) from e
    return rows, " + ".join(paths)


def load_files(
    path: str, pair: str | LanguagePair, *, validation_size: int | None = None
) -> datasets.DatasetDict:
    """Loads a user's local folder of parallel files.

    Each split is one of `<stem>.tsv` (header line naming the two languages),
    `<stem>.jsonl` ({"de": ..., "en": ...} per line) or `<stem>.<src>` +
    `<stem>.<tgt>` line-aligned text; stems: train; validation|valid|dev|val; test.

    Args:
      path: the folder.
      pair: direction, e.g. "de-en".
      validation_size: when the folder has no validation file, carve this many
        pairs off the end of train; None makes a missing validation file an error.

    Returns:
      DatasetDict with train/validation/test.

    Raises:
      FileNotFoundError: the folder or a split's file is missing.
      ValueError: malformed lines (file and line named), wrong pair, empty split.
    """
    pair = parse_pair(pair)
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"files: folder {path} does not exist; give a folder holding train/validation/"
            "test files (.tsv, .jsonl, or one file per language like train.de + train.en)."
        )
    languages = _languages_in_folder(path)
    splits, origins = {}, {}
    for split in SPLITS:
        found = _read_local_split(path, split, pair)
        if found is None:
            if split == "validation" and validation_size is not None:
                continue
            wrong_pair = (
                f" Text files there are in languages {languages}; is the pair right?"
                if languages and not pair.languages <= set(languages)
                else ""
            )
            carve_hint = " Or pass validation_size=N to carve it from train."
            raise FileNotFoundError(
                f"No {split} file in {path}: expected one of "
                f"{[f'{s}.tsv' for s in SPLIT_FILE_STEMS[split]]}, .jsonl, or "
                f"{SPLIT_FILE_STEMS[split][0]}.{pair.source} + {SPLIT_FILE_STEMS[split][0]}."
                f"{pair.target}.{wrong_pair}" + (carve_hint if split == "validation" else "")
            )
        splits[split], origins[split] = found
    if "validation" not in splits:
        splits["train"], splits["validation"] = carve_validation(
            splits["train"], validation_size, origins["train"]
        )
        origins["validation"] = f"last {validation_size} pairs of {origins['train']}"
        origins["train"] = f"{origins['train']} less its last {validation_size} pairs"
    return make_corpus(pair, splits, origins)


# ----------------------------------------------------------------------------- wmt16


def _reorder_hub_split(dataset: datasets.Dataset, pair: LanguagePair, column: str, name: str):
    """Keeps only `column` (a translation dict), re-keyed as {source, target} in that order."""
    if column not in dataset.column_names:
        raise ValueError(
            f"Hub dataset {name!r} has no column {column!r}; it has {dataset.column_names}. "
            "Pass translation_column= naming its translation column."
        )
    feature = dataset.features[column]
    keys = list(getattr(feature, "languages", None) or feature.keys())
    if not pair.languages <= set(keys):
        raise ValueError(
            f"Hub dataset {name!r} has languages {keys} in {column!r}, not the pair {pair}; "
            f"pick a pair of those."
        )
    features = translation_features(pair)

    def rekey(batch):
        return {
            "translation": [
                {pair.source: t[pair.source], pair.target: t[pair.target]} for t in batch[column]
            ]
        }

    return dataset.map(
        rekey,
        batched=True,
        remove_columns=dataset.column_names,
        features=features,
        desc=f"select {pair}",
    )


def _hub_corpus(
    hub_dataset: datasets.DatasetDict,
    pair: LanguagePair,
    name: str,
    column: str,
    validation_size: int | None,
) -> datasets.DatasetDict:
    """Maps a hub DatasetDict's split names to train/validation/test and re-keys it."""
    by_split = {}
    for split in SPLITS:
        for stem in SPLIT_FILE_STEMS[split]:
            if stem in hub_dataset:
                by_split[split] = (stem, hub_dataset[stem])
                break
    if "validation" not in by_split and validation_size is not None and "train" in by_split:
        stem, train = by_split["train"]
        n = len(train)
        if validation_size < 1 or n <= validation_size:
            raise ValueError(f"Cannot carve {validation_size} validation rows from {n} in {name}.")
        cut = n - validation_size
        by_split["train"] = (f"{stem}[:{cut}]", train.select(range(cut)))
        by_split["validation"] = (f"{stem}[{cut}:]", train.select(range(cut, n)))
    missing = [s for s in SPLITS if s not in by_split]
    if missing:
        raise ValueError(
            f"Hub dataset {name!r} has splits {list(hub_dataset)}, none for {missing}; "
            "pass validation_size=N to carve validation from train, or use files:<folder>."
        )
    result = {}
    for split, (source_split, dataset) in by_split.items():
        if len(dataset) == 0:
            raise ValueError(f"Split {source_split!r} of hub dataset {name!r} is empty.")
        result[split] = _reorder_hub_split(dataset, pair, column, name)
        result[split].info.description = f"{split}: hub {name} split {source_split}"
    return datasets.DatasetDict(result)


def _load_from_hub(name: str, config: str | None) -> datasets.DatasetDict:
    """Calls datasets.load_dataset, turning network failures into an actionable error."""
    try:
        return datasets.load_dataset(name, config)
    except Exception as e:  # noqa: BLE001 - any failure here means "cannot reach/resolve it".
        raise RuntimeError(
            f"Could not load hub dataset {name!r} (config {config!r}): {type(e).__name__}: "
            f"{e}. Loading from the hub needs network access (and HF_DATASETS_OFFLINE/"
            "HF_HUB_OFFLINE unset). Offline: save it once with DatasetDict.save_to_disk and "
            "pass data_dir=<that folder>, or export it to files and use files:<folder>."
        ) from e


def load_wmt16(
    pair: str | LanguagePair, *, data_dir: str | None = None, validation_size: int = 500
) -> datasets.DatasetDict:
    """Loads WMT-16 for one of its pairs (cs/de/fi/ro/ru/tr with en), either direction.

    Online: hub dataset `wmt/wmt16`, config "<x>-en", its train/validation/test.
    Local folder (`wmt16_<x>_en` or `wmt_sample_<x>_en` under the data root, or the
    folder itself): train.<x> + train.en; validation.* (or valid/dev/val) if present,
    else the last `validation_size` train lines; test.* if present, else newstest.*.

    Args:
      pair: direction, e.g. "de-en" or "en-de".
      data_dir: local folder; default $DPNMT_DATA_DIR's sub-folder, else download.
      validation_size: lines carved off the end of train when no validation file exists.

    Returns:
      DatasetDict with train/validation/test.
    """
    pair = parse_pair(pair)
    check_pair_available(pair, WMT16_PAIRS, "wmt16")
    other = pair.source if pair.target == "en" else pair.target
    folder = resolve_corpus_dir(data_dir, (f"wmt16_{other}_en", f"wmt_sample_{other}_en"))
    if folder is None:
        hub = _load_from_hub(WMT16_HUB_NAME, f"{other}-en")
        return _hub_corpus(hub, pair, WMT16_HUB_NAME, "translation", None)
    splits, origins = {}, {}
    for split, extra in (("train", ()), ("validation", ()), ("test", ("newstest",))):
        found = _read_local_split(folder, split, pair, extra_stems=extra)
        if found is None and split != "validation":
            raise FileNotFoundError(
                f"No {split} files for {pair} in {folder}: expected {split}.{pair.source} + "
                f"{split}.{pair.target}"
                + (" (or newstest.*)" if split == "test" else "")
                + "; add them or point data_dir at the WMT-16 folder."
            )
        if found is not None:
            splits[split], origins[split] = found
    if "validation" not in splits:
        train_origin = origins["train"]
        splits["train"], splits["validation"] = carve_validation(
            splits["train"], validation_size, train_origin
        )
        origins["validation"] = f"last {validation_size} lines of {train_origin}"
        origins["train"] = f"{train_origin} less its last {validation_size} lines"
    logging.info("wmt16 %s offline splits: %s", pair, origins)
    return make_corpus(pair, splits, origins)


# ----------------------------------------------------------------------------- JSON corpora


def _read_json(path: str):
    """Loads a JSON file, naming the file and line on a syntax error."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} does not exist; download the corpus file to it.")
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{path}:{e.lineno}: not valid JSON ({e.msg}); restore the file from the "
                "corpus's original copy."
            ) from e


def _download(url_template: str, splits: Sequence[str]) -> dict[str, str]:
    """Downloads (and caches) one file per split with the datasets download manager."""
    manager = datasets.DownloadManager()
    urls = {split: url_template.format(split=split) for split in splits}
    try:
        return manager.download(urls)
    except Exception as e:  # noqa: BLE001 - surfaced with the fix.
        raise RuntimeError(
            f"Could not download {list(urls.values())}: {type(e).__name__}: {e}. Offline, put "
            f"the files in a folder and pass data_dir= (or set ${DATA_DIR_ENV})."
        ) from e


def _bsd_pairs(path: str, pair: LanguagePair) -> Pairs:
    """Every conversation turn of a BSD file as a pair, both original languages merged."""
    scenarios = _read_json(path)
    rows = []
    for scenario_index, scenario in enumerate(scenarios):
        for turn_index, turn in enumerate(scenario.get("conversation", ())):
            texts = {"ja": turn.get("ja_sentence"), "en": turn.get("en_sentence")}
            if not all(isinstance(t, str) for t in texts.values()):
                raise ValueError(
                    f"{path}: scenario {scenario_index} ({scenario.get('id')}) turn "
                    f"{turn_index} lacks a ja_sentence/en_sentence string; restore the file "
                    "from tsuruoka-lab/BSD."
                )
            rows.append((texts[pair.source], texts[pair.target]))
    return rows


def load_bsd(
    pair: str | LanguagePair = "ja-en",
    *,
    data_dir: str | None = None,
    train_split: str = "train",
    validation_size: int = 200,
) -> datasets.DatasetDict:
    """Loads the Business Scene Dialogue corpus (ja-en), every turn one pair.

    Scenarios written in Japanese and in English are merged into one ja-en corpus
    (as in the DP-NMT paper). Files: train.json, dev.json, test.json (github
    tsuruoka-lab/BSD), from `bsd_ja_en` under the data root or downloaded.

    Args:
      pair: "ja-en" or "en-ja".
      data_dir: local folder; default $DPNMT_DATA_DIR's sub-folder, else download.
      train_split: "train" (train.json; validation = dev.json) or "dev": train on
        dev.json less its last `validation_size` pairs, which become validation. The
        shared offline copy has no train.json, so offline runs must say "dev".
      validation_size: pairs carved off dev.json when train_split="dev".

    Returns:
      DatasetDict with train/validation/test (test = test.json).

    Raises:
      FileNotFoundError: train.json absent and train_split="train".
    """
    pair = parse_pair(pair)
    check_pair_available(pair, ("ja-en",), "bsd")
    if train_split not in ("train", "dev"):
        raise ValueError(f"bsd train_split must be 'train' or 'dev', not {train_split!r}.")
    folder = resolve_corpus_dir(data_dir, ("bsd_ja_en",))
    files = ("dev", "test") if train_split == "dev" else ("train", "dev", "test")
    if folder is None:
        paths = _download(BSD_URL, files)
    else:
        paths = {name: os.path.join(folder, f"{name}.json") for name in files}
        if train_split == "train" and not os.path.isfile(paths["train"]):
            raise FileNotFoundError(
                f"{paths['train']} does not exist (the shared offline copy has only dev.json "
                "and test.json). Pass train_split='dev' to train on dev.json (validation is then "
                "carved from its end), or add train.json from github tsuruoka-lab/BSD."
            )
    rows = {name: _bsd_pairs(path, pair) for name, path in paths.items()}
    if train_split == "dev":
        train, validation = carve_validation(rows["dev"], validation_size, paths["dev"])
        splits = {"train": train, "validation": validation, "test": rows["test"]}
        origins = {
            "train": f"{paths['dev']} less its last {validation_size} pairs",
            "validation": f"last {validation_size} pairs of {paths['dev']}",
            "test": paths["test"],
        }
    else:
        splits = {"train": rows["train"], "validation": rows["dev"], "test": rows["test"]}
        origins = {"train": paths["train"], "validation": paths["dev"], "test": paths["test"]}
    return make_corpus(pair, splits, origins)


def load_clinspen(
    pair: str | LanguagePair = "es-en", *, data_dir: str | None = None
) -> datasets.DatasetDict:
    """Loads ClinSpEn-CC (es-en clinical case reports, WMT22 biomedical task).

    Files train.json, dev.json, test.json, each a list of {file_name, en, es}
    (the DP-NMT authors' port), from `clinspen_es_en` under the data root or
    downloaded from github trusthlt/dp-nmt.

    Args:
      pair: "es-en" or "en-es".
      data_dir: local folder; default $DPNMT_DATA_DIR's sub-folder, else download.

    Returns:
      DatasetDict with train/validation (dev.json)/test.
    """
    pair = parse_pair(pair)
    check_pair_available(pair, ("es-en",), "clinspen")
    folder = resolve_corpus_dir(data_dir, ("clinspen_es_en",))
    if folder is None:
        paths = _download(CLINSPEN_URL, ("train", "dev", "test"))
    else:
        paths = {name: os.path.join(folder, f"{name}.json") for name in ("train", "dev", "test")}
    splits = {}
    for split, name in (("train", "train"), ("validation", "dev"), ("test", "test")):
        records = _read_json(paths[name])
        rows = []
        for index, record in enumerate(records):
            if not (isinstance(record.get("en"), str) and isinstance(record.get("es"), str)):
                raise ValueError(
                    f"{paths[name]}: record {index} lacks 'en'/'es' strings; restore the file."
                )
            rows.append((record[pair.source], record[pair.target]))
        splits[split] = rows
    origins = {"train": paths["train"], "validation": paths["dev"], "test": paths["test"]}
    return make_corpus(pair, splits, origins)


# ----------------------------------------------------------------------------- hub:


def load_hub(
    name: str,
    pair: str | LanguagePair,
    *,
    config: str | None = None,
    data_dir: str | None = None,
    translation_column: str = "translation",
    validation_size: int | None = None,
) -> datasets.DatasetDict:
    """Loads any hub dataset with a translation column ({lang: text} per row).

    Args:
      name: hub dataset id, e.g. "wmt/wmt14".
      pair: direction, e.g. "de-en"; must be two keys of the translation column.
      config: hub config; default the config named "<a>-<b>" for the pair in either
        order when the dataset has one, else none.
      data_dir: a folder written by `DatasetDict.save_to_disk` to read instead of the hub.
      translation_column: column holding the translation dicts.
      validation_size: carve validation from the end of train when there is none.

    Returns:
      DatasetDict with train/validation/test.

    Raises:
      RuntimeError: the hub cannot be reached (offline), with what to do instead.
    """
    pair = parse_pair(pair)
    if data_dir is not None:
        if not os.path.isdir(data_dir):
            raise FileNotFoundError(
                f"data_dir {data_dir} is not a folder; pass a folder written by "
                "DatasetDict.save_to_disk, or leave it unset to download."
            )
        hub = datasets.load_from_disk(data_dir)
    else:
        if config is None:
            config = _pick_config(name, pair)
        hub = _load_from_hub(name, config)
    if not isinstance(hub, datasets.DatasetDict):
        raise ValueError(f"{name!r} is a single split; save or load it as a DatasetDict.")
    return _hub_corpus(hub, pair, name, translation_column, validation_size)


def _pick_config(name: str, pair: LanguagePair) -> str | None:
    """The dataset's config named after the pair (either order), or None."""
    try:
        configs = datasets.get_dataset_config_names(name)
    except Exception as e:  # noqa: BLE001
        raise RuntimeError(
            f"Could not list configs of hub dataset {name!r}: {type(e).__name__}: {e}. The hub "
            "needs network access; offline, pass data_dir= (a save_to_disk folder) or use "
            "files:<folder>."
        ) from e
    for candidate in (f"{pair.source}-{pair.target}", f"{pair.target}-{pair.source}"):
        if candidate in configs:
            return candidate
    if len(configs) > 1:
        raise ValueError(
            f"Hub dataset {name!r} has configs {configs}, none named for {pair}; pass config=."
        )
    return None


# ----------------------------------------------------------------------------- registry

LOADERS: dict[str, Callable[..., datasets.DatasetDict]] = {
    "wmt16": load_wmt16,
    "bsd": load_bsd,
    "clinspen": load_clinspen,
}


def load_corpus(name: str, pair: str | LanguagePair, **kwargs) -> datasets.DatasetDict:
    """Loads a corpus by registry name.

    Args:
      name: "wmt16", "bsd", "clinspen", "hub:<dataset id>" or "files:<folder>".
      pair: direction, e.g. "de-en".
      **kwargs: passed to the loader (data_dir, train_split, validation_size, ...).

    Returns:
      DatasetDict with train/validation/test of {"translation": {source, target}}.

    Raises:
      ValueError: unknown name, listing the known ones.
    """
    if name.startswith("hub:"):
        return load_hub(name[len("hub:") :], pair, **kwargs)
    if name.startswith("files:"):
        return load_files(name[len("files:") :], pair, **kwargs)
    if name not in LOADERS:
        raise ValueError(
            f"Unknown corpus {name!r}; use one of {sorted(LOADERS)}, 'hub:<dataset id>' or "
            "'files:<folder>'."
        )
    return LOADERS[name](pair, **kwargs)
