"""`clinspen`: ClinSpEn-CC (es-en clinical case reports, WMT22 biomedical task)."""

import dataclasses
import os

import datasets

from dpnmt.data.corpora.common import download, make_corpus, read_json, resolve_corpus_dir
from dpnmt.data.languages import LanguagePair, check_pair_available, parse_pair
from dpnmt.errors import ConfigError

CLINSPEN_URL = (
    "https://raw.githubusercontent.com/trusthlt/dp-nmt/main/data/clinspen_clinicalcases/"
    "{split}.json"
)
CLINSPEN_FOLDERS = ("clinspen_es_en",)


@dataclasses.dataclass(frozen=True)
class ClinSpEnOptions:
    """Options of `clinspen` (its three splits are fixed files: nothing is carved).

    Attributes:
      data_dir: local folder; default $DPNMT_DATA_DIR's sub-folder, else download.
    """

    data_dir: str | None = None


def load_clinspen(
    pair: str | LanguagePair = "es-en", *, data_dir: str | None = None
) -> datasets.DatasetDict:
    """Loads ClinSpEn-CC.

    Files train.json, dev.json, test.json, each a list of {file_name, en, es}
    (the DP-NMT authors' port), from `clinspen_es_en` under the data root or
    downloaded from github trusthlt/dp-nmt. `file_name`, the clinical case
    report, becomes each pair's `group`.

    Args:
      pair: "es-en" or "en-es".
      data_dir: see `ClinSpEnOptions`.

    Returns:
      DatasetDict with train/validation (dev.json)/test.
    """
    pair = parse_pair(pair)
    check_pair_available(pair, ("es-en",), "clinspen")
    folder = resolve_corpus_dir(data_dir, CLINSPEN_FOLDERS)
    if folder is None:
        paths = download(CLINSPEN_URL, ("train", "dev", "test"), CLINSPEN_FOLDERS)
    else:
        paths = {name: os.path.join(folder, f"{name}.json") for name in ("train", "dev", "test")}
    splits = {}
    for split, name in (("train", "train"), ("validation", "dev"), ("test", "test")):
        records = read_json(paths[name])
        rows = []
        for index, record in enumerate(records):
            if not (isinstance(record.get("en"), str) and isinstance(record.get("es"), str)):
                raise ConfigError(
                    f"{paths[name]}: record {index} lacks 'en'/'es' strings; restore the file."
                )
            # The case report a sentence comes from: the privacy unit of a patient.
            case = record.get("file_name")
            if isinstance(case, str) and case:
                rows.append((record[pair.source], record[pair.target], case))
            else:
                rows.append((record[pair.source], record[pair.target]))
        splits[split] = rows
    origins = {"train": paths["train"], "validation": paths["dev"], "test": paths["test"]}
    return make_corpus(pair, splits, origins)
