"""Loaders on the shared offline corpora (skipped without DPNMT_DATA_DIR)."""

import json
import os

import pytest

from dpnmt.data import corpora

DATA_ROOT = os.environ.get(corpora.DATA_DIR_ENV)
pytestmark = [
    pytest.mark.data,
    pytest.mark.skipif(
        not DATA_ROOT,
        reason="DPNMT_DATA_DIR is unset: set it to the shared corpora folder (../shared/data)",
    ),
]


def _lines(path):
    with open(path, encoding="utf-8", newline="\n") as f:
        return f.read().split("\n")[:-1]


def _texts(split, pair):
    row = split[0]["translation"]
    return row[pair[0]], row[pair[1]]


def test_wmt16_offline_splits_and_first_pairs():
    folder = os.path.join(DATA_ROOT, "wmt_sample_de_en")
    de, en = _lines(f"{folder}/train.de"), _lines(f"{folder}/train.en")
    news_de, news_en = _lines(f"{folder}/newstest.de"), _lines(f"{folder}/newstest.en")
    corpus = corpora.load_corpus("wmt16", "de-en")
    assert {k: len(v) for k, v in corpus.items()} == {
        "train": len(de) - 500,
        "validation": 500,
        "test": len(news_de),
    }
    assert _texts(corpus["train"], ("de", "en")) == (de[0], en[0])
    assert _texts(corpus["validation"], ("de", "en")) == (de[-500], en[-500])
    assert _texts(corpus["test"], ("de", "en")) == (news_de[0], news_en[0])
    assert "newstest" in corpus["test"].info.description


def test_wmt16_direction_swap():
    forward = corpora.load_corpus("wmt16", "de-en", validation_size=100)
    backward = corpora.load_corpus("wmt16", "en-de", validation_size=100)
    assert str(corpora.corpus_pair(forward)) == "de-en"
    assert str(corpora.corpus_pair(backward)) == "en-de"
    for split in corpora.SPLITS:
        assert len(forward[split]) == len(backward[split])
        assert forward[split][3]["translation"] == backward[split][3]["translation"]
        assert list(backward[split].features["translation"]) == ["en", "de"]


def _bsd_turns(path):
    with open(path, encoding="utf-8") as f:
        return [turn for scenario in json.load(f) for turn in scenario["conversation"]]


def test_bsd_offline_requires_explicit_train_split():
    with pytest.raises(FileNotFoundError, match="train_split='dev'"):
        corpora.load_corpus("bsd", "ja-en")


def test_bsd_trains_on_dev_when_told():
    folder = os.path.join(DATA_ROOT, "bsd_ja_en")
    dev, test = _bsd_turns(f"{folder}/dev.json"), _bsd_turns(f"{folder}/test.json")
    corpus = corpora.load_corpus("bsd", "ja-en", train_split="dev", validation_size=150)
    assert {k: len(v) for k, v in corpus.items()} == {
        "train": len(dev) - 150,
        "validation": 150,
        "test": len(test),
    }
    assert _texts(corpus["train"], ("ja", "en")) == (dev[0]["ja_sentence"], dev[0]["en_sentence"])
    assert _texts(corpus["validation"], ("ja", "en")) == (
        dev[-150]["ja_sentence"],
        dev[-150]["en_sentence"],
    )
    assert _texts(corpus["test"], ("ja", "en")) == (test[0]["ja_sentence"], test[0]["en_sentence"])
    swapped = corpora.load_corpus("bsd", "en-ja", train_split="dev", validation_size=150)
    assert _texts(swapped["test"], ("en", "ja")) == (test[0]["en_sentence"], test[0]["ja_sentence"])


def test_clinspen_counts_first_pair_and_swap():
    folder = os.path.join(DATA_ROOT, "clinspen_es_en")
    records = {}
    for name in ("train", "dev", "test"):
        with open(f"{folder}/{name}.json", encoding="utf-8") as f:
            records[name] = json.load(f)
    corpus = corpora.load_corpus("clinspen", "es-en")
    assert len(corpus["train"]) == len(records["train"])
    assert len(corpus["validation"]) == len(records["dev"])
    assert len(corpus["test"]) == len(records["test"])
    first = records["train"][0]
    assert _texts(corpus["train"], ("es", "en")) == (first["es"], first["en"])
    swapped = corpora.load_corpus("clinspen", "en-es")
    assert _texts(swapped["train"], ("en", "es")) == (first["en"], first["es"])


@pytest.mark.parametrize(
    "name, pair, listed",
    [("wmt16", "fr-en", "de-en"), ("bsd", "zh-en", "ja-en"), ("clinspen", "de-en", "es-en")],
)
def test_wrong_pair_lists_available(name, pair, listed):
    with pytest.raises(ValueError, match=listed):
        corpora.load_corpus(name, pair)
