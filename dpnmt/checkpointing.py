"""Orbax checkpoints of a training run: arrays, plus JSON metadata for the rest.

A checkpoint holds, as arrays, the trainable params and the optimizer state;
as JSON, the step (and steps done), the privacy plan, the evaluation history,
the early-stopping state and only a SHA-256 hash of the secret noise seed (so
a resume can check it has the right seed without the checkpoint holding it).
The seed itself and the lot sampler's state per checkpoint (lot membership is
private) live in the run's `private/` folder, written by `dpnmt.trainer`, never
here: the checkpoint folder may be published with the run.
"""

import os
from typing import Any

import orbax.checkpoint as ocp

CHECKPOINT_DIR = "checkpoints"


def make_manager(workdir: str, *, max_to_keep: int = 2) -> ocp.CheckpointManager:
    """A CheckpointManager over `workdir/checkpoints` with items `state` and `meta`."""
    directory = os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR))
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
    return ocp.CheckpointManager(directory, options=options)


def save(manager: ocp.CheckpointManager, step: int, state: Any, meta: dict) -> None:
    """Saves `state` (pytree of arrays) and `meta` (JSON-able dict) at `step`; waits."""
    manager.save(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
        force=True,
    )
    manager.wait_until_finished()


def restore_latest(manager: ocp.CheckpointManager, like: Any) -> tuple[int, Any, dict] | None:
    """(step, state, meta) of the latest checkpoint, or None if there is none.

    Args:
      manager: from `make_manager`.
      like: a pytree with the structure, shapes and dtypes of the saved state.
    """
    step = manager.latest_step()
    if step is None:
        return None
    restored = manager.restore(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardRestore(like), meta=ocp.args.JsonRestore()),
    )
    return step, restored["state"], restored["meta"]
