"""The sweep and its report on a 1x2x2 micro-grid of tiny runs on the shared WMT sample.

One module fixture runs the grid as a user would, in two sweeps: the first
stops after 3 runs (`--max_runs`), the 4th (last) run is then interrupted after
2 of its 4 steps, and the second sweep finishes the grid. Every test reads that
workdir (or a copy of it), so the 4 runs are trained once. One privacy level
(CI time): grids of several levels, and their reports, are tests/test_grid.py's.
The runs share the sweep's compilation cache (its default; the tests'
`DPNMT_COMPILATION_CACHE` folder is lifted here), so only the first run of each
program compiles.
"""

import csv
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import matplotlib.image
import numpy as np
import pytest

from dpnmt.sweeps import grid, report, summary
from dpnmt.training import compilation_cache
from tests.markers import needs_data

pytestmark = [pytest.mark.slow, needs_data]

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIG = "configs/tiny.py"
PRIVACY, SAMPLING, SEEDS = ["eps5"], ["poisson", "shuffle"], 2
# Runs of seconds: 200 pairs, lots of 50 (4 steps), a 1-layer width-32 T5.
OVERRIDES = [
    "--config.dp.accountant=rdp",
    "--config.data.max_train_examples=200",
    "--config.data.max_source_length=24",
    "--config.data.max_target_length=24",
    # One shape a run (CI time): buckets have their own tests and the utility runs.
    "--config.data.length_buckets=none",
    "--config.data.max_eval_examples=8",
    "--config.data.max_test_examples=8",
    "--config.tokenizer.vocab_size=300",
    "--config.tokenizer.dp_noise_stddev=2.0",
    "--config.model.d_model=32",
    "--config.model.d_ff=64",
    "--config.model.d_kv=8",
    "--config.model.num_heads=2",
    "--config.model.num_layers=1",
    "--config.model.num_decoder_layers=1",
    "--config.train.expected_lot_size=50",
    "--config.train.physical_batch_size=16",
    "--config.train.eval_every_steps=0",  # Validation at the end only (CI time).
    "--config.train.checkpoint_every_steps=2",
    "--config.train.log_every_steps=2",
    "--config.train.warmup_steps=1",
    "--config.eval.max_new_tokens=12",
]
SPECS = grid.expand(PRIVACY, SAMPLING, SEEDS)


