"""Regression tests from the privacy review of the training app."""

import json
import math
import os
import types

import datasets
import pytest

from dpnmt import checkpointing, config_lib, experiment, privacy, trainer
from dpnmt.data.tokenizers import VocabularyRecord


def _dp_train(**dp):
    config = config_lib.base_config()
    config.dp.update(dp)
    return config.dp, config.train


# --- Vocabulary: a workdir's saved DP vocabulary must be loaded, never relearnt.


def _corpus(num_pairs=400):
    words_de = "das haus ist rot und der hund ist klein".split()
    words_en = "the house is red and the dog is small".split()
    rows = [
        {"de": " ".join(words_de[i % 5 :]), "en": " ".join(words_en[i % 5 :])}
        for i in range(num_pairs)
    ]
    return datasets.DatasetDict({"train": datasets.Dataset.from_dict({"translation": rows})})


def test_saved_tokenizer_without_record_is_never_relearnt(tmp_path, monkeypatch):
    """dpnmt.evaluation.decode.decode_and_score only checks tokenizer.model exists, then calls
    build_tokenizer(noise_seed=0): if vocabulary.json is missing, the DP
    vocabulary is LEARNT AGAIN from the private train split (spending privacy
    again, with the fixed public seed 0) and OVERWRITES the run's tokenizer.model,
    so the model is decoded with a vocabulary it was not trained with."""
    from dpnmt.data import dp_sentencepiece

    relearnt = []

    def spy(*args, **kwargs):
        relearnt.append(kwargs.get("seed"))
        raise RuntimeError("stop: the DP vocabulary was being learnt again")

    monkeypatch.setattr(dp_sentencepiece, "train_dp_sentencepiece", spy)
    config = config_lib.make_config("eps8")
    config.data.pair = "de-en"
    saved = b"the run's own tokenizer.model bytes"
    (tmp_path / experiment.TOKENIZER_FILE).write_bytes(saved)
    try:
        experiment.build_tokenizer(config, _corpus(), str(tmp_path), noise_seed=0)
    except Exception:  # noqa: BLE001 - refusing (or failing to load) is fine.
        pass
    assert not relearnt, "a workdir's DP vocabulary was learnt again from private data"
    assert (tmp_path / experiment.TOKENIZER_FILE).read_bytes() == saved


# --- Checkpoints: the natural artefact to publish carries the noise seed.


def test_checkpoint_does_not_hold_the_noise_seed(tmp_path):
    """trainer._save wrote the noise seed's unsalted sha256 into the checkpoint's
    meta JSON beside the trained weights. Publishing the checkpoint (the usual
    way to release a model) published a function of the seed (a fixed or
    low-entropy seed falls to a dictionary search). Meta now holds only a random
    run id, independent of the seed."""
    import hashlib

    import jax.numpy as jnp

    seed, run_id = 987654321012345, 2**100 + 17
    plan = privacy.plan_privacy(*_dp_train(target_epsilon=8.0), dataset_size=1_000)
    manager = checkpointing.make_manager(str(tmp_path))
    lots = types.SimpleNamespace(
        state_dict=lambda: {"epoch": 0, "step": 1, "generator_state": None}
    )
    best = {"bleu": -1.0, "step": 0, "evals_without_gain": 0}
    os.makedirs(tmp_path / trainer.PRIVATE_DIR)
    trainer._save(
        manager,
        str(tmp_path),
        1,
        {"w": jnp.zeros(3)},
        {"m": jnp.zeros(3)},
        lots,
        run_id,
        best,
        [],
        plan,
        False,
    )
    manager.close()
    legacy = hashlib.sha256(f"dpnmt-noise-seed:{seed}".encode()).hexdigest()
    found = []
    for folder, _, files in os.walk(tmp_path / checkpointing.CHECKPOINT_DIR):
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                data = f.read()
            if str(seed).encode() in data or legacy.encode() in data:
                found.append(os.path.join(folder, name))
            assert b"noise_seed" not in data
    assert not found, f"noise seed stored in published checkpoint files: {found}"


def test_resume_checks_the_run_id_and_still_accepts_old_seed_hashes(tmp_path):
    """New meta holds the run id; meta written before it holds the old seed hash."""
    seed, run_id = 12345, 99
    trainer._check_checkpoint_binding({"run_id": "99"}, seed, run_id, str(tmp_path))
    with pytest.raises(ValueError, match="run id differs"):
        trainer._check_checkpoint_binding({"run_id": "98"}, seed, run_id, str(tmp_path))
    old = {"noise_seed_sha256": trainer._legacy_seed_hash(seed)}
    trainer._check_checkpoint_binding(old, seed, run_id, str(tmp_path))  # Resumes.
    with pytest.raises(ValueError, match="noise seed differs"):
        trainer._check_checkpoint_binding(old, seed + 1, run_id, str(tmp_path))


def test_derived_seeds_keep_128_bits_and_every_bit_of_the_run_seed():
    """_derived_seed returned 63 bits: the noise key, sampler and vocabulary noise
    had at most 63 bits of secret however long the run seed."""
    seed = 2**127 + 12345
    for purpose in ("noise", "sampler", "vocabulary"):
        derived = [trainer._derived_seed(seed + k * 2**100, purpose) for k in range(8)]
        assert max(d.bit_length() for d in derived) > 120
        assert len(set(derived)) == 8  # Bits above 64 of the run seed matter.
    assert trainer._derived_seed(seed, "noise") != trainer._derived_seed(seed, "sampler")


# --- Plan validation: fail at plan time, consistently with the bridge and core.


def test_lot_size_equal_to_dataset_size_is_refused_by_the_plan_like_the_bridge():
    """plan_privacy accepts L == N; PoissonLots/ShuffledLots then refuse it
    ('must be smaller than the dataset size') after the vocabulary was learnt."""
    dp, train = _dp_train(target_epsilon=8.0)
    train.expected_lot_size = 1_000
    with pytest.raises(ValueError, match="expected_lot_size"):
        privacy.plan_privacy(dp, train, dataset_size=1_000)


def test_private_plan_with_zero_noise_is_refused_at_plan_time():
    """dp.enabled with dp.noise_multiplier=0 yields a 'private' plan with σ=0;
    it only fails later, inside the accountant, with a core-level message."""
    dp, train = _dp_train(target_epsilon=None, noise_multiplier=0.0)
    with pytest.raises(ValueError, match="noise_multiplier"):
        privacy.plan_privacy(dp, train, dataset_size=1_000)


# --- results.json must be valid JSON for non-Python readers.


def test_results_privacy_report_is_strict_json_for_a_nonprivate_run(tmp_path):
    """ε = ∞ must not be written as the bare token Infinity (not JSON; jq and
    JavaScript reject it): write_json stores it as the string "inf"."""
    config = config_lib.make_config("nonprivate")
    plan = privacy.plan_privacy(config.dp, config.train, dataset_size=1_000)
    vocabulary = VocabularyRecord("pretrained", True)
    path = tmp_path / "results.json"
    trainer.write_json(
        str(path), {"privacy": trainer.privacy_report(plan, plan.num_steps, vocabulary)}
    )
    text = path.read_text()

    def reject(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    json.loads(text, parse_constant=reject)
    assert math.isinf(plan.epsilon_after(plan.num_steps))
