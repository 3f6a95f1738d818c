"""`hub:<id>`: any Hugging Face hub dataset with a translation column."""

import dataclasses
import os
from collections.abc import Sequence

import datasets

from dpnmt.data.corpora.common import (
    SPLIT_FILE_STEMS,
    SPLITS,
    offline_hint,
    translation_features,
    validation_cut,
)
from dpnmt.data.languages import LanguagePair, parse_pair
from dpnmt.errors import ConfigError, MissingInputError, UnreachableError


@dataclasses.dataclass(frozen=True)
class HubOptions:
    """Options of `hub:<id>` corpora.

    Attributes:
      data_dir: a folder written by `DatasetDict.save_to_disk`, read instead of the hub.
      config: hub config; None: the config named "<a>-<b>" for the pair (either
        order) when the dataset has one, else none.
      translation_column: column holding the translation dicts.
      validation_size: carve validation from the end of train when there is none.
    """

    data_dir: str | None = None
    config: str | None = None
    translation_column: str = "translation"
    validation_size: int | None = None


def _reorder_hub_split(dataset: datasets.Dataset, pair: LanguagePair, column: str, name: str):
    """Keeps only `column` (a translation dict), re-keyed as {source, target} in that order."""
    if column not in dataset.column_names:
        raise ConfigError(
            f"Hub dataset {name!r} has no column {column!r}; it has {dataset.column_names}. "
            "Pass translation_column= naming its translation column."
        )
    feature = dataset.features[column]
    keys = list(getattr(feature, "languages", None) or feature.keys())
    if not pair.languages <= set(keys):
        raise ConfigError(
            f"Hub dataset {name!r} has languages {keys} in {column!r}, not the pair {pair}; "
            f"pick a pair of those (data.pair)."
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


def hub_corpus(
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
        cut = validation_cut(n, validation_size, f"hub dataset {name!r}")
        by_split["train"] = (f"{stem}[:{cut}]", train.select(range(cut)))
        by_split["validation"] = (f"{stem}[{cut}:]", train.select(range(cut, n)))
    missing = [s for s in SPLITS if s not in by_split]
    if missing:
        raise ConfigError(
            f"Hub dataset {name!r} has splits {list(hub_dataset)}, none for {missing}; "
            "set data.validation_size=N to carve validation from train, or use files:<folder>."
        )
    result = {}
    for split, (source_split, dataset) in by_split.items():
        if len(dataset) == 0:
            raise ConfigError(f"Split {source_split!r} of hub dataset {name!r} is empty.")
        result[split] = _reorder_hub_split(dataset, pair, column, name)
        result[split].info.description = f"{split}: hub {name} split {source_split}"
    return datasets.DatasetDict(result)


def load_from_hub(
    name: str, config: str | None, folder_names: Sequence[str] = ()
) -> datasets.DatasetDict:
    """Calls datasets.load_dataset, turning network failures into an actionable error."""
    try:
        return datasets.load_dataset(name, config)
    except Exception as e:  # noqa: BLE001 - any failure here means "cannot reach/resolve it".
        offline = (
            offline_hint(folder_names)
            if folder_names
            else "Offline: save it once with DatasetDict.save_to_disk and set data.dir to that "
            "folder, or export it to files and use files:<folder>."
        )
        raise UnreachableError(
            f"Could not load hub dataset {name!r} (config {config!r}) ({type(e).__name__}: "
            f"{e}). The hub needs network access (and HF_DATASETS_OFFLINE/HF_HUB_OFFLINE "
            f"unset). {offline}"
        ) from e


def _pick_config(name: str, pair: LanguagePair) -> str | None:
    """The dataset's config named after the pair (either order), or None."""
    try:
        configs = datasets.get_dataset_config_names(name)
    except Exception as e:  # noqa: BLE001
        raise UnreachableError(
            f"Could not list configs of hub dataset {name!r} ({type(e).__name__}: {e}). The "
            "hub needs network access; offline, set data.dir to a save_to_disk folder or use "
            "files:<folder>."
        ) from e
    for candidate in (f"{pair.source}-{pair.target}", f"{pair.target}-{pair.source}"):
        if candidate in configs:
            return candidate
    if len(configs) > 1:
        raise ConfigError(
            f"Hub dataset {name!r} has configs {configs}, none named for {pair}; pass config=."
        )
    return None


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
      config: see `HubOptions`.
      data_dir: see `HubOptions`.
      translation_column: see `HubOptions`.
      validation_size: see `HubOptions`.

    Returns:
      DatasetDict with train/validation/test.

    Raises:
      UnreachableError: the hub cannot be reached (offline), with what to do instead.
    """
    pair = parse_pair(pair)
    if data_dir is not None:
        if not os.path.isdir(data_dir):
            raise MissingInputError(
                f"data.dir={data_dir} is not a folder; pass a folder written by "
                "DatasetDict.save_to_disk, or leave it unset to download."
            )
        hub = datasets.load_from_disk(data_dir)
    else:
        if config is None:
            config = _pick_config(name, pair)
        hub = load_from_hub(name, config)
    if not isinstance(hub, datasets.DatasetDict):
        raise ConfigError(f"{name!r} is a single split; save or load it as a DatasetDict.")
    return hub_corpus(hub, pair, name, translation_column, validation_size)
