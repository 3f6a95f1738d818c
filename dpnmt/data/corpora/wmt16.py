"""`wmt16`: WMT-16 news translation (cs/de/fi/ro/ru/tr with en), hub or local folder."""

import dataclasses

import datasets
from absl import logging

from dpnmt.data.corpora.common import (
    carve_validation_split,
    make_corpus,
    read_local_split,
    resolve_corpus_dir,
)
from dpnmt.data.corpora.hub import hub_corpus, load_from_hub
from dpnmt.data.languages import LanguagePair, check_pair_available, parse_pair
from dpnmt.errors import MissingInputError

WMT16_PAIRS = ("cs-en", "de-en", "fi-en", "ro-en", "ru-en", "tr-en")
WMT16_HUB_NAME = "wmt/wmt16"


@dataclasses.dataclass(frozen=True)
class Wmt16Options:
    """Options of `wmt16`.

    Attributes:
      data_dir: local folder; default $DPNMT_DATA_DIR's sub-folder, else download.
      validation_size: lines carved off the end of train when a local folder
        has no validation file.
    """

    data_dir: str | None = None
    validation_size: int = 500


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
      data_dir: see `Wmt16Options`.
      validation_size: see `Wmt16Options`.

    Returns:
      DatasetDict with train/validation/test.
    """
    pair = parse_pair(pair)
    check_pair_available(pair, WMT16_PAIRS, "wmt16")
    other = pair.source if pair.target == "en" else pair.target
    folder_names = (f"wmt16_{other}_en", f"wmt_sample_{other}_en")
    folder = resolve_corpus_dir(data_dir, folder_names)
    if folder is None:
        hub = load_from_hub(WMT16_HUB_NAME, f"{other}-en", folder_names)
        return hub_corpus(hub, pair, WMT16_HUB_NAME, "translation", None)
    splits, origins = {}, {}
    for split, extra in (("train", ()), ("validation", ()), ("test", ("newstest",))):
        found = read_local_split(folder, split, pair, extra_stems=extra)
        if found is None and split != "validation":
            raise MissingInputError(
                f"No {split} files for {pair} in {folder}: expected {split}.{pair.source} + "
                f"{split}.{pair.target}"
                + (" (or newstest.*)" if split == "test" else "")
                + "; add them or point data.dir at the WMT-16 folder."
            )
        if found is not None:
            splits[split], origins[split] = found
    if "validation" not in splits:
        carve_validation_split(splits, origins, validation_size, unit="lines")
    logging.debug("wmt16 %s offline splits: %s", pair, origins)  # Paths: for --verbosity=1.
    return make_corpus(pair, splits, origins)
