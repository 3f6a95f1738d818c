"""`bsd`: the Business Scene Dialogue corpus (ja-en), every conversation turn one pair."""

import dataclasses
import os

import datasets

from dpnmt.data.corpora.common import (
    Pairs,
    carve_validation_split,
    download,
    make_corpus,
    read_json,
    resolve_corpus_dir,
)
from dpnmt.data.languages import LanguagePair, check_pair_available, parse_pair
from dpnmt.errors import ConfigError, MissingInputError

BSD_URL = "https://raw.githubusercontent.com/tsuruoka-lab/BSD/master/{split}.json"
BSD_FOLDERS = ("bsd_ja_en",)
TRAIN_SPLITS = ("train", "dev")


@dataclasses.dataclass(frozen=True)
class BsdOptions:
    """Options of `bsd`.

    Attributes:
      data_dir: local folder; default $DPNMT_DATA_DIR's sub-folder, else download.
      train_split: "train" (train.json; validation = dev.json) or "dev": train on
        dev.json less its last `validation_size` pairs, which become validation.
        The shared offline copy has no train.json, so offline runs must say "dev".
      validation_size: pairs carved off dev.json when train_split="dev".
    """

    data_dir: str | None = None
    train_split: str = "train"
    validation_size: int = 200


def _bsd_pairs(path: str, pair: LanguagePair) -> Pairs:
    """Every conversation turn of a BSD file as a pair, both original languages merged.

    Each pair's group is its scenario (dialogue) id, e.g. "190315_E001_17".
    """
    scenarios = read_json(path)
    rows = []
    for scenario_index, scenario in enumerate(scenarios):
        for turn_index, turn in enumerate(scenario.get("conversation", ())):
            texts = {"ja": turn.get("ja_sentence"), "en": turn.get("en_sentence")}
            if not all(isinstance(t, str) for t in texts.values()):
                raise ConfigError(
                    f"{path}: scenario {scenario_index} ({scenario.get('id')}) turn "
                    f"{turn_index} lacks a ja_sentence/en_sentence string; restore the file "
                    "from tsuruoka-lab/BSD."
                )
            scenario_id = scenario.get("id")
            if scenario_id is None:
                scenario_id = f"{os.path.basename(path)}#{scenario_index}"
            group = str(scenario_id)
            rows.append((texts[pair.source], texts[pair.target], group))
    return rows


def load_bsd(
    pair: str | LanguagePair = "ja-en",
    *,
    data_dir: str | None = None,
    train_split: str = "train",
    validation_size: int = 200,
) -> datasets.DatasetDict:
    """Loads BSD: scenarios written in Japanese and in English merged into one ja-en corpus.

    As in the DP-NMT paper. Files: train.json, dev.json, test.json (github
    tsuruoka-lab/BSD), from `bsd_ja_en` under the data root or downloaded.

    Args:
      pair: "ja-en" or "en-ja".
      data_dir: see `BsdOptions`.
      train_split: see `BsdOptions`.
      validation_size: see `BsdOptions`.

    Returns:
      DatasetDict with train/validation/test (test = test.json).

    Raises:
      MissingInputError: train.json absent and train_split="train".
    """
    pair = parse_pair(pair)
    check_pair_available(pair, ("ja-en",), "bsd")
    if train_split not in TRAIN_SPLITS:
        raise ConfigError(f"data.bsd_train_split={train_split!r} is unknown; use 'train' or 'dev'.")
    folder = resolve_corpus_dir(data_dir, BSD_FOLDERS)
    files = ("dev", "test") if train_split == "dev" else ("train", "dev", "test")
    if folder is None:
        paths = download(BSD_URL, files, BSD_FOLDERS)
    else:
        paths = {name: os.path.join(folder, f"{name}.json") for name in files}
        if train_split == "train" and not os.path.isfile(paths["train"]):
            raise MissingInputError(
                f"{paths['train']} does not exist (the shared offline copy has only dev.json "
                "and test.json). Set data.bsd_train_split='dev' (train_split='dev') to train "
                "on dev.json (validation is then carved from its end), or add train.json "
                "from github tsuruoka-lab/BSD."
            )
    rows = {name: _bsd_pairs(path, pair) for name, path in paths.items()}
    if train_split == "dev":
        splits = {"train": rows["dev"], "test": rows["test"]}
        origins = {"train": paths["dev"], "test": paths["test"]}
        carve_validation_split(splits, origins, validation_size)
    else:
        splits = {"train": rows["train"], "validation": rows["dev"], "test": rows["test"]}
        origins = {"train": paths["train"], "validation": paths["dev"], "test": paths["test"]}
    return make_corpus(pair, splits, origins)
