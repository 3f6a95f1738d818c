"""Checkpoints (`training.checkpointing`): publishable, bound to their run's private records."""

import dataclasses
import json
import os
import pathlib
import re
import struct
import time
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


def _times_in(data: bytes, start_ns: int, end_ns: int) -> list[str]:
    """Times within [start, end] in `data`: decimal seconds or ns, or little-endian u64 ns."""
    found = [
        text
        for text in re.findall(rb"\d{10,19}", data)
        if start_ns // 10**9 <= int(text[:10]) <= end_ns // 10**9
    ]
    found += [
        f"u64 at {i}"
        for i in range(len(data) - 7)
        if start_ns <= struct.unpack_from("<Q", data, i)[0] <= end_ns
    ]
    return found


def test_a_private_runs_checkpoints_hold_no_time_and_no_local_path(tmp_path):
    """Orbax wrote nanosecond init/commit times into each checkpoint's
    _CHECKPOINT_METADATA (and OCDBT its own commit time into manifest.ocdbt), and file
    modification times follow the saves: two kept checkpoints timed the few lots between
    them. commit_success.txt held the workdir's absolute path. A private run's
    checkpoints now carry no time and no path, and still restore."""
    import jax.numpy as jnp

    plan = privacy.plan_privacy(*_dp_train(target_epsilon=8.0), dataset_size=1_000)
    assert plan.private
    manager = checkpointing.make_manager(str(tmp_path))
    os.makedirs(tmp_path / run_dir.PRIVATE_DIR)
    state = checkpointing.LoopState.initial({"w": jnp.arange(3.0)}, {"m": jnp.zeros(3)})
    start_ns = time.time_ns()
    for step in (3, 5):
        checkpointing.save_state(
            manager,
            run_dir.RunDir(str(tmp_path)),
            dataclasses.replace(state, step=step),
            sampler_state={"epoch": 0, "step": step, "generator_state": None},
            run_id=7,
            plan=plan,
        )
    manager.close()
    end_ns = time.time_ns()
    folder = tmp_path / checkpointing.CHECKPOINT_DIR
    assert sorted(os.listdir(folder)) == ["3", "5"]
    paths = [folder] + [pathlib.Path(d, n) for d, ds, fs in os.walk(folder) for n in ds + fs]
    assert all(os.lstat(p).st_mtime == 0 for p in paths), "a modification time dates a save"
    for path in paths:
        if path.is_file():
            data = path.read_bytes()
            assert str(tmp_path).encode() not in data, f"{path} holds a local path"
            assert not _times_in(data, start_ns, end_ns), f"{path} holds a time"
    metadata = json.loads((folder / "5" / "_CHECKPOINT_METADATA").read_text())
    assert metadata["init_timestamp_nsecs"] is None and metadata["commit_timestamp_nsecs"] is None
    restored = checkpointing.make_manager(str(tmp_path))
    step, arrays, meta = checkpointing.restore_latest(
        restored, {"trainable": state.trainable, "opt_state": state.opt_state}
    )
    assert step == 5 and meta["run_id"] == "7"
    assert jnp.array_equal(arrays["trainable"]["w"], jnp.arange(3.0))
