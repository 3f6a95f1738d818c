"""A typo must not spend the budget: refused, or noted, before anything is written."""

import dataclasses

import pytest

from dpnmt import privacy
from dpnmt.config import RunConfig
from dpnmt.training import pieces, preflight
from tests.small_configs import FILES_ROWS, files_config


def _run(tmp_path, rows, **train):
    c = files_config(tmp_path / "corpus")
    (tmp_path / "corpus" / "train.tsv").write_text(
        "de\ten\n" + "".join(f"{a}\t{b}\n" for a, b in FILES_ROWS[:rows]), encoding="utf-8"
    )
    c.tokenizer.kind = "sentencepiece_private"  # No DP vocabulary note: only the plan's.
    c.tokenizer.private_data_ok = True
    c.train.update(train)
    return RunConfig.of(c)


@pytest.mark.parametrize("vocab_size", [10_000_000, 2_000_000])
def test_a_vocabulary_larger_than_any_models_is_refused(vocab_size):
    run = RunConfig()
    problems = dataclasses.replace(run.tokenizer, vocab_size=vocab_size).problems()
    assert problems == [
        f"tokenizer.vocab_size={vocab_size} must be >= 8 and <= 1,000,000 pieces (mT5 has "
        "250,112; more is most likely a typo)."
    ]
    assert dataclasses.replace(run.tokenizer, vocab_size=250_112).problems() == []


def test_a_tiny_private_corpus_gets_a_note_before_anything_is_written(tmp_path, caplog):
    workdir = tmp_path / "run"
    run = _run(tmp_path, 20, expected_lot_size=8, num_epochs=1)  # q 0.4, T 2 or 3.
    with caplog.at_level("WARNING"):
        preflight.check_run(run, str(workdir), load_corpus=pieces.load_corpus)
    (note,) = [r.getMessage() for r in caplog.records if "N=20 training pairs" in r.getMessage()]
    assert "T=" in note and "data.corpus" in note and "train.num_epochs" in note, note
    assert not workdir.exists()


def test_no_note_for_a_corpus_and_plan_of_useful_size():
    run = RunConfig()
    train = dataclasses.replace(run.train, expected_lot_size=64, num_epochs=2)
    assert privacy.small_run_note(run.dp, train, 29_000) is None
    assert "N=999 training pairs" in privacy.small_run_note(run.dp, train, 999)
    few_lots = dataclasses.replace(train, expected_lot_size=10_000, num_epochs=1)
    note = privacy.small_run_note(run.dp, few_lots, 29_000)
    assert "T=3 lots" in note and "what so few lots can teach" in note, note
    nonprivate = dataclasses.replace(run.dp, enabled=False)
    assert privacy.small_run_note(nonprivate, train, 20) is None
