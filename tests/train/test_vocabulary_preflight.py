"""A vocabulary SentencePiece cannot build is refused before anything is written (issue 33)."""

import dataclasses

import pytest

from dpnmt.config import RunConfig
from dpnmt.data import checks, dp_sentencepiece
from dpnmt.errors import ConfigError
from dpnmt.training import loop, pieces, preflight
from tests.small_configs import FILES_ROWS, files_config, load_config


def _run(tmp_path, rows=120, **tokenizer):
    c = files_config(tmp_path / "corpus")
    if rows != len(FILES_ROWS):
        (tmp_path / "corpus" / "train.tsv").write_text(
            "de\ten\n" + "".join(f"{a}\t{b}\n" for a, b in FILES_ROWS[:rows]), encoding="utf-8"
        )
        c.train.expected_lot_size = 8  # Below N: only the vocabulary is wrong.
    c.tokenizer.update(tokenizer)
    return RunConfig.of(c)


def _problems(run):
    corpus = pieces.load_corpus(run.data)
    n = checks.kept_pairs(corpus["train"], run.data.pair)
    return checks.vocabulary_problems(run, corpus["train"], n)


def test_a_vocabulary_below_the_byte_and_special_pieces_is_refused_with_the_fix(tmp_path):
    (problem,) = _problems(_run(tmp_path, vocab_size=100))
    assert problem.startswith("tokenizer.vocab_size=100 is too small for a SentencePiece")
    assert "vocab_size=1000" in problem and "public_vocab" in problem


def test_a_corpus_too_small_for_any_dp_word_to_survive_is_refused(tmp_path):
    (problem,) = _problems(_run(tmp_path, rows=20))
    assert problem.startswith("N=20 training pairs is too few for a DP-SentencePiece vocabulary")
    assert "public" in problem and "C=135.8" in problem
    # 120 pairs, each word in every pair: within 2σ of the threshold, so it is tried.
    assert _problems(_run(tmp_path / "big")) == []


def test_a_private_vocabulary_smaller_than_the_text_characters_is_refused(tmp_path):
    run = _run(tmp_path, kind="sentencepiece_private", private_data_ok=True, vocab_size=270)
    (problem,) = _problems(run)
    assert "vocab_size=270 is too small for this corpus" in problem
    bigger = dataclasses.replace(run, tokenizer=dataclasses.replace(run.tokenizer, vocab_size=400))
    assert _problems(bigger) == []


def test_the_run_fails_in_one_message_before_writing_anything(tmp_path):
    workdir = tmp_path / "run"
    run = _run(tmp_path, rows=20)
    with pytest.raises(ConfigError, match="N=20 training pairs is too few"):
        loop.train_and_evaluate(run, str(workdir))
    assert not workdir.exists()
    with pytest.raises(ConfigError, match="N=20 training pairs"):
        preflight.check_run(run, str(workdir), load_corpus=pieces.load_corpus)


def test_dp_words_with_more_characters_than_pieces_fail_in_one_line():
    params = dp_sentencepiece.DPVocabularyParams(noise_stddev=2.0, delta=1e-9, max_words=64)
    pairs = FILES_ROWS * 3  # Satz, Nummer, hier, Sentence, number, here survive.
    with pytest.raises(ConfigError, match="vocab_size=270 is too small for the DP vocabulary"):
        dp_sentencepiece.train_dp_sentencepiece(pairs, vocab_size=270, params=params, seed=1)
    tokenizer, _ = dp_sentencepiece.train_dp_sentencepiece(
        pairs, vocab_size=274, params=params, seed=1
    )
    assert tokenizer.vocab_size == 274  # The exact need: one more and SentencePiece crashed.


def test_the_files_config_defaults_to_a_public_vocabulary_not_a_dp_one_learnt_from_few_pairs():
    # A DP vocabulary from 2,000 pairs kept 312 pieces and cut most sentences (issue 33).
    run = RunConfig.of(load_config("files", "eps8"))
    assert run.tokenizer_kind == "sentencepiece_public"
    assert run.tokenizer.public_corpora == load_config("multi30k", "eps8").tokenizer.public_corpora
    assert run.tokenizer.vocab_size == 8000
