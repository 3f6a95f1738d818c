"""Concatenated pairs (`data.concat_weight`): public train examples joined from short pairs."""

import collections
import os

import pytest

from dpnmt import config_lib
from dpnmt.config import RunConfig
from dpnmt.data import concatenation, corpora
from dpnmt.data.languages import parse_pair
from dpnmt.errors import ConfigError
from dpnmt.training import pieces, preflight

DE_EN = parse_pair("de-en")


def _split(rows, pair="de-en"):
    folder_rows = [{"translation": dict(zip(pair.split("-"), row, strict=True))} for row in rows]
    import datasets  # noqa: PLC0415

    features = corpora.common.translation_features(parse_pair(pair))
    return datasets.Dataset.from_list(folder_rows, features=features)


ROWS = [(f"s{i}", f"t{i}") for i in range(40)]


def _joined_rows(out, n_original):
    pairs = [(r["de"], r["en"]) for r in out["translation"]]
    originals = collections.Counter(ROWS[:n_original])
    counts = collections.Counter(pairs)
    assert all(counts[row] >= 1 for row in originals)  # Every pair is kept.
    return [p for p in pairs if " " in p[0]]


@pytest.mark.parametrize("weight, max_pairs", [(0.5, 3), (1.0, 2), (2.25, 4)])
def test_joined_examples_are_aligned_distinct_short_pairs(weight, max_pairs):
    out = concatenation.concatenate_pairs(_split(ROWS), DE_EN, weight, max_pairs, 200)
    assert len(out) == len(ROWS) + round(weight * len(ROWS))
    joined = _joined_rows(out, len(ROWS))
    assert len(joined) == round(weight * len(ROWS))
    sizes = collections.Counter()
    for source, target in joined:
        ids = [s[1:] for s in source.split(" ")]
        assert [t[1:] for t in target.split(" ")] == ids  # Same pairs, same order.
        assert len(set(ids)) == len(ids)  # Distinct pairs.
        sizes[len(ids)] += 1
    assert set(sizes) <= set(range(2, max_pairs + 1))
    if weight >= 1:  # Every k in 2..m drawn (uniform; 40+ draws).
        assert set(sizes) == set(range(2, max_pairs + 1))


def test_shuffled_together_and_deterministic():
    a = concatenation.concatenate_pairs(_split(ROWS), DE_EN, 1.0, 3, 200)
    b = concatenation.concatenate_pairs(_split(ROWS), DE_EN, 1.0, 3, 200)
    assert a["translation"] == b["translation"]
    first_half = [" " in r["de"] for r in a["translation"][: len(ROWS)]]
    assert any(first_half) and not all(first_half)  # Mixed in, not appended.
    other = concatenation.concatenate_pairs(_split(ROWS), DE_EN, 1.0, 3, 200, seed=1)
    assert other["translation"] != a["translation"]
    assert "2-3" in a.info.description and "concat_weight=1" in a.info.description


def test_only_short_non_empty_pairs_are_joined():
    rows = [*ROWS[:10], ("x" * 30, "long1"), ("", "empty"), ("lonely", " ")]
    out = concatenation.concatenate_pairs(_split(rows), DE_EN, 3.0, 2, 20)  # <= 10 chars.
    joined = [r for r in out["translation"] if " " in r["de"]]
    assert joined and all("x" not in r["de"] and "lonely" not in r["de"] for r in joined)
    assert all(r["en"].count("empty") == 0 for r in joined)
    assert sum(r["de"] == "x" * 30 for r in out["translation"]) == 1  # Kept, not joined.


def test_joined_sides_fit_max_chars_and_never_repeat_a_source():
    rows = [*((f"w{i:02d}", f"e{i:02d}") for i in range(30)), *(("w00", f"x{i}") for i in range(9))]
    out = concatenation.concatenate_pairs(_split(rows), DE_EN, 3.0, 4, 15)  # <= 3 chars each.
    joined = [r for r in out["translation"] if " " in r["de"]]
    assert joined and all(len(r["de"]) <= 15 and len(r["en"]) <= 15 for r in joined)
    for r in joined:
        sources = r["de"].split(" ")
        assert len(set(sources)) == len(sources), r
        assert not any(t.startswith("x") for t in r["en"].split(" "))  # w00's first row only.


