"""Pre-training objectives through `dpnmt.train`: monolingual `files:`, the same DP step,
sentinels refused when missing, examples a public function of each text and
data.objective_seed, and a resumed span-corruption run equal bit for bit to an uninterrupted
one."""

import dataclasses
import hashlib
import json
import os
import shutil

import numpy as np
import pytest
from datasets import DatasetDict

from dpnmt.config import RunConfig
from dpnmt.data import objectives, text_objective, tokenizers
from dpnmt.errors import ConfigError
from dpnmt.evaluation import decode as decode_lib
from dpnmt.training import loop, pieces, preflight
from tests.markers import needs_data
from tests.small_configs import smaller_config

TEXTS = [f"Der Satz {i} ist {i % 7} Worte lang ." for i in range(96)]


def mono_folder(folder):
    """A `files:` folder of German text alone: train.de, validation.de, test.de."""
    folder.mkdir(exist_ok=True)
    for split, rows in (("train", TEXTS), ("validation", TEXTS[:4]), ("test", TEXTS[:4])):
        (folder / f"{split}.de").write_text("".join(t + "\n" for t in rows), encoding="utf-8")
    return folder


def mono_config(folder, objective="span_corruption", variant="eps8"):
    c = smaller_config(variant)
    c.data.corpus = f"files:{mono_folder(folder)}"
    c.data.pair = "de-en"
    c.data.objective = objective
    c.data.objective_language = "de"
    c.data.max_train_examples = None
    c.data.max_source_length = c.data.max_target_length = 24
    c.tokenizer.kind = "sentencepiece_public"
    public = folder.parent / "public.de"  # Public text: not the run's data.
    public.write_text("".join(f"Ein Satz {i} ist kurz .\n" for i in range(50)), encoding="utf-8")
    c.tokenizer.public_text_paths = (str(public),)
    c.tokenizer.vocab_size = 330
    c.tokenizer.sentinels = 8
    c.model.family = "t5"
    c.train.expected_lot_size = 16
    c.train.checkpoint_every_steps = 2
    c.train.log_every_steps = 2
    return c


def test_span_corruption_without_enough_sentinels_is_refused_naming_the_field(tmp_path):
    c = mono_config(tmp_path / "mono")
    c.tokenizer.sentinels = 0
    with pytest.raises(ConfigError, match=r"tokenizer.sentinels >= 1\b"):
        preflight.check_static(RunConfig.of(c), None)
    c.tokenizer.sentinels, c.data.objective_language = 8, "fr"
    with pytest.raises(ConfigError, match="objective_language='fr' is not a language"):
        preflight.check_static(RunConfig.of(c), None)
    c.data.objective_language, c.data.objective = "de", "masked_lm"
    with pytest.raises(ConfigError, match="data.objective"):
        RunConfig.of(c).problems() and preflight.check_static(RunConfig.of(c), None)


def public_draw(seed, ids):
    """A text's generator as documented: SHA-256(b"dpnmt-objective" ‖ seed ‖ int64 ids)."""
    data = b"dpnmt-objective" + seed.to_bytes(8, "little") + np.asarray(ids, "<i8").tobytes()
    return np.random.default_rng(int.from_bytes(hashlib.sha256(data).digest(), "little"))


def test_objective_examples_come_from_one_text_and_the_public_seed(tmp_path):
    c = mono_config(tmp_path / "mono")
    c.data.objective_seed = 2**40 + 1
    run = RunConfig.of(c)
    corpus = pieces.load_corpus(run.data)
    assert corpus["train"][0]["translation"] == {"de": TEXTS[0], "en": TEXTS[0]}
    tokenizer, _ = tokenizers.train_sentencepiece(
        [str(tmp_path / "mono" / "train.de")], vocab_size=330, sentinels=8
    )
    sentinels = text_objective.sentinel_ids(tokenizer, 8)
    assert sentinels == list(range(3, 11))  # Control symbols after pad, eos, unk.
    assert tokenizer.encode(["<extra_id_0>"])[0][0] not in sentinels  # Never from text.
    objective = pieces.make_objective(run.data, tokenizer)
    tokenized, _ = pieces.tokenize_corpus(run, corpus, tokenizer, objective)
    train = tokenized["train"].with_format(None)
    # The documented public function of the text and data.objective_seed, nothing else.
    ids = tokenizer.encode([TEXTS[0]])[0][:-1][:23]
    inputs, targets = objectives.span_corruption(
        ids, public_draw(2**40 + 1, ids), sentinel_ids=sentinels
    )
    assert train[0]["input_ids"] == inputs.tolist() + [1]
    assert train[0]["labels"] == targets.tolist() + [1]
    # Each example reassembles its text (no prefix, no task words).
    for row, text in zip(train.select(range(10)), TEXTS, strict=False):
        inputs, labels = row["input_ids"][:-1], row["labels"][:-1]
        spans, out, current = {}, [], None
        for t in labels:
            if t in sentinels:
                current, spans[t] = t, []
            else:
                spans[current].append(t)
        for t in inputs:
            out += spans[t] if t in sentinels else [t]
        assert out == tokenizer.encode([text])[0][:-1][:23]
    # The same text gives the same example anywhere in the split (no position enters).
    moved = corpus["train"].select(list(range(95, -1, -1)))
    again, _ = pieces.tokenize_corpus(run, DatasetDict(train=moved), tokenizer, objective)
    assert again["train"][95]["input_ids"] == train[0]["input_ids"]
    # Another public seed: other spans.
    data = dataclasses.replace(run.data, objective_seed=2**40 + 2)
    other = pieces.make_objective(data, tokenizer)
    third, _ = pieces.tokenize_corpus(run, DatasetDict(train=corpus["train"]), tokenizer, other)
    assert list(third["train"]["input_ids"]) != list(train["input_ids"])
    with pytest.raises(ValueError, match="needs the run's TextObjective"):
        pieces.tokenize_corpus(run, corpus, tokenizer)


