"""Several corpora in one run (`data.corpus="a,b"`, weights) and `detok:` corpora."""

import collections
import os

import pytest

from dpnmt import config_lib
from dpnmt.config import RunConfig
from dpnmt.data import corpora
from dpnmt.errors import ConfigError, InputError
from dpnmt.training import preflight


def _folder(root, name, rows, validation=None, test=None):
    folder = root / name
    folder.mkdir()
    for split, split_rows in (("train", rows), ("validation", validation), ("test", test)):
        lines = ["de\ten", *(f"{a}\t{b}" for a, b in (split_rows or rows[:2]))]
        (folder / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return f"files:{folder}"


def _pairs(split):
    return [(row["de"], row["en"]) for row in split["translation"]]


A_ROWS = [(f"a{i} de", f"a{i} en") for i in range(10)]
B_ROWS = [(f"b{i} de", f"b{i} en") for i in range(4)]


@pytest.fixture
def two(tmp_path):
    a = _folder(tmp_path, "a", A_ROWS, validation=[("va", "va")], test=[("ta", "ta")])
    b = _folder(tmp_path, "b", B_ROWS, validation=[("vb", "vb")], test=[("tb", "tb")])
    return a, b


def test_one_corpus_without_weights_is_the_registry_corpus(two):
    a, _ = two
    mixed, plain = corpora.load_corpora(a, "de-en"), corpora.load_corpus(a, "de-en")
    for split in corpora.SPLITS:
        assert _pairs(mixed[split]) == _pairs(plain[split])
        assert mixed[split].info.description == plain[split].info.description


def test_one_corpus_with_weight_one_is_the_registry_corpus(two):
    """Weights of 1 change nothing: the split keeps its order and names its file."""
    a, _ = two
    weighted = corpora.load_corpora(a, "de-en", weights=(1.0,))
    plain = corpora.load_corpus(a, "de-en")
    for split in corpora.SPLITS:
        assert _pairs(weighted[split]) == _pairs(plain[split])
        assert weighted[split].info.description == plain[split].info.description


def test_weights_repeat_and_sample_each_train_split_evaluation_from_the_first(two):
    a, b = two
    corpus = corpora.load_corpora(f"{a},{b}", "de-en", weights=(0.5, 2.5))
    counts = collections.Counter(_pairs(corpus["train"]))
    # 0.5 x 10 rows of a: 5 distinct rows once; 2.5 x 4 rows of b: each 2 or 3 times.
    a_rows = {row: n for row, n in counts.items() if row[0].startswith("a")}
    b_rows = {row: n for row, n in counts.items() if row[0].startswith("b")}
    assert len(a_rows) == 5 and set(a_rows.values()) == {1}
    assert set(b_rows) == set(B_ROWS) and sorted(b_rows.values()) == [2, 2, 3, 3]
    assert len(corpus["train"]) == 5 + 10
    assert _pairs(corpus["validation"]) == [("va", "va")]
    assert _pairs(corpus["test"]) == [("ta", "ta")]
    assert "weight 2.5" in corpus["train"].info.description
    # Shuffled (not a then b), and the same every time (a fixed, public seed).
    order = _pairs(corpus["train"])
    assert [r[0][0] for r in order] != sorted(r[0][0] for r in order)
    assert _pairs(corpora.load_corpora(f"{a},{b}", "de-en", weights=(0.5, 2.5))["train"]) == order


def test_detok_prefix_moses_detokenises_every_split(tmp_path):
    rows = [("Das ist gut , ja .", "It &apos;s good , yes .")] * 3
    name = _folder(tmp_path, "tok", rows)
    corpus = corpora.load_corpora(f"detok:{name}", "de-en")
    assert _pairs(corpus["train"])[0] == ("Das ist gut, ja.", "It's good, yes.")
    assert _pairs(corpus["test"])[0][1] == "It's good, yes."


@pytest.mark.parametrize(
    "spec",
    ["files:x,,files:y", "files:x,files:x", "nosuch,files:y", ""],
)
def test_bad_corpus_lists_are_refused(spec):
    with pytest.raises(InputError):
        corpora.parse_corpus_names(spec)


def _config(corpus: str, *, private: bool, weights=()):
    config = config_lib.make_config("eps8" if private else "nonprivate")
    config.data.corpus = corpus
    config.data.corpus_weights = weights
    config.data.pair = "de-en"
    return config


def test_a_private_run_over_several_corpora_or_weights_is_refused(two, tmp_path):
    a, b = two
    problems = preflight.config_problems(
        RunConfig.of(_config(f"{a},{b}", private=True)), device_count=1
    )
    assert any("accounting for mixing" in p for p in problems), problems
    for weights in ((2.0,), (1.0,)):  # Any weights at all: (1.0,) is no exception.
        weighted = _config(a, private=True, weights=weights)
        problems = preflight.config_problems(RunConfig.of(weighted), device_count=1)
        assert any("accounting for mixing" in p for p in problems), (weights, problems)
    assert not preflight.config_problems(
        RunConfig.of(_config(f"{a},{b}", private=False)), device_count=1
    )
    # Refused before anything is written: the workdir is never created.
    from dpnmt.training import setup

    workdir = tmp_path / "run"
    with pytest.raises(ConfigError, match="accounting for mixing"):
        setup.build_run(RunConfig.of(_config(f"{a},{b}", private=True)), str(workdir))
    assert not os.path.exists(workdir)


def test_weights_must_match_the_corpora(two):
    a, b = two
    problems = preflight.config_problems(
        RunConfig.of(_config(f"{a},{b}", private=False, weights=(1.0,))), device_count=1
    )
    assert any("1 weights for 2 corpora" in p for p in problems), problems
    problems = preflight.config_problems(
        RunConfig.of(_config(f"{a},{b}", private=False, weights=(1.0, 0.0))), device_count=1
    )
    assert any("> 0" in p for p in problems), problems
