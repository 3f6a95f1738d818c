"""Corpus registry: load a named parallel corpus as train/validation/test in one direction.

Every loader returns a `datasets.DatasetDict` with splits "train", "validation"
and "test", each with one column `translation` holding {source: str, target: str}
(source key first; `corpus_pair` reads the direction back). Each split's
`info.description` says which file(s) or hub split it came from.

One module a corpus (`wmt16`, `bsd`, `clinspen`, `hub`, `files`), each with a
frozen dataclass of the options its loader accepts; `registry.CORPORA` maps
names to them, and `load_corpus` is the one entry point for one corpus;
`mixture.load_corpora` reads `data.corpus` (one corpus, several separated by
commas, `detok:` for Moses-detokenised text) on top of it.

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

from dpnmt.data.corpora.bsd import BSD_URL, BsdOptions, load_bsd
from dpnmt.data.corpora.clinspen import CLINSPEN_URL, ClinSpEnOptions, load_clinspen
from dpnmt.data.corpora.common import (
    DATA_DIR_ENV,
    SPLIT_FILE_STEMS,
    SPLITS,
    Pairs,
    carve_validation,
    corpus_pair,
    make_corpus,
    resolve_corpus_dir,
    translation_features,
)
from dpnmt.data.corpora.files import FilesOptions, load_files
from dpnmt.data.corpora.hub import HubOptions, load_hub
from dpnmt.data.corpora.mixture import (
    DETOK_PREFIX,
    CorpusName,
    is_mixture,
    load_corpora,
    parse_corpus_names,
)
from dpnmt.data.corpora.registry import (
    CORPORA,
    LOADERS,
    Corpus,
    accepted_options,
    load_corpus,
    lookup,
    make_options,
)
from dpnmt.data.corpora.wmt16 import WMT16_HUB_NAME, WMT16_PAIRS, Wmt16Options, load_wmt16
from dpnmt.data.languages import LanguagePair, parse_pair

__all__ = [
    "BSD_URL",
    "CLINSPEN_URL",
    "CORPORA",
    "DETOK_PREFIX",
    "DATA_DIR_ENV",
    "LOADERS",
    "SPLITS",
    "SPLIT_FILE_STEMS",
    "WMT16_HUB_NAME",
    "WMT16_PAIRS",
    "BsdOptions",
    "ClinSpEnOptions",
    "Corpus",
    "CorpusName",
    "FilesOptions",
    "HubOptions",
    "LanguagePair",
    "Pairs",
    "Wmt16Options",
    "accepted_options",
    "carve_validation",
    "corpus_pair",
    "load_bsd",
    "is_mixture",
    "load_clinspen",
    "load_corpora",
    "load_corpus",
    "load_files",
    "load_hub",
    "load_wmt16",
    "lookup",
    "make_corpus",
    "make_options",
    "parse_corpus_names",
    "parse_pair",
    "resolve_corpus_dir",
    "translation_features",
]
