"""An unreadable newest checkpoint: one line naming it, and the previous one where that is exact.

A checkpoint cut short or damaged on disk (truncated or zeroed arrays,
garbled metadata, its sampler state in `private/` missing) cannot be
resumed. The run may go back to the previous kept checkpoint only when
redoing the lots since then releases nothing new: the same lots with the
same noise. That holds when lots and noise follow from the secret seed and
the step alone (`lot_runner.LotRunner.derive_keys`, the sampler state saved
with each checkpoint); with `dp.secure_rng` a private run draws fresh lots
and keys every session, so the redone lots would be a second, unaccounted
release of data whose first release (the unreadable checkpoint, and any
validation published from it) may have been seen. Even with the same lots
and noise the redone parameters equal the lost ones only where the
computation repeats bit for bit (on CPU; a GPU's scatter-adds need not),
and a validation published from them would otherwise be released twice:
a private run goes back only in a CPU session and when no validation past
the earlier checkpoint is published (metrics.jsonl, tensorboard/). Else, or
when no earlier checkpoint is kept, or in a multi-process run, the start is
refused with the fix. The unreadable step is moved to
`private/unreadable_checkpoints/` (never published), so that the run
continues from the previous one. A private `dp.secure_rng` run whose
checkpoints are gone but whose `private/` shows it trained is refused
(`check_fresh_start`).
"""

import logging
import os
import shutil
from collections.abc import Callable
from typing import TypeVar

import jax

from dpnmt.config import PrivacyConfig
from dpnmt.errors import InputError
from dpnmt.public_names import as_given
from dpnmt.training.metrics import validation_published_after
from dpnmt.training.run_dir import (
    CHECKPOINT_DIR,
    PRIVATE_DIR,
    SAMPLER_PREFIX,
    SESSIONS_FILE,
    RunDir,
)

UNREADABLE_DIR = "unreadable_checkpoints"  # Under private/: the steps that could not be read.
NEW_WORKDIR_CAVEAT = (
    "a new --workdir would be a second run on the same data, its ε not composed with this one's"
)
Result = TypeVar("Result")


class CheckpointUnreadable(InputError, OSError):
    """The checkpoint at `step` (or its sampler state) cannot be read.

    Attributes:
      workdir: the run's folder.
      step: the checkpoint's step.
      cause: the error that reading it raised, as one short line.
    """

    def __init__(self, workdir: str, step: int, cause: BaseException | str, why: str = ""):
        if isinstance(cause, BaseException):
            first = (str(cause).strip().splitlines() or [""])[0][:200]
            cause = f"{type(cause).__name__}: {first}"
        self.workdir, self.step, self.cause, self.why = workdir, step, cause, why
        path = os.path.join(workdir, CHECKPOINT_DIR, str(step))
        super().__init__(f"{path} is unreadable ({cause}){why}")

    def as_given(self, workdir: str) -> "CheckpointUnreadable":
        """This error naming `workdir` as the user gave it (`RunDir.path`), in its cause too.

        Orbax holds `checkpoints/` by its absolute path; a relative workdir stays
        relative in a private run's log (`public_names.as_given`).
        """
        cause, why = as_given(self.cause, workdir), as_given(self.why, workdir)
        return CheckpointUnreadable(workdir, self.step, cause, why)


