"""Ctrl-C in `python -m dpnmt.train`: a checkpoint at the lot boundary, one line, exit 130.

Then `--workdir` alone resumes the run (the end-of-run summary:
`test_summary.py`). The run is the smallest real one (`configs/tiny.py` shrunk, one
device, σ given): lots of a few tens of milliseconds, logged every lot so that
the test sends SIGINT while lots run.
"""

import os
import pathlib
import signal
import subprocess
import sys

import pytest

from tests.markers import needs_data

pytestmark = [pytest.mark.slow, needs_data]

REPO = pathlib.Path(__file__).resolve().parents[2]
OVERRIDES = {
    "noise_seed": 7,  # Fixed for the test: the run reports ε = ∞ (no guarantee).
    "testing_only_fixed_noise_seed_NO_PRIVACY": True,
    "data.max_train_examples": 600,
    "data.max_source_length": 16,
    "data.max_target_length": 16,
    "data.length_buckets": "none",
    "data.max_eval_examples": 4,
    "data.max_test_examples": 4,
    "tokenizer.dp_noise_stddev": 2.0,
    "tokenizer.vocab_size": 600,
    "model.d_model": 32,
    "model.d_ff": 64,
    "model.d_kv": 8,
    "model.num_heads": 2,
    "model.num_layers": 1,
    "model.num_decoder_layers": 1,
    "dp.noise_multiplier": 1.0,  # No σ calibration.
    "train.expected_lot_size": 16,
    "train.physical_batch_size": 8,
    "train.num_epochs": 3,  # 112 lots.
    "train.eval_every_steps": 0,
    "train.checkpoint_every_steps": 1000,  # Only the interrupt's and the last.
    "train.log_every_steps": 1,
    "eval.max_new_tokens": 4,
}


def _env():
    """The children's environment: one device, XLA's optimizations mostly off (CI time).

    The test checks the interruption and the resume, not numerics: both children
    compile alike, so the resumed one loads the first one's programs from the
    tests' compilation cache (`DPNMT_COMPILATION_CACHE`, train.compilation_cache "auto").
    """
    return dict(
        os.environ,
        PYTHONPATH=str(REPO),
        XLA_FLAGS="--xla_force_host_platform_device_count=1",
        JAX_DISABLE_MOST_OPTIMIZATIONS="1",
    )


def _interrupt_when(command, cwd, marker: str, sent=signal.SIGINT, env=None) -> tuple[int, str]:
    """Runs `command`, sends `sent` once `marker` is in its output; (exit status, output)."""
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=env or _env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    for line in process.stdout:
        lines.append(line)
        if marker in line:
            process.send_signal(sent)
            break
    lines.extend(process.stdout)
    return process.wait(timeout=600), "".join(lines)


def test_ctrl_c_saves_the_lot_boundary_and_the_workdir_alone_resumes(tmp_path):
    config = str(REPO / "configs" / "tiny.py")
    flags = [f"--config.{k}={v}" for k, v in OVERRIDES.items()]
    command = [sys.executable, "-m", "dpnmt.train", f"--config={config}:eps8", "--workdir=run"]
    status, output = _interrupt_when([*command, *flags], tmp_path, "step 3/")
    assert status == 130, output[-4000:]
    assert "Traceback" not in output
    last = output.strip().splitlines()[-1]
    assert last.startswith("dpnmt.train: Interrupted at lot "), output[-4000:]
    step = int(last.split("Interrupted at lot ")[1].split()[0])
    assert 3 <= step < 112
    assert f"the same command resumes from lot {step} (checkpoint saved)" in last
    # This interpreter and the data folder: the line works when pasted (outside a venv too).
    data_dir = os.path.abspath(os.environ["DPNMT_DATA_DIR"])
    resume_command = f"{sys.executable} -m dpnmt.train --config={config}:eps8 --workdir=run "
    assert f"(checkpoint saved): DPNMT_DATA_DIR={data_dir} {resume_command}" in last
    assert last.endswith(resume_command + " ".join(flags))
    # The one checkpoint is the state after lot `step`, and the sampler state of that step.
    assert os.listdir(tmp_path / "run" / "checkpoints") == [str(step)]
    assert (tmp_path / "run" / "private" / f"sampler_step_{step}.json").exists()

    # --workdir alone (the fixed test seed is not in config.json: given again).
    resume = [sys.executable, "-m", "dpnmt.train", "--workdir=run", "--config.noise_seed=7"]
    resume.append(f"--stop_after_steps={step + 2}")  # Two lots: no final evaluation (CI time).
    done = subprocess.run(
        resume, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"Resumed from step {step}." in done.stderr
    assert f"Stopped after step {step + 2} of 112" in done.stderr
    assert str(step + 2) in os.listdir(tmp_path / "run" / "checkpoints")


def test_sigterm_takes_the_ctrl_c_path_in_the_lots_and_before_them(tmp_path):
    config = str(REPO / "configs" / "tiny.py")
    flags = [f"--config.{k}={v}" for k, v in OVERRIDES.items()]
    command = [sys.executable, "-m", "dpnmt.train", f"--config={config}:eps8", "--workdir=run"]
    # Before the lots (the plan is logged before the model is built): stops at once, one line.
    status, output = _interrupt_when([*command, *flags], tmp_path, "Privacy plan:", signal.SIGTERM)
    assert status == 143, output[-4000:]
    assert "Traceback" not in output
    last = output.strip().splitlines()[-1]
    assert last.startswith("dpnmt.train: Interrupted; nothing after the last checkpoint is kept")
    # In the lots: the lot finishes, its checkpoint is committed, exit 128 + SIGTERM.
    status, output = _interrupt_when([*command, *flags], tmp_path, "step 3/", signal.SIGTERM)
    assert status == 143 and "Traceback" not in output, output[-4000:]
    last = output.strip().splitlines()[-1]
    assert last.startswith("dpnmt.train: Interrupted at lot "), output[-4000:]
    step = int(last.split("Interrupted at lot ")[1].split()[0])
    assert os.listdir(tmp_path / "run" / "checkpoints") == [str(step)]
