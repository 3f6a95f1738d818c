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


def test_the_prefix_words_join_a_dp_vocabulary_whole_at_no_epsilon(tmp_path):
    # Few words survive a small corpus; the T5 prefix (public, before every source) was
    # spelt in characters: 26 of 64 pieces on 2,000 Multi30K pairs (issue 33).
    run = _run(tmp_path, kind="dp_sentencepiece", dp_noise_stddev=2.0, model_type="bpe")
    assert pieces.prefix_words(run) == ("translate", "German", "to", "English:")
    corpus = pieces.load_corpus(run.data)
    tokenizer, record = pieces.build_tokenizer(run, corpus, str(tmp_path / "w"), noise_seed=1)
    prefix = "translate German to English: "
    assert len(tokenizer.encode([prefix])[0]) <= 6  # 4 words, ':', eos; 21 pieces before.
    assert record.details["public_words"] == ["English:", "German", "to", "translate"]
    params = dp_sentencepiece.DPVocabularyParams(noise_stddev=2.0, delta=1e-9, max_words=64)
    assert record.epsilon == max(params.epsilon, params.epsilon_analytic)  # Nothing added.
    assert record.details["num_words_kept"] == 6  # Satz Nummer hier Sentence number here.


def test_a_corpus_too_small_for_its_dp_vocabulary_gets_a_note_with_the_fixes(tmp_path):
    run = _run(tmp_path, kind="dp_sentencepiece", vocab_size=1000)  # σ 20: C = 135.8.
    note = checks.small_corpus_note(run, 2000)
    assert "N=2,000 training pairs" in note and "C=135.8" in note
    assert "python -m dpnmt.public_vocab" in note and "model_type=bpe" in note
    # The σ whose threshold is N/200 = 10 pairs, and its vocabulary ε.
    sigma = float(note.split("tokenizer.dp_noise_stddev=")[2].split(" ")[0])
    smaller = dp_sentencepiece.DPVocabularyParams(noise_stddev=sigma, delta=1e-9, max_words=64)
    assert smaller.threshold == pytest.approx(10.0, abs=0.1)
    epsilon = float(note.split("ε is ")[1].split(" ")[0])  # σ is printed to 3 digits.
    assert epsilon == pytest.approx(max(smaller.epsilon, smaller.epsilon_analytic), rel=0.01)
    assert checks.small_corpus_note(run, 28_000) is None  # >= 200 C pairs.
    public = RunConfig.of(load_config("files", "eps8"))
    assert checks.small_corpus_note(public, 2000) is None


def test_the_small_corpus_note_is_logged_before_anything_is_written(tmp_path, caplog):
    workdir = tmp_path / "run"
    run = _run(tmp_path)  # The base config: auto, a DP vocabulary at σ 20 on 120 pairs.
    with caplog.at_level("WARNING"):
        preflight.check_run(run, str(workdir), load_corpus=pieces.load_corpus)
    assert "DP-SentencePiece on N=120 training pairs" in caplog.text
    assert "no σ reaches that at this N" in caplog.text
    assert not workdir.exists()
