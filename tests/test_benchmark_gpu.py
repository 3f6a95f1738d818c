"""benchmarks/gpu.sh at its tiny CPU size: the table and its summaries (no timing checked)."""

import os
import pathlib
import subprocess
import sys

import pytest

from benchmarks import mfu

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_script_tiny_prints_the_step_table(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # One CPU device.
    env.update(
        PYTHON=sys.executable,
        MODELS="multi30k",  # Its 4 buckets: the fewest programs that give an epoch.
        MODES="jax,ghost",
        JSON=str(tmp_path / "table.json"),
    )
    done = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu.sh"), "--tiny"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("peak float32: ") and "GFLOP/s" in line for line in lines)
    header = "| " + " | ".join(mfu.COLUMNS) + " |"
    assert header in lines
    rows = [line.split(" | ") for line in lines[lines.index(header) + 2 :] if line.startswith("| ")]
    assert len(rows) == 4 * 2  # Multi30K's 4 buckets x 2 modes.
    for row in rows:
        assert len(row) == len(mfu.COLUMNS)
        step_ms, mfu_pct = float(row[5]), float(row[-1].rstrip(" |"))
        assert step_ms > 0 and mfu_pct > 0
    assert {row[4] for row in rows} == {"jax", "ghost"}
    assert any(line.startswith("One Multi30K epoch, DERIVED") for line in lines)
    assert any("float32 ghost: " in line and "MFU" in line for line in lines)
    assert any(line.startswith("Paper anchor (mT5-small, WMT-16") for line in lines)


def test_nominal_peaks_follow_the_card_name():
    assert mfu.nominal_peak("NVIDIA H100 80GB HBM3")["bfloat16"] == 989.0
    assert mfu.nominal_peak("NVIDIA H100 PCIe")["bfloat16"] == 756.0
    assert mfu.nominal_peak("NVIDIA H200")["float32"] == 494.7
    assert mfu.nominal_peak("NVIDIA A100-SXM4-80GB")["bfloat16"] == 312.0
    assert mfu.nominal_peak("Tesla T4") is None


def test_analytic_flops_count_six_per_parameter_and_token():
    config = mfu.model_config(dict(mfu.SPECS["t5-small"]))
    # One target token through the LM head alone: 6 x d_model x vocab, per example.
    head = 6 * config.d_model * config.vocab_size / 1e9
    with_target = mfu.analytic_gflops(config, 1, 1, 1) - mfu.analytic_gflops(config, 1, 1, 0)
    assert with_target > head
    assert mfu.analytic_gflops(config, 2, 3, 5) == pytest.approx(
        2 * mfu.analytic_gflops(config, 1, 3, 5)
    )
