"""Orbax checkpoints of a training run: arrays, plus JSON metadata for the rest.

A checkpoint holds the trainable params and optimizer state as arrays, and as
JSON the step, the privacy plan, the history, the early-stopping state and a
random run id (independent of the seed) that ties it to the workdir's
`private/` records. The secret seed and the sampler state live only in
`private/` (`dpnmt.trainer`): a checkpoint holds nothing derived from them and
may be published.
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
