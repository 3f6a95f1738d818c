"""The memorization test: choosing and duplicating texts, publication, and a tiny prefix-LM
run that memorises its duplicated texts without noise and not with DP-SGD."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from datasets import Dataset, DatasetDict

from dpnmt.auditing import memorization
from dpnmt.config import RunConfig
from dpnmt.errors import InputError
from dpnmt.training import run_dir
from tests.small_configs import smaller_config

WORDS = "rot blau grün gelb Haus Baum Hund Katze Tisch Stuhl Berg Fluss Stadt Wald".split()
WORDS += "Auto Brot Milch Buch Lampe Fenster Garten Vogel Fisch Schuh".split()


def random_texts(count, seed, length=8):
    """Texts of random words: a continuation is guessed from its prefix only by memory."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=length)) for _ in range(count)]


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN, HELD_OUT = random_texts(40, 0), random_texts(8, 1)


def mono_config(folder, variant):
    """A 1-layer prefix-LM T5 on `TRAIN` (German text alone), many cheap epochs."""
    folder.mkdir(exist_ok=True)
    for split, rows in (("train", TRAIN), ("validation", HELD_OUT), ("test", HELD_OUT)):
        (folder / f"{split}.de").write_text("".join(t + "\n" for t in rows), encoding="utf-8")
    public = folder.parent / "public.de"  # Public vocabulary text: the words, not the texts.
    public.write_text("\n".join(" ".join(WORDS[i:] + WORDS[:i]) for i in range(24)) + "\n")
    c = smaller_config(variant)
    c.dp.noise_multiplier = 2.0  # ε ≈ 6 per example for this plan, were the seed secret.
    c.data.corpus, c.data.pair = f"files:{folder}", "de-en"
    c.data.objective, c.data.objective_language = "prefix_lm", "de"
    c.data.prefix_min_fraction = c.data.prefix_max_fraction = 0.5  # Trained as prompted.
    c.data.max_train_examples = None
    c.data.max_eval_examples = c.data.max_test_examples = 8
    c.tokenizer.kind = "sentencepiece_public"
    c.tokenizer.public_text_paths = (str(public),)
    c.tokenizer.vocab_size = 330
    c.model.family = "t5"
    c.model.d_model, c.model.d_ff, c.model.d_kv = 64, 128, 16
    c.model.dropout_rate = 0.0
    c.train.expected_lot_size = 16
    c.train.physical_batch_size = 16
    c.train.num_epochs = 12
    c.train.learning_rate = 1e-2
    c.train.decay = "constant"
    c.train.checkpoint_every_steps = 10_000
    c.train.log_every_steps = 100
    c.eval.max_new_tokens = c.eval.batch_size = 16
    return c


OPTIONS = memorization.MemorizationOptions(duplicates=4, repeats=16, unique=8, held_out=8)


def test_choose_texts_draws_distinct_rows_and_refuses_too_few():
    chosen = memorization.choose_texts(40, 8, OPTIONS, seed=5)
    assert len(chosen.duplicated) == 4 and len(chosen.unique) == 8 and len(chosen.held_out) == 8
    assert not set(chosen.duplicated) & set(chosen.unique)
    assert chosen == memorization.choose_texts(40, 8, OPTIONS, seed=5)
    assert chosen != memorization.choose_texts(40, 8, OPTIONS, seed=6)
    with pytest.raises(InputError, match=r"--duplicates \+ --unique = 12; lower them"):
        memorization.choose_texts(11, 8, OPTIONS, seed=5)
    with pytest.raises(InputError, match="--held_out=8"):
        memorization.choose_texts(40, 7, OPTIONS, seed=5)


def test_bad_options_are_named_in_one_message():
    bad = memorization.MemorizationOptions(duplicates=2, repeats=1, unique=0)
    with pytest.raises(InputError, match=r"--unique=0 must be >= 1.*--repeats >= 2"):
        memorization.check_options(bad)
    memorization.check_options(memorization.MemorizationOptions(duplicates=0, repeats=1))


def test_the_app_refuses_bad_options_in_one_line_before_writing(tmp_path):
    workdir = tmp_path / "run"
    command = [sys.executable, "-m", "dpnmt.memorization", "--config=configs/tiny.py"]
    command += [f"--workdir={workdir}", "--duplicates=4", "--repeats=1"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if "--repeats=1" in line]
    assert len(errors) == 1 and "use --repeats >= 2" in errors[0]
    assert "Traceback" not in result.stderr
    assert not workdir.exists()


def test_add_duplicates_repeats_each_chosen_row_r_times_in_all():
    train = Dataset.from_dict({"translation": [{"de": t, "en": t} for t in TRAIN]})
    chosen = memorization.choose_texts(40, 8, OPTIONS, seed=5)
    out = memorization.add_duplicates(chosen, 16)(DatasetDict(train=train))["train"]
    texts = [row["de"] for row in out["translation"]]
    assert len(texts) == 40 + 4 * 15
    for i in range(40):
        assert texts.count(TRAIN[i]) == (16 if i in chosen.duplicated else TRAIN.count(TRAIN[i]))
    with pytest.raises(InputError, match="train split changed"):
        memorization.add_duplicates(chosen, 16)(DatasetDict(train=train.select(range(39))))


def run_test(tmp_path, variant):
    config = RunConfig.of(mono_config(tmp_path / "mono", variant))
    workdir = tmp_path / variant
    report = memorization.run_memorization(config, str(workdir), OPTIONS, selection_seed=3)
    scores = json.loads((workdir / run_dir.PRIVATE_DIR / memorization.SCORES_FILE).read_text())
    return report, scores["sets"], workdir


