"""An objective's examples through `preprocess` on an Arrow-backed corpus: every parameter
of the objective changes them (no stale cache file from the datasets cache is reused)."""

from pathlib import Path

import datasets
import pytest

from dpnmt.data import preprocess, text_objective, tokenizers

TEXTS = [f"Der Satz {i} ist {i % 7} Worte lang und recht gut ." for i in range(40)]


@pytest.fixture(scope="module")
def arrow_corpus_and_tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("arrow")
    (folder / "train.de").write_text("".join(t + "\n" for t in TEXTS), encoding="utf-8")
    tokenizer, _ = tokenizers.train_sentencepiece(
        [str(folder / "train.de")], vocab_size=330, sentinels=8
    )
    rows = [{"de": t, "en": t} for t in TEXTS]
    datasets.DatasetDict(train=datasets.Dataset.from_dict({"translation": rows})).save_to_disk(
        str(folder / "saved")
    )
    return str(folder / "saved"), tokenizer


def _examples(path, tokenizer, name="span_corruption", seed=0, **options):
    corpus = text_objective.monolingual_corpus(datasets.load_from_disk(path), "de")
    objective = text_objective.TextObjective(
        name, seed, sentinel_ids=text_objective.sentinel_ids(tokenizer, 8), **options
    )
    tokenized, _ = preprocess.preprocess(
        corpus,
        tokenizer,
        pair="de-en",
        max_source_length=32,
        max_target_length=32,
        source_prefix="",
        objective=objective,
    )
    train = tokenized["train"].with_format(None)
    return list(train["input_ids"]), list(train["labels"])


@pytest.mark.parametrize(
    "first, second",
    [
        (dict(seed=1), dict(seed=2)),
        (dict(noise_density=0.15), dict(noise_density=0.5)),
        (dict(mean_span_length=1.0), dict(mean_span_length=4.0)),
        (
            dict(name="prefix_lm", prefix_min_fraction=0.2, prefix_max_fraction=0.2),
            dict(name="prefix_lm", prefix_min_fraction=0.8, prefix_max_fraction=0.8),
        ),
    ],
)
def test_each_objective_parameter_changes_an_arrow_corpus_examples(
    arrow_corpus_and_tokenizer, first, second
):
    path, tokenizer = arrow_corpus_and_tokenizer
    a = _examples(path, tokenizer, **first)
    files = sorted(p.name for p in Path(path).rglob("*"))
    b = _examples(path, tokenizer, **second)
    assert a != b
    assert sorted(p.name for p in Path(path).rglob("*")) == files  # No new cache file.
    assert _examples(path, tokenizer, **first) == a  # Deterministic.
