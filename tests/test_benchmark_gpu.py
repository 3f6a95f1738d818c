"""benchmarks/gpu.sh at its tiny CPU size: the table and its summaries (no timing checked)."""

import os
import pathlib
import subprocess
import sys

import pytest
from absl.testing import flagsaver

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
    assert any("float32 ghost batch 4: " in line and "MFU" in line for line in lines)
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


def test_a_mode_out_of_memory_drops_alone_and_skips_larger_batches(monkeypatch, capsys):
    from absl import flags  # noqa: PLC0415

    if not flags.FLAGS.is_parsed():
        flags.FLAGS(["mfu"], known_only=True)
    built = []

    def fake_step(config, dtype, batch, source, target, mode):
        built.append((mode, batch))

        def run():
            if mode == "vmap" and batch >= 4:
                raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate")

        return run, 1.0

    monkeypatch.setattr(mfu, "_step", fake_step)
    with flagsaver.flagsaver(
        models=["t5-small"], batch_sizes=["2", "4", "8"], seq_lens=["8"], steps=1
    ):
        rows = mfu._cells({"float32": 1.0})
    got = [(r["mode"], r["batch"]) for r in rows]
    assert got == [
        (m, b)
        for b in (2, 4, 8)
        for m in ("jax", "ghost", "vmap")
        if (m, b) not in {("vmap", 4), ("vmap", 8)}
    ]
    assert ("vmap", 8) not in built  # Not built again after it ran out of memory at 4.
    assert "t5-small float32 batch 4 8+8 vmap: stop, RESOURCE_EXHAUSTED" in capsys.readouterr().out


def test_an_error_other_than_out_of_memory_is_raised(monkeypatch):
    from absl import flags  # noqa: PLC0415

    if not flags.FLAGS.is_parsed():
        flags.FLAGS(["mfu"], known_only=True)

    def broken(*args):
        raise ValueError("a real bug")

    monkeypatch.setattr(mfu, "_step", broken)
    with pytest.raises(ValueError, match="a real bug"):
        mfu._cell("t5-small", None, "float32", 2, 8, 8, 1.0, ["jax"])
