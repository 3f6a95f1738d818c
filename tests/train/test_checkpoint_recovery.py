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
    assert why in message and "or start a new --workdir (a new --workdir would be a second" in (
        message
    )
    assert message.endswith("its ε not composed with this one's).")
    assert manager.all_steps() == list(steps)  # Nothing moved.


@pytest.mark.parametrize("secure", [False, True])
def test_a_relative_workdir_is_named_as_given_never_by_its_absolute_path(
    tmp_path, monkeypatch, caplog, secure
):
    """Orbax reads `checkpoints/` by its absolute path, so the unreadable step and its
    cause named the user's folders in a private run's log. Now as given: `run/...`."""
    monkeypatch.chdir(tmp_path)
    workdir = _workdir(tmp_path / "run", (4, 8))
    manager = _Manager(workdir)

    def read():  # As `checkpointing._read` reports it: orbax's directory and error.
        if max(manager.all_steps()) == 8:
            cause = ValueError(f"truncated chunk {workdir}/checkpoints/8/state/d/0")
            raise CheckpointUnreadable(str(workdir), 8, cause)
        return 4

    dp = dataclasses.replace(RunConfig().dp, secure_rng=secure)
    if secure:
        with pytest.raises(CheckpointUnreadable) as refused:
            checkpoint_recovery.read_newest(manager, RunDir("run"), read, dp)
        line = str(refused.value)
    else:
        assert checkpoint_recovery.read_newest(manager, RunDir("run"), read, dp) == 4
        (line,) = [r.getMessage() for r in caplog.records if "is unreadable" in r.getMessage()]
    assert line.startswith(os.path.join("run", "checkpoints", "8") + " is unreadable (")
    assert "chunk run/checkpoints/8/state/d/0" in line and str(tmp_path) not in line


def _published(workdir, step, tag, *, tensorboard=False):
    """A row (or TensorBoard event) at `step` as `metrics.MetricsWriter` publishes it."""
    from dpnmt.training.metrics import MetricsWriter  # noqa: PLC0415 - tensorboardX.

    writer = MetricsWriter(str(workdir))
    writer.write(step, {tag: 1.5})
    writer.close()
    if tensorboard:  # Only the event stays (metrics.jsonl cut on resume, say).
        os.remove(workdir / "metrics.jsonl")


@pytest.mark.parametrize(
    "step, tag, tensorboard",
    [(6, "validation/bleu", False), (8, "validation/loss", True)],
)
def test_a_private_run_does_not_go_back_over_a_published_validation(
    tmp_path, step, tag, tensorboard
):
    """The fallback redoes lots 5-8, whose validation may already be published: exact only
    if every bit repeats. A private run refuses it; progress rows (ε spent) do not count."""
    workdir = _workdir(tmp_path, (4, 8))
    manager = _Manager(workdir)
    _published(workdir, 7, "privacy/epsilon_spent")
    _published(workdir, 4, "validation/bleu")
    _published(workdir, step, tag, tensorboard=tensorboard)
    dp = RunConfig().dp
    with pytest.raises(CheckpointUnreadable) as refused:
        checkpoint_recovery.read_newest(
            manager, RunDir(str(workdir)), _read_unless_damaged(tmp_path, manager), dp
        )
    assert f"a validation of step {step} was published" in str(refused.value)
    assert manager.all_steps() == [4, 8]
    public = dataclasses.replace(dp, enabled=False)  # A non-private run keeps the fallback.
    read = _read_unless_damaged(tmp_path, manager)
    assert checkpoint_recovery.read_newest(manager, RunDir(str(workdir)), read, public) == 4


def test_a_private_run_goes_back_on_cpu_only(tmp_path, monkeypatch):
    """On a GPU, XLA's scatter-adds need not repeat bit for bit: the redone θ8' minus the
    lost θ8 would be a noise-free function of the data. A private run refuses there."""
    monkeypatch.setattr(checkpoint_recovery.jax, "default_backend", lambda: "gpu")
    workdir = _workdir(tmp_path, (4, 8))
    manager = _Manager(workdir)
    with pytest.raises(CheckpointUnreadable, match="on gpu the redone lots"):
        checkpoint_recovery.read_newest(
            manager, RunDir(str(workdir)), _read_unless_damaged(tmp_path, manager), RunConfig().dp
        )
    public = dataclasses.replace(RunConfig().dp, enabled=False)
    read = _read_unless_damaged(tmp_path, manager)
    assert checkpoint_recovery.read_newest(manager, RunDir(str(workdir)), read, public) == 4


def test_a_garbled_step_metadata_is_unreadable_not_a_traceback(tmp_path):
    """`scrub_kept` (each start, before anything) died with a JSONDecodeError on a garbled
    `_CHECKPOINT_METADATA` before the fallback could run; orbax itself reads past it, so
    its times would stay. Now that step is unreadable: set aside where going back is exact."""
    import numpy as np  # noqa: PLC0415

    from dpnmt.training import checkpointing  # noqa: PLC0415 - orbax.

    manager = checkpointing.make_manager(str(tmp_path))
    for step in (4, 8):
        checkpointing.save(manager, step, {"a": np.ones(3)}, {"plan": {}}, timeless=True)
    (tmp_path / "checkpoints" / "8" / "_CHECKPOINT_METADATA").write_text('{"init_timestamp_n')
    manager = checkpointing.make_manager(str(tmp_path))

    def scrub():
        return checkpointing.scrub_kept(manager, timeless=True)

    checkpoint_recovery.read_newest(manager, RunDir(str(tmp_path)), scrub, RunConfig().dp)
    assert manager.all_steps() == [4]
    assert (tmp_path / "private" / checkpoint_recovery.UNREADABLE_DIR / "8").is_dir()
