"""benchmarks/whole_run.py: the four runs on a tiny subset print every row (no timing checked)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from benchmarks import whole_run_table
from tests.markers import needs_data

REPO = pathlib.Path(__file__).resolve().parents[1]


# A 1+1-layer width-32 model, one shape, 2 lots of 64 of N = 160 pairs, a short (excluded)
# test evaluation, σ calibrated by RDP (seconds; PLD: tens, on both DP sides): the table's
# plumbing, not the figures (CI time).
N = 160
TINY = ",".join([
    "model.d_model=32", "model.d_ff=64", "model.d_kv=8", "model.num_heads=2",
    "model.num_layers=1", "model.num_decoder_layers=1", "data.length_buckets=none",
    "data.max_source_length=16", "data.max_target_length=16", "train.expected_lot_size=64",
    "data.max_test_examples=8", "eval.max_new_tokens=8", "dp.accountant=rdp",
])  # fmt: skip


@pytest.mark.slow
@needs_data
def test_whole_run_tiny_prints_every_row(tmp_path):
    out = tmp_path / "whole_run.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.whole_run", f"--max_train_examples={N}",
         "--opacus_mode=auto", "--probe_steps=1", f"--json={out}", f"--set={TINY}"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        timeout=900,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    header = "| " + " | ".join(whole_run_table.COLUMNS) + " |"
    assert header in lines
    rows = [line for line in lines[lines.index(header) + 2 :] if line.startswith("| ")]
    assert [row.split(" | ")[0].lstrip("| ").split(" (")[0] for row in rows] == [
        "dpnmt non-private",
        "dpnmt DP",
        "PyTorch non-private",
        "PyTorch + Opacus DP",
    ]
    for row in rows:
        cells = row.strip("| ").split(" | ")
        assert int(cells[1]) > 0 and int(cells[2]) > 0  # Examples, lots.
        assert float(cells[5]) > 0 and float(cells[7]) > 0  # Training s, examples/s.
        assert 0 < float(cells[6]) <= float(cells[5])  # The loop is part of training.
    assert rows[0].endswith("x |") and rows[1].endswith("x |")  # The two ratios.
    written = {row["mode"]: row for row in json.loads(out.read_text())["rows"]}
    # The same epoch on both sides: the same N, and σ for the same N and T.
    assert written["dpnmt"]["examples"] == written["torch"]["examples"] == N
    assert written["dpnmt_dp"]["noise_multiplier"] == pytest.approx(
        written["opacus"]["noise_multiplier"]
    )
    assert written["opacus"]["opacus_mode"] in ("fgc", "hooks")


def test_ratio_is_dpnmt_over_pytorch_examples_per_second():
    results = {
        "dpnmt": {"process_s": 12.0, "excluded_s": 2.0, "examples": 100, "steps": 1, "loop_s": 5.0},
        "torch": {
            "process_s": 20.0,
            "excluded_s": 0.0,
            "examples": 100,
            "steps": 1,
            "loop_s": 15.0,
        },
    }
    rows = {row["mode"]: row for row in whole_run_table.rows(results)}
    assert rows["dpnmt"]["train_s"] == 10.0
    assert rows["dpnmt"]["vs_pytorch"] == pytest.approx(2.0)
    assert "vs_pytorch" not in rows["torch"]
    expected = "| dpnmt non-private | 100 | 1 | 12.0 | 2.0 | 10.0 | 5.0 | 10.0 | 2.00x |"
    assert expected in whole_run_table.table(list(rows.values()))
