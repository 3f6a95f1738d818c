"""Multi-process training on 127.0.0.1: several processes, forced CPU devices each.

Every run starts real processes (`multiprocess_worker.py`) joined by
`jax.distributed`; the one-process reference is such a process too (8 devices,
no `jax.distributed`). The same seed and total device count must give the same
parameters whatever the split into processes, a run must resume on another
process count, the noise must be drawn once on the global sum, and a dead
process must make the others fail instead of hang.
"""

import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time

import chex
import jax
import numpy as np
import pytest
from scipy import stats

from dpnmt import distributed
from dpnmt.evaluation import decode as decode_lib
from tests.conftest import COLLECTIVE_TIMEOUT_FLAGS
from tests.markers import needs_data
from tests.train import multiprocess_worker as worker

pytestmark = pytest.mark.slow

REPO = pathlib.Path(__file__).resolve().parents[2]
WORKER = pathlib.Path(worker.__file__)
RUN_TIMEOUT_S = 420


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(mode, num_processes, devices_each, workdir, *extra):
    env = dict(os.environ)
    env["XLA_FLAGS"] = " ".join(
        (f"--xla_force_host_platform_device_count={devices_each}", *COLLECTIVE_TIMEOUT_FLAGS)
    )
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    port = str(_free_port())
    return [
        subprocess.Popen(
            [sys.executable, str(WORKER), mode, port, str(num_processes), str(rank), str(workdir)]
            + [str(e) for e in extra],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(num_processes)
    ]


def _finish(processes, timeout_s):
    """(return codes, logs, seconds until the last exit); kills all on timeout."""
    started, outputs = time.monotonic(), []
    try:
        for process in processes:
            left = max(timeout_s - (time.monotonic() - started), 1)
            outputs.append(process.communicate(timeout=left)[0])
    except subprocess.TimeoutExpired:
        for process in processes:
            process.kill()
        pytest.fail(f"processes still running after {timeout_s} s (a hang)")
    return [p.returncode for p in processes], outputs, time.monotonic() - started


def _check(processes, finished):
    codes, outputs, _ = finished
    for rank, (code, output) in enumerate(zip(codes, outputs, strict=True)):
        assert code == 0, f"process {rank} of {len(processes)} failed:\n{output[-4000:]}"


def _run(mode, num_processes, devices_each, workdir, *extra):
    processes = _start(mode, num_processes, devices_each, workdir, *extra)
    _check(processes, _finish(processes, RUN_TIMEOUT_S))


def _params_at(workdir, step, scratch):
    """Params of `workdir`'s checkpoint at `step` (a copy without the later ones)."""
    copy = scratch / f"{workdir.name}_at_{step}"
    shutil.copytree(workdir, copy)
    for later in (copy / "checkpoints").iterdir():
        if later.name.isdigit() and int(later.name) > step:
            shutil.rmtree(later)
    params, _, steps = decode_lib.load_trained_params(str(copy))
    assert steps == step
    return params


@needs_data
def test_two_processes_train_like_one_and_the_run_resumes_on_one(tmp_path):
    """2 x 4 devices to step 2, then 1 x 8 to step 4 == 1 x 8 throughout.

    Two processes tokenize the train split per lot (`data.tokenize_train=
    "auto"`), one process up front: the same examples either way, so a run
    resumes across both. (Four processes: `test_noise_is_drawn_once_on_the_global_sum`.)
    """
    reference, split = tmp_path / "reference", tmp_path / "split"
    # The reference (checkpoints at steps 2 and 4) runs beside the first split run.
    running = _start("train", 1, 8, reference, 4)
    _run("train", 2, 4, split, 2)
    _check(running, _finish(running, RUN_TIMEOUT_S))
    reference_2 = _params_at(reference, 2, tmp_path)
    chex.assert_trees_all_close(_params_at(split, 2, tmp_path), reference_2, rtol=1e-5, atol=1e-6)
    # Each process tokenized only the rows its 4 devices held of each 8-row
    # micro-batch: never more than 4, never a row the other process tokenized.
    rows_0, rows_1 = (worker.encoded_train_rows(split, p) for p in range(2))
    assert len(rows_0) == len(rows_1) > 0  # One call per micro-batch on each process.
    for mine, theirs in zip(rows_0, rows_1, strict=True):
        assert len(mine) <= 4 and len(theirs) <= 4 and not set(mine) & set(theirs)
    assert sum(map(len, rows_0)) > 0 and sum(map(len, rows_1)) > 0
    assert not (reference / worker.ENCODED_ROWS.format(0)).exists()  # Tokenized up front.

    # Resume on another process count, one process (tokenized up front, nothing
    # on demand): the same examples and lots.
    calls = len(rows_0)
    _run("train", 1, 8, split, 4)
    assert len(worker.encoded_train_rows(split, 0)) == calls  # No per-lot rows appended.
    reference_4 = _params_at(reference, 4, tmp_path)
    chex.assert_trees_all_close(_params_at(split, 4, tmp_path), reference_4, rtol=1e-5, atol=1e-6)
    # Steps 3-4 moved the parameters far beyond the tolerance: the check has teeth.
    moved = max(
        float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
        for a, b in zip(jax.tree.leaves(reference_2), jax.tree.leaves(reference_4), strict=True)
    )
    assert moved > 1e-3
    # The private records (written by process 0 alone in each session).
    assert (split / "private" / "noise_seed").read_text() == str(worker.small_config().noise_seed)
    assert sorted(p.name for p in (split / "private").glob("sampler_step_*.json")) == [
        "sampler_step_2.json",
        "sampler_step_4.json",
    ]
    assert not (split / "results.json").exists()  # Stopped before the end: no report yet.


def test_noise_is_drawn_once_on_the_global_sum(tmp_path):
    """4 processes x 2 devices: (global sum + N(0, σ²C²)) / L, the same as on one process."""
    _run("release", 4, 2, tmp_path)
    released = np.load(tmp_path / "release.npz")["w"]
    examples = worker.release_examples()
    noise = released * worker.RELEASE_LOT - examples.sum(axis=0)  # Global sum removed.
    sigma_c = worker.RELEASE_SIGMA * worker.RELEASE_CLIP
    # Σ noise² / (σC)² ~ χ²(d): a 1e-6 two-sided band (a per-process sum or σC√2
    # noise lies far outside it).
    chi2 = float(np.sum(noise.astype(np.float64) ** 2) / sigma_c**2)
    dim = worker.RELEASE_DIM
    assert stats.chi2.ppf(5e-7, dim) < chi2 < stats.chi2.ppf(1 - 5e-7, dim)
    # Noise from the replicated key, drawn once: the single-process release exactly.
    here = tmp_path / "here"
    here.mkdir()
    worker.release(str(here))
    np.testing.assert_allclose(released, np.load(here / "release.npz")["w"], rtol=1e-6, atol=1e-7)


def test_a_dead_process_makes_the_others_fail_not_hang(tmp_path):
    """The last process crashes; the others exit non-zero within the heartbeat timeout."""
    codes, outputs, seconds = _finish(_start("die", 2, 2, tmp_path), timeout_s=120)
    assert codes[-1] == 3
    assert codes[0] != 0
    assert "distributed" in outputs[0] or "Gloo" in outputs[0], outputs[0][-3000:]
    assert seconds < 120


@pytest.mark.parametrize(
    "flags, environ, expected",
    [
        ((None, None, None), {}, None),
        (("h:1", 2, 1), {}, distributed.Launch("h:1", 2, 1, "flags")),
        (
            (None, None, None),
            {
                "DPNMT_COORDINATOR_ADDRESS": "h:2",
                "DPNMT_NUM_PROCESSES": "4",
                "JOB_COMPLETION_INDEX": "3",
            },
            distributed.Launch("h:2", 4, 3, "environment"),
        ),
        (
            (None, None, None),
            {
                "SLURM_JOB_ID": "7",
                "SLURM_NTASKS": "4",
                "SLURM_PROCID": "1",
                "SLURM_STEP_NODELIST": "n[1-2]",
            },
            distributed.Launch(None, None, None, "slurm"),
        ),
        (
            (None, None, None),
            {
                "SLURM_JOB_ID": "7",
                "SLURM_NTASKS": "1",
                "SLURM_PROCID": "0",
                "SLURM_STEP_NODELIST": "n1",
            },
            None,
        ),
        ((None, None, None), {"JOB_COMPLETION_INDEX": "0"}, None),
    ],
)
def test_launch_settings_come_from_flags_environment_or_slurm(flags, environ, expected):
    assert distributed.resolve_launch(*flags, environ=environ) == expected


@pytest.mark.parametrize(
    "flags, match",
    [(("h:1", None, 0), "num_processes"), (("h:1", 2, 2), r"process_id=2 must lie")],
)
def test_incomplete_launch_settings_are_refused(flags, match):
    with pytest.raises(ValueError, match=match):
        distributed.resolve_launch(*flags, environ={})


def test_a_single_process_app_refuses_a_multi_process_environment():
    slurm = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2", "SLURM_PROCID": "1"}
    slurm["SLURM_STEP_NODELIST"] = "n1"
    env = {"DPNMT_COORDINATOR_ADDRESS": "h:1", "DPNMT_NUM_PROCESSES": "2"}
    assert distributed.single_process_problems("app", environ={}) == []
    (problem,) = distributed.single_process_problems("app", environ=slurm)
    assert problem.startswith("app runs on one process") and "srun" in problem
    ranked = {**env, "DPNMT_PROCESS_ID": "1"}
    (problem,) = distributed.single_process_problems("app", environ=ranked)
    assert "unset DPNMT_COORDINATOR_ADDRESS" in problem
    (problem,) = distributed.single_process_problems("app", environ=env)  # Rank missing.
    assert "lacks ['process_id']" in problem


@pytest.mark.parametrize("tokenized", ["upfront", "on_demand"])
def test_index_only_lots_fetch_the_same_rows_as_full_lots(tokenized):
    """One process: fetching rows per micro-batch gives exactly the full lot's arrays."""
    from dpnmt import bridge

    source = [[i + 1] * (1 + i % 5) for i in range(40)]
    target = [[i + 2] * (1 + i % 3) for i in range(40)]
    lengths = dict(max_source_length=6, max_target_length=4, pad_id=0)
    examples = bridge.TokenizedExamples(source, target, **lengths)
    rows_from = examples
    if tokenized == "on_demand":
        rows_from = bridge.TokenizedOnDemand(
            lambda rows: ([source[i] for i in rows], [target[i] for i in rows]), 40, **lengths
        )
    mesh = bridge.make_data_mesh()
    full = next(iter(bridge.PoissonLots(examples, 12, seed=3)))
    indices = next(iter(bridge.PoissonLots(bridge.IndexOnly(examples), 12, seed=3)))
    np.testing.assert_array_equal(full.indices, indices.indices)
    assert indices.batch == {}
    expected = bridge.to_microbatches(full, 8, pad_values=examples.pad_values)
    fetched = bridge.to_microbatches(indices, 8)
    assert len(expected) == len(fetched) > 0
    for want, micro in zip(expected, fetched, strict=True):
        got = bridge.shard_fetched_microbatch(micro, mesh, rows_from, rows_from.pad_values)
        assert set(got) == set(want)
        for name, values in want.items():
            np.testing.assert_array_equal(np.asarray(got[name]), values)
            assert got[name].sharding == bridge.batch_sharding(mesh)
