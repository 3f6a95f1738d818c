"""Checkpoints (`training.checkpointing`): publishable, bound to their run's private records."""

import dataclasses
import os
import types

import pytest

from dpnmt import config_lib, privacy
from dpnmt.training import checkpointing, run_dir


def _dp_train(**dp):
    config = config_lib.base_config()
    config.dp.update(dp)
    return config.dp, config.train


def test_checkpoint_does_not_hold_the_noise_seed(tmp_path):
    """Checkpoint saving (trainer._save then) wrote the noise seed's unsalted sha256
    into the checkpoint's meta JSON beside the trained weights. Publishing the checkpoint (the usual
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
    state = checkpointing.LoopState.initial({"w": jnp.zeros(3)}, {"m": jnp.zeros(3)})
    os.makedirs(tmp_path / run_dir.PRIVATE_DIR)
    checkpointing.save_state(
        manager,
        run_dir.RunDir(str(tmp_path)),
        dataclasses.replace(state, step=1),
        sampler_state=lots.state_dict(),
        run_id=run_id,
        plan=plan,
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
    checkpointing.check_binding({"run_id": "99"}, seed, run_id, str(tmp_path))
    with pytest.raises(ValueError, match="run id differs"):
        checkpointing.check_binding({"run_id": "98"}, seed, run_id, str(tmp_path))
    old = {"noise_seed_sha256": checkpointing.legacy_seed_hash(seed)}
    checkpointing.check_binding(old, seed, run_id, str(tmp_path))  # Resumes.
    with pytest.raises(ValueError, match="noise seed differs"):
        checkpointing.check_binding(old, seed + 1, run_id, str(tmp_path))