def _env():
    """The user's environment: no `DPNMT_COMPILATION_CACHE`, so the sweep's cache applies."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(compilation_cache.ENV_VAR, None)
    return env


def run_sweep(workdir, *extra):
    command = [sys.executable, "-m", "dpnmt.sweep", f"--config={CONFIG}", f"--workdir={workdir}"]
    command += [f"--grid={','.join(PRIVACY)}", f"--sampling={','.join(SAMPLING)}"]
    command += [f"--seeds={SEEDS}", *extra, *OVERRIDES]
    return subprocess.run(
        command, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=1200
    )


def results_mtime(workdir, spec):
    return os.stat(workdir / spec.name / "results.json").st_mtime_ns


@pytest.fixture(scope="module")
def micro_grid(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("sweep") / "grid"
    first = run_sweep(workdir, "--max_runs=3")
    after_first = grid.read_manifest(str(workdir))
    mtimes = {spec: results_mtime(workdir, spec) for spec in SPECS[:3]}
    # Interrupt the 4th run after 2 of its 4 steps: the command the sweep runs, cut short.
    interrupted = SPECS[3]
    command = [sys.executable, "-m", "dpnmt.train", "--stop_after_steps=2"]
    command += grid.train_flags(CONFIG, interrupted, str(workdir / interrupted.name), OVERRIDES)
    env = {**_env(), "JAX_COMPILATION_CACHE_DIR": str(workdir / grid.JAX_CACHE)}  # As the sweep's.
    cut = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert cut.returncode == 0, cut.stderr[-3000:]
    second = run_sweep(workdir)
    return workdir, first, after_first, mtimes, second


def test_first_sweep_stops_after_max_runs_leaving_the_rest_pending(micro_grid):
    _, first, after_first, _, _ = micro_grid
    assert first.returncode == 0, first.stderr[-3000:]
    assert "rerun to continue" in first.stdout
    states = [after_first["runs"][spec.name]["state"] for spec in SPECS]
    assert states == [grid.FINISHED] * 3 + [grid.PENDING] * (len(SPECS) - 3)


def test_resumed_sweep_finishes_the_grid_without_redoing_finished_runs(micro_grid):
    workdir, _, _, mtimes, second = micro_grid
    assert second.returncode == 0, second.stderr[-3000:]
    manifest = grid.read_manifest(str(workdir))
    for spec in SPECS:
        record = manifest["runs"][spec.name]
        assert record["state"] == grid.FINISHED
        assert record["attempts"] == 1  # Each run was started by a sweep exactly once.
        # A private attempt's seconds, less its 50-lot windows, would time its last lots.
        assert ("seconds_last_attempt" in record) == (spec.privacy == "nonprivate")
        log = (workdir / spec.name / grid.TRAIN_LOG).read_text()
        assert not re.search(r"\d\d:\d\d:\d\d\.\d{6}", log), spec.name  # No lot is timed.
        results = json.loads((workdir / spec.name / "results.json").read_text())
        assert results["finished"]
        assert results["privacy"]["steps_done"] == results["privacy"]["steps_planned"]
        config = json.loads((workdir / spec.name / "config.json").read_text())
        assert config["seed"] == spec.seed and config["variant"] == spec.variant
    for spec, mtime in mtimes.items():
        assert results_mtime(workdir, spec) == mtime, f"{spec.name} was trained again"
    # The interrupted run resumed from its step-2 checkpoint, not from scratch.
    log = (workdir / SPECS[3].name / grid.TRAIN_LOG).read_text()
    assert "Resumed from step 2." in log
    # Its timestamped lines stay private: nothing outside private/ holds the log.
    assert grid.TRAIN_LOG.startswith("private")
    assert not list((workdir / SPECS[3].name).glob("*.log"))


def test_every_run_draws_its_own_secret_noise_seed(micro_grid):
    workdir = micro_grid[0]
    seeds = [(workdir / s.name / "private" / "noise_seed").read_text() for s in SPECS]
    assert len(set(seeds)) == len(SPECS)


def _expected_cells(workdir):
    cells = {}
    for spec in SPECS:
        results = json.loads((workdir / spec.name / "results.json").read_text())
        cells.setdefault((spec.privacy, spec.sampling), []).append(results)
    return cells


def test_report_numbers_equal_the_runs_results(micro_grid, tmp_path):
    workdir = micro_grid[0]
    markdown = report.write_report(str(workdir), str(tmp_path))
    with open(tmp_path / report.TABLE_CSV) as f:
        rows = {(r["privacy"], r["sampling"]): r for r in csv.DictReader(f)}
    expected = _expected_cells(workdir)
    assert rows.keys() == expected.keys()
    for cell, members in expected.items():
        row = rows[cell]
        bleu = [m["test"]["bleu"] for m in members]
        # None when a run had fewer than 50 lots (no rate is published): NaN in the table.
        seconds = [summary.as_float(m["seconds_per_epoch"]) for m in members]
        assert int(row["n"]) == SEEDS
        assert float(row["bleu_mean"]) == pytest.approx(np.mean(bleu), rel=1e-12, abs=1e-12)
        assert float(row["bleu_std"]) == pytest.approx(np.std(bleu, ddof=1), abs=1e-12)
        assert float(row["seconds_per_epoch_mean"]) == pytest.approx(np.mean(seconds), nan_ok=True)
        assert float(row["seconds_per_epoch_std"]) == pytest.approx(
            np.std(seconds, ddof=1), nan_ok=True
        )
        privacy = [m["privacy"] for m in members]
        assert float(row["epsilon"]) == pytest.approx(
            np.mean([p["dp_sgd_epsilon"] for p in privacy])
        )
        assert float(row["epsilon_total"]) == pytest.approx(
            np.mean([p["total_epsilon"] for p in privacy])
        )
        assert float(row["sigma"]) == pytest.approx(privacy[0]["noise_multiplier"])
        assert float(row["steps"]) == privacy[0]["steps_done"]
        assert float(row["epsilon"]) <= float(cell[0][3:]) * (1 + 1e-6)
        label = "Poisson, amplified" if cell[1] == "poisson" else "shuffled, no amplification"
        assert row["epsilon_bound"] == label
        assert row["bertscore_f1_mean"] == "nan"  # Not scored in these runs: no number made up.
        assert f"| {cell[0]} | {cell[1]} | {SEEDS} |" in markdown
    assert "(n − 1)" in markdown


def test_report_plots_are_valid_pngs(micro_grid, tmp_path):
    report.write_report(str(micro_grid[0]), str(tmp_path))
    for name in report.FIGURES:
        path = tmp_path / name
        assert path.stat().st_size > 0
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        image = matplotlib.image.imread(path)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
        assert np.ptp(image[..., :3]) > 0  # Something is drawn, not a blank canvas.


def test_failed_run_is_reported_and_the_sweep_goes_on(micro_grid, tmp_path):
    workdir = tmp_path / "grid"
    shutil.copytree(micro_grid[0], workdir)
    # Run 1 now holds a different config (the trainer refuses it); the last lost its results.
    poisoned = workdir / SPECS[0].name / "config.json"
    config = json.loads(poisoned.read_text())
    config["train"]["learning_rate"] = 0.5
    poisoned.write_text(json.dumps(config))
    (workdir / SPECS[-1].name / "results.json").unlink()
    result = run_sweep(workdir)
    assert result.returncode != 0
    assert "Some runs failed" in result.stderr
    assert SPECS[0].name in result.stdout
    manifest = grid.read_manifest(str(workdir))
    failed = manifest["runs"][SPECS[0].name]
    assert failed["state"] == grid.FAILED and failed["log"] == grid.TRAIN_LOG
    # The log's tail (it may quote private data) stays under the run's private/.
    assert "different config" not in (workdir / "sweep.json").read_text()
    assert "different config" in (workdir / SPECS[0].name / grid.ERROR_TAIL).read_text()
    assert grid.ERROR_TAIL.startswith("private")
    assert "different config" in result.stdout
    assert manifest["runs"][SPECS[-1].name]["state"] == grid.FINISHED
    assert (workdir / SPECS[-1].name / "results.json").exists()
    for spec in SPECS[1:-1]:
        assert manifest["runs"][spec.name]["attempts"] == 1
