"""Fault injection: kill -9 at chosen points of a private run, a damaged checkpoint, resumes.

One chain of short `python -m dpnmt.train` sessions on `test_interrupt`'s
smallest run (checkpoints every 4 lots, logged every lot), each asserting what
a kill must leave and what the next start must do:

1. killed (test-only fault hook) after orbax committed the checkpoint of lot 4,
   before its scrub: the checkpoint keeps orbax's times; the next start scrubs
   every kept checkpoint before anything else (the times timed the lots);
2. killed (SIGKILL on its log line) at lot 7: metrics.jsonl holds lots 5 and 6 (and 7)
   past the checkpoint; the next session cuts them, so no step appears twice;
3. the checkpoint of lot 8 damaged: one line names it, the run goes back to
   lot 4 and redoes lots 5-8 with the same lots and noise: the same bytes.
"""

import hashlib
import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

from dpnmt import fault_points
from dpnmt.training import checkpoint_recovery
from tests.markers import needs_data
from tests.train.test_interrupt import OVERRIDES, REPO, _env, _interrupt_when

pytestmark = [pytest.mark.slow, needs_data]

FLAGS = [
    f"--config.{k}={v}"
    for k, v in {**OVERRIDES, "train.checkpoint_every_steps": 4, "train.num_epochs": 1}.items()
]
COMMAND = [
    sys.executable,
    "-m",
    "dpnmt.train",
    f"--config={REPO / 'configs' / 'tiny.py'}:eps8",
    "--workdir=run",
    *FLAGS,
]


def _times(step_dir: pathlib.Path) -> list:
    metadata = json.loads((step_dir / "_CHECKPOINT_METADATA").read_text())
    return [metadata.get("init_timestamp_nsecs"), metadata.get("commit_timestamp_nsecs")]


def _progress_steps(workdir: pathlib.Path) -> list[int]:
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [row["step"] for row in rows if "privacy/epsilon_spent" in row]


def _array_digest(step_dir: pathlib.Path) -> str:
    """A digest of the checkpoint's array files (not orbax's metadata)."""
    digest = hashlib.sha256()
    for path in sorted((step_dir / "state").rglob("*")):
        if path.is_file() and not path.name.startswith("_"):
            digest.update(path.relative_to(step_dir).as_posix().encode() + path.read_bytes())
    return digest.hexdigest()


def _train(tmp_path, *extra, fault=None):
    env = dict(_env(), **({fault_points.ENV_VAR: fault} if fault else {}))
    return subprocess.run(
        [*COMMAND, *extra], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )


def test_kills_and_a_damaged_checkpoint_resume_exactly_and_publish_no_time(tmp_path):
    workdir = tmp_path / "run"
    checkpoints = workdir / "checkpoints"
    # 1. Killed between the commit of lot 4 and its scrub.
    killed = _train(tmp_path, fault=f"{fault_points.CHECKPOINT_COMMITTED}@4")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert all(t is not None for t in _times(checkpoints / "4"))  # What the kill left.
    # 2. The next start scrubs it before it trains; then it is killed at lot 7.
    status, output = _interrupt_when(COMMAND, tmp_path, "step 7/", signal.SIGKILL)
    assert status == -signal.SIGKILL, output[-3000:]
    assert "Resumed from step 4." in output
    assert _times(checkpoints / "4") == [None, None]
    assert {os.stat(p).st_mtime for p in checkpoints.rglob("*")} == {0}
    assert _progress_steps(workdir)[:6] == [1, 2, 3, 4, 5, 6]
    # Resumed from lot 4 again: lots 5 to 7 are written once, not twice.
    done = _train(tmp_path, "--stop_after_steps=8")
    assert done.returncode == 0, done.stderr[-3000:]
    assert _progress_steps(workdir) == list(range(1, 9))
    original = _array_digest(checkpoints / "8")
    # 3. The newest checkpoint damaged: one line, back to lot 4, the same bytes again.
    chunks = [p for p in (checkpoints / "8" / "state").rglob("*") if p.is_file()]
    largest = max(chunks, key=lambda p: p.stat().st_size)
    largest.write_bytes(largest.read_bytes()[: largest.stat().st_size // 2])
    again = _train(tmp_path, "--stop_after_steps=8")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Traceback" not in again.stderr
    (line,) = [x for x in again.stderr.splitlines() if "is unreadable" in x]
    assert line.split("] ", 1)[1].startswith(f"{os.path.join('run', 'checkpoints', '8')} is")
    assert str(tmp_path) not in line  # The workdir as given (--workdir=run), in the cause too.
    assert "resuming from step 4 instead" in line and "Resumed from step 4." in again.stderr
    assert _array_digest(checkpoints / "8") == original
    assert (workdir / "private" / checkpoint_recovery.UNREADABLE_DIR / "8").is_dir()
    assert _progress_steps(workdir) == list(range(1, 9))