def test_unspaced_languages_are_joined_without_a_space():
    rows = [(f"文{i}。", f"S{i}.") for i in range(6)]
    out = concatenation.concatenate_pairs(_split(rows, "ja-en"), parse_pair("ja-en"), 1.0, 2, 40)
    joined = [r for r in out["translation"] if r["en"].count("S") == 2]
    assert joined and all(r["ja"].count("文") == 2 and " " not in r["ja"] for r in joined)


def test_groups_and_too_few_short_pairs_are_refused():
    grouped = _split(ROWS).add_column("group", [str(i % 3) for i in range(len(ROWS))])
    with pytest.raises(ConfigError, match="privacy groups"):
        concatenation.concatenate_pairs(grouped, DE_EN, 1.0, 2, 200)
    with pytest.raises(ConfigError, match="raise data.concat_max_chars"):
        concatenation.concatenate_pairs(_split(ROWS), DE_EN, 1.0, 4, 7)  # <= 1 char: none.


def _config(folder, *, private):
    config = config_lib.make_config("eps8" if private else "nonprivate")
    config.data.corpus = folder
    config.data.pair = "de-en"
    config.data.concat_weight = 1.0
    return config


@pytest.fixture
def folder(tmp_path):
    path = tmp_path / "pairs"
    path.mkdir()
    for split in ("train", "validation", "test"):
        lines = ["de\ten", *(f"{a}\t{b}" for a, b in ROWS)]
        (path / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return f"files:{path}"


def test_a_private_run_or_another_objective_is_refused_before_anything_is_written(folder, tmp_path):
    problems = preflight.config_problems(
        RunConfig.of(_config(folder, private=True)), device_count=1
    )
    assert any("concat_weight=1 in a private run" in p for p in problems), problems
    assert not preflight.config_problems(
        RunConfig.of(_config(folder, private=False)), device_count=1
    )
    span = _config(folder, private=False)
    span.data.objective = "span_corruption"
    problems = preflight.config_problems(RunConfig.of(span), device_count=1)
    assert any("concatenation joins translation pairs" in p for p in problems), problems
    from dpnmt.training import setup  # noqa: PLC0415

    workdir = tmp_path / "run"
    with pytest.raises(ConfigError, match="in a private run"):
        setup.build_run(RunConfig.of(_config(folder, private=True)), str(workdir))
    assert not os.path.exists(workdir)


@pytest.mark.parametrize(
    "field, value, what",
    [
        ("concat_weight", -0.5, ">= 0"),
        ("concat_max_pairs", 1, ">= 2"),
        ("concat_max_chars", 1, ">= 2"),
    ],
)
def test_bad_values_are_named(folder, field, value, what):
    config = _config(folder, private=False)
    setattr(config.data, field, value)
    with pytest.raises(ConfigError, match=f"data.{field}.*{what}"):
        RunConfig.parse(config)


def test_a_public_run_trains_on_the_joined_split_evaluation_untouched(folder):
    run = RunConfig.of(_config(folder, private=False))
    corpus = pieces.load_corpus(run.data)
    assert len(corpus["train"]) == 2 * len(ROWS)
    assert len(corpus["validation"]) == len(ROWS) and len(corpus["test"]) == len(ROWS)
    assert not any(" " in r["de"] for r in corpus["validation"]["translation"])


def test_a_vocabulary_learnt_with_joined_pairs_binds_its_workdir_to_them():
    """A workdir holding only a vocabulary refuses a run with other concat fields (or none)."""
    from dpnmt.training import run_dir  # noqa: PLC0415

    for field in ("data.concat_weight", "data.concat_max_pairs", "data.concat_max_chars"):
        assert run_dir._depends_vocabulary(field), field
