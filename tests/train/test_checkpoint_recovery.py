"""`training.checkpoint_recovery`: back to the previous checkpoint only where that is exact."""

import dataclasses
import os

import pytest

from dpnmt.config import RunConfig
from dpnmt.training import checkpoint_recovery
from dpnmt.training.checkpoint_recovery import CheckpointUnreadable
from dpnmt.training.run_dir import RunDir


class _Manager:
    """The two calls `read_newest` makes of orbax's CheckpointManager, over folders."""

    def __init__(self, workdir):
        self.folder = workdir / "checkpoints"

    def all_steps(self):
        return sorted(int(name) for name in os.listdir(self.folder))

    def reload(self):
        pass


def _workdir(tmp_path, steps):
    for step in steps:
        os.makedirs(tmp_path / "checkpoints" / str(step))
    return tmp_path


def _read_unless_damaged(tmp_path, manager):
    def read():
        newest = max(manager.all_steps())
        if newest == 8:  # Damaged on disk.
            raise CheckpointUnreadable(str(tmp_path), 8, ValueError("truncated chunk\nmore"))
        return newest

    return read


def test_an_exact_replay_goes_back_and_sets_the_damaged_step_aside(tmp_path, caplog):
    workdir = _workdir(tmp_path, (4, 8))
    manager = _Manager(workdir)
    dp = RunConfig().dp  # Lots and noise from the secret seed and the step alone.
    read = _read_unless_damaged(tmp_path, manager)
    assert checkpoint_recovery.read_newest(manager, RunDir(str(workdir)), read, dp) == 4
    assert manager.all_steps() == [4]
    assert (workdir / "private" / checkpoint_recovery.UNREADABLE_DIR / "8").is_dir()
    (line,) = [r.getMessage() for r in caplog.records if "is unreadable" in r.getMessage()]
    assert "checkpoints/8 is unreadable (ValueError: truncated chunk)" in line
    assert "resuming from step 4 instead" in line


@pytest.mark.parametrize("secure, steps", [(True, (4, 8)), (False, (8,))])
def test_going_back_is_refused_in_one_line_where_it_would_not_be_exact(tmp_path, secure, steps):
    workdir = _workdir(tmp_path, steps)
    manager = _Manager(workdir)
    dp = dataclasses.replace(RunConfig().dp, secure_rng=secure)
    with pytest.raises(CheckpointUnreadable) as refused:
        read = _read_unless_damaged(tmp_path, manager)
        checkpoint_recovery.read_newest(manager, RunDir(str(workdir)), read, dp)
    message = str(refused.value)
    assert (
        "\n" not in message
        and "checkpoints/8 is unreadable (ValueError: truncated chunk)" in message
    )
    why = "would release lots 5 to 8 again with other noise" if secure else "no earlier checkpoint"
    assert why in message and message.endswith("or start a new --workdir.")
    assert manager.all_steps() == list(steps)  # Nothing moved.