def test_a_prefix_lm_split_lies_in_its_fraction_range(tmp_path):
    c = mono_config(tmp_path / "mono", "prefix_lm")
    c.data.prefix_min_fraction = c.data.prefix_max_fraction = 0.5
    run = RunConfig.of(c)
    corpus = pieces.load_corpus(run.data)
    tokenizer, _ = tokenizers.train_sentencepiece(
        [str(tmp_path / "mono" / "train.de")], vocab_size=330
    )
    objective = pieces.make_objective(run.data, tokenizer)
    row = pieces.tokenize_corpus(run, corpus, tokenizer, objective)[0]["train"][0]
    ids = tokenizer.encode([TEXTS[0]])[0][:-1][:23]
    assert row["input_ids"] == ids[: round(len(ids) / 2)] + [1]
    assert row["labels"] == ids[round(len(ids) / 2) :] + [1]


@pytest.mark.slow
def test_a_resumed_span_corruption_run_equals_the_whole_run(tmp_path):
    c = mono_config(tmp_path / "mono")
    # Checkpoints only where a session stops (step 2, the end): the resume still reads one.
    c.train.checkpoint_every_steps = 1000
    whole, split = tmp_path / "whole", tmp_path / "split"
    results = loop.train_and_evaluate(RunConfig.of(c), str(whole))
    partial = loop.train_and_evaluate(RunConfig.of(c), str(split), stop_after_steps=2)
    assert not partial["finished"]
    assert sorted(os.listdir(split / "checkpoints")) == ["2"]  # Resumed from this one.
    resumed = loop.train_and_evaluate(RunConfig.of(c), str(split))
    assert resumed["finished"] and resumed["steps_done"] == results["steps_done"] >= 4
    a, _, _ = decode_lib.load_trained_params(str(whole))
    b, _, _ = decode_lib.load_trained_params(str(split))
    for x, y in zip(
        np.asarray(jax_leaves(a), dtype=object),
        np.asarray(jax_leaves(b), dtype=object),
        strict=True,
    ):
        np.testing.assert_array_equal(x, y)  # Bit for bit.
    report = json.loads((whole / "results.json").read_text())
    assert report["objective"]["name"] == "span_corruption"
    assert "one text" in report["objective"]["unit"]
    assert report["privacy"]["example"].startswith("one text")
    _decode_and_noise_to_signal_read_the_objective_from_the_workdir(whole, report)


def _decode_and_noise_to_signal_read_the_objective_from_the_workdir(workdir, report):
    """From a published copy (no private/): the run's own examples, scored on their spans."""
    from dpnmt.evaluation import noise_to_signal  # noqa: PLC0415

    run = decode_lib.load_run_config(str(workdir))
    assert run.data.objective_seed == 0  # Recorded in config.json: public.
    shutil.rmtree(workdir / "private")  # A published copy: the examples need no secret.
    decoded = decode_lib.decode_and_score(run, str(workdir), split="test", bertscore=False)
    # The same test examples and references as the run's own evaluation: equal scores.
    for key in ("bleu", "chrf", "exact_match", "num_sentences"):
        assert decoded["scores"][key] == report["test"][key], key
    assert decoded["privacy"]["example"] == report["privacy"]["example"]
    tokenizer, _ = pieces.build_tokenizer(run, None, str(workdir), noise_seed=None, learn=False)
    objective = pieces.make_objective(run.data, tokenizer)
    ids = tokenizer.encode([TEXTS[0]])[0][:-1]
    inputs, targets = objective(ids)
    assert objective.name == "span_corruption"
    assert len(targets) < len(ids) < len(inputs) + len(targets)  # Spans moved, sentinels added.
    measured = noise_to_signal.measure_run(run, str(workdir), max_examples=4)
    assert measured["trained"]["noise_to_signal"] > 0


def jax_leaves(tree):
    import jax

    return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(tree)]


def test_objectives_module_lists_the_config_choices():
    from dpnmt.config.sections import Objective

    assert tuple(Objective.__args__) == objectives.OBJECTIVES


@needs_data  # Multi30K's text and the public vocabulary's corpora.
@pytest.mark.parametrize("variant", ["span", "prefix,nonprivate", "span,eps8"])
def test_pretrain_mono_config_passes_the_static_checks(variant, tmp_path):
    from tests.small_configs import load_config

    c = load_config("pretrain_mono", variant)
    c.train.expected_lot_size = 4096  # Lots in the thousands: micro-batches accumulate.
    preflight.check_static(RunConfig.of(c), str(tmp_path / "run"))
    assert c.data.objective == ("prefix_lm" if "prefix" in variant else "span_corruption")


def test_the_unit_says_n_counts_the_non_empty_texts(tmp_path):
    from dpnmt import model_card  # noqa: PLC0415

    run = RunConfig.of(mono_config(tmp_path / "mono"))
    unit = loop.objective_json(run.data)["objective"]["unit"]
    assert "non-empty texts" in unit and "dropped before sampling" in unit
    lines = model_card._objective_lines(run.data, {"example": "one text"})
    assert "N counts the non-empty de texts" in lines[-1]