@pytest.mark.slow
def test_prefix_lm_memorises_duplicated_text_without_noise_and_not_with_dp(tmp_path):
    report, sets, workdir = run_test(tmp_path, "nonprivate")
    assert sets["duplicated"]["texts"] == 4
    assert sets["duplicated"]["exact_match"] >= 0.5  # Measured: 1.0 (0.0 once seen once).
    assert sets["duplicated"]["exact_match"] > sets["held_out"]["exact_match"]
    assert report["sets"] == sets  # A non-private run publishes every set.
    dp_report, dp_sets, dp_workdir = run_test(tmp_path, "eps8")
    privacy = json.loads((dp_workdir / run_dir.RESULTS_FILE).read_text())["privacy"]
    assert privacy["epsilon_if_seed_were_secret_NOT_A_GUARANTEE"] < 8
    assert dp_sets["duplicated"]["exact_match"] == 0  # Measured: 0 (TA 0.06).
    # A private run's training-text rates stay in private/; held-out ones are public.
    assert set(dp_report["sets"]) == {"held_out"}
    assert set(dp_report["withheld"]) == {"duplicated", "unique"}
    published = (dp_workdir / memorization.MEMORIZATION_FILE).read_text()
    assert not any(text in published for text in TRAIN)


def translation_config(folder):
    """The same model translating random-word sources to unrelated random-word targets."""
    folder.mkdir(exist_ok=True)
    c = mono_config(folder / "mono", "nonprivate")
    pairs = list(zip(TRAIN, random_texts(40, 2), strict=True))
    held = list(zip(HELD_OUT, random_texts(8, 3), strict=True))
    for split, rows in (("train", pairs), ("validation", held), ("test", held)):
        text = "de\ten\n" + "".join(f"{a}\t{b}\n" for a, b in rows)
        (folder / f"{split}.tsv").write_text(text, encoding="utf-8")
    c.data.corpus, c.data.objective = f"files:{folder}", "translation"
    c.model.source_prefix = ""
    return c


@pytest.mark.slow
def test_a_translation_model_gives_back_duplicated_targets_verbatim(tmp_path):
    config = RunConfig.of(translation_config(tmp_path / "pairs"))
    workdir = str(tmp_path / "run")
    report = memorization.run_memorization(config, workdir, OPTIONS, selection_seed=3)
    assert report["prompt"].startswith("the source sentence")
    sets = report["sets"]  # Non-private: every set published.
    # Measured: duplicated EM 0.25 (1 of 4 targets verbatim), TA 0.66; unique and
    # held-out EM 0, TA 0.05 and 0.02 (unrelated words: no way to guess them).
    assert sets["duplicated"]["token_accuracy"] > 0.4 > 0.2 > sets["held_out"]["token_accuracy"]
    assert sets["duplicated"]["exact_match"] >= sets["held_out"]["exact_match"] == 0
    # A rerun reuses the texts and the trained run; other options are refused.
    again = memorization.run_memorization(config, workdir, OPTIONS, selection_seed=99)
    assert again["sets"] == sets
    other = memorization.MemorizationOptions(duplicates=2, repeats=16, unique=8, held_out=8)
    with pytest.raises(InputError, match="chosen with other options"):
        memorization.run_memorization(config, workdir, other)


def test_prompts_are_the_runs_span_corruption_examples_or_the_half_prefix(tmp_path):
    from dpnmt.data import tokenizers
    from dpnmt.training import pieces

    c = mono_config(tmp_path / "mono", "nonprivate")
    c.data.objective, c.tokenizer.sentinels = "span_corruption", 8
    c.data.objective_seed = 7
    run = RunConfig.of(c)
    tokenizer, _ = tokenizers.train_sentencepiece(
        [str(tmp_path / "mono" / "train.de")], vocab_size=330, sentinels=8
    )
    corpus = DatasetDict(train=pieces.load_corpus(run.data)["train"])
    # What training builds (setup.build_run): the public draws of data.objective_seed.
    trained = pieces.make_objective(run.data, tokenizer)
    expected = pieces.tokenize_corpus(run, corpus, tokenizer, trained)[0]["train"]
    # No workdir, no private/ seed: the prompts are rebuilt from the config alone.
    prompt_run, objective = memorization.prompt_objective(run, tokenizer, "half")
    prompts = pieces.tokenize_corpus(prompt_run, corpus, tokenizer, objective)[0]["train"]
    assert prompts["input_ids"] == expected["input_ids"]  # The spans it trained on.
    assert prompts["labels"] == expected["labels"]
    # Prefix LM: the first round(n/2) tokens, whatever split range the run trained with.
    c.data.objective, c.data.prefix_min_fraction, c.data.prefix_max_fraction = "prefix_lm", 0, 1
    run = RunConfig.of(c)
    prompt_run, objective = memorization.prompt_objective(run, tokenizer, "half")
    row = pieces.tokenize_corpus(prompt_run, corpus, tokenizer, objective)[0]["train"][0]
    ids = tokenizer.encode([TRAIN[0]])[0][:-1][: run.data.max_source_length - 1]
    assert row["input_ids"] == ids[: round(len(ids) / 2)] + [tokenizer.eos_id]
    assert row["labels"] == ids[round(len(ids) / 2) :] + [tokenizer.eos_id]