def check_fresh_start(run_dir: RunDir, dp: PrivacyConfig) -> None:
    """Refuses a private `dp.secure_rng` start without a checkpoint where one trained before.

    Deleted (or lost) checkpoints would restart the run from lot 1 with fresh
    lots and noise: a second release of the data, unaccounted, beside what the
    first one published. Its traces in `private/`: the session counter
    (`RunDir.count_session`) or a checkpoint's sampler state.

    Raises:
      InputError: the workdir already trained (one line, with the fix).
    """
    if not (dp.enabled and dp.secure_rng):
        return
    folder = os.path.join(run_dir.path, PRIVATE_DIR)
    names = os.listdir(folder) if os.path.isdir(folder) else []
    trained = any(name.startswith(SAMPLER_PREFIX) for name in names)
    if SESSIONS_FILE in names:
        with open(os.path.join(folder, SESSIONS_FILE), encoding="utf-8") as f:
            trained = trained or f.read().strip() not in ("", "0")  # Unreadable: trained.
    if trained:
        raise InputError(
            f"--workdir={run_dir.path} has no checkpoint, but its {PRIVATE_DIR}/ shows that this "
            "workdir already trained; restore its checkpoints or start a new --workdir "
            f"({NEW_WORKDIR_CAVEAT}). With dp.secure_rng a start from lot 1 would draw fresh "
            "lots and noise: a second release of the same data."
        )


def replays_exactly(dp: PrivacyConfig) -> bool:
    """Whether lots redone from an earlier checkpoint are the same lots with the same noise."""
    return not (dp.enabled and dp.secure_rng)


def read_newest(manager, run_dir: RunDir, read: Callable[[], Result], dp: PrivacyConfig) -> Result:
    """`read()` of the newest checkpoint; if it is unreadable, of the previous one where exact.

    Args:
      manager: the run's `CheckpointManager` (`read` reads its `latest_step()`).
      run_dir: the run's folder.
      read: reads the newest checkpoint; raises `CheckpointUnreadable` when it cannot.
      dp: the run's `dp` section (`replays_exactly`).

    Raises:
      CheckpointUnreadable: unreadable, and going back is not exact (one line, with the fix).
    """
    while True:
        try:
            return read()
        except CheckpointUnreadable as error:
            _fall_back(manager, run_dir, error.as_given(run_dir.path), dp)


def _fall_back(manager, run_dir: RunDir, error: CheckpointUnreadable, dp: PrivacyConfig) -> None:
    earlier = [step for step in manager.all_steps() if step < error.step]
    fix = f"restore it from a copy of the workdir, or start a new --workdir ({NEW_WORKDIR_CAVEAT})"
    if not earlier:
        why = "no earlier checkpoint is kept"
    elif not replays_exactly(dp):
        why = (
            f"dp.secure_rng draws fresh lots and noise each session: going back to step "
            f"{max(earlier)} would release lots {max(earlier) + 1} to {error.step} again with "
            "other noise, unaccounted"
        )
    elif dp.enabled and jax.default_backend() != "cpu":
        why = (
            f"on {jax.default_backend()} the redone lots {max(earlier) + 1} to {error.step} "
            "need not repeat bit for bit (XLA's scatter-adds), and the difference of two "
            "results would be a noise-free function of the data; only a CPU session goes back"
        )
    elif dp.enabled and (published := validation_published_after(run_dir.path, max(earlier))):
        why = (
            f"a validation of step {published} was published (metrics.jsonl or tensorboard/) "
            f"after the lots since step {max(earlier)}: redone, they would release it again, "
            "unaccounted if any bit differed"
        )
    elif jax.process_count() > 1:
        why = "a multi-process run does not go back (resume it once on one process)"
        fix = "restore it from a copy of the workdir, or resume it on one process"
    else:
        why = None
    if why is not None:
        raise CheckpointUnreadable(error.workdir, error.step, error.cause, f": {why}; {fix}.")
    aside = run_dir.private_file(os.path.join(UNREADABLE_DIR, str(error.step)))
    os.makedirs(os.path.dirname(aside), exist_ok=True)
    shutil.rmtree(aside, ignore_errors=True)
    os.rename(os.path.join(run_dir.path, CHECKPOINT_DIR, str(error.step)), aside)
    manager.reload()
    logging.warning(
        "%s; moved to %s/%s/%d; resuming from step %d instead: the lots since then are redone "
        "with the same lots and noise (the secret seed's), so nothing is released twice.",
        error,
        PRIVATE_DIR,
        UNREADABLE_DIR,
        error.step,
        max(earlier),
    )
