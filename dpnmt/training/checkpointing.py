"""Orbax checkpoints of a training run: arrays, plus JSON metadata for the rest.

A checkpoint holds the trainable params and optimizer state (and, with
`train.ema_decay`, their moving average) as arrays, and as
JSON the step, the privacy plan, the history, the early-stopping state and a
random run id (independent of the seed) that ties it to the workdir's
`private/` records. The secret seed and the sampler state live only in
`private/` (`dpnmt.training.run_dir`): a checkpoint holds nothing derived from
them and may be published.

Nor does it hold a local path or, in a private run, a time. Orbax writes the
absolute folder into each `commit_success.txt` (rewritten to the folder's
name within the workdir) and nanosecond init/commit times into
`_CHECKPOINT_METADATA`; two kept checkpoints then time the lots between them,
however few (a session's last step, an evaluation). A private run's
checkpoints carry no time: those fields are emptied and every file and folder
under `checkpoints/` gets modification time 0 (1970-01-01) after each save.
The arrays are written as zarr folders, not OCDBT: an OCDBT manifest records
its own commit time (checksummed binary); restore reads either format.
"""

import dataclasses
import gc
import hashlib
import json
import logging
import os
from typing import Any

import orbax.checkpoint as ocp

from dpnmt import atomic_file, distributed, fault_points, privacy
from dpnmt.training import run_dir as run_dir_lib
from dpnmt.training.checkpoint_recovery import CheckpointUnreadable
from dpnmt.training.run_dir import CHECKPOINT_DIR, PRIVATE_DIR, RunDir
from dpnmt.training.state import BestScore, LoopState, Validation

# What orbax writes that says where and when a checkpoint was made.
_COMMIT_FILE = "commit_success.txt"
_STEP_METADATA_FILE = "_CHECKPOINT_METADATA"
_TIMESTAMP_FIELDS = ("init_timestamp_nsecs", "commit_timestamp_nsecs")
# Without OCDBT, orbax still tries to merge OCDBT files at each save and warns.
_NO_OCDBT_WARNING = "Skipping merge of OCDBT checkpoints"


def make_manager(workdir: str, *, max_to_keep: int = 2) -> ocp.CheckpointManager:
    """A CheckpointManager over `workdir/checkpoints` with items `state` and `meta`."""
    directory = os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR))
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
    handlers = {  # Zarr arrays, not OCDBT (its manifests hold a commit time).
        "state": ocp.StandardCheckpointHandler(use_ocdbt=False),
        "meta": ocp.JsonCheckpointHandler(),
    }
    return ocp.CheckpointManager(directory, options=options, item_handlers=handlers)


class _DropNoOcdbtWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _NO_OCDBT_WARNING not in record.getMessage()


def save(
    manager: ocp.CheckpointManager, step: int, state: Any, meta: dict, *, timeless: bool = False
) -> None:
    """Saves `state` (pytree of arrays) and `meta` (JSON-able dict) at `step`; waits.

    Then (process 0) rewrites orbax's records of the local folder, and with
    `timeless` (a private run) removes every time from `checkpoints/`.
    """
    quiet, absl_logger = _DropNoOcdbtWarning(), logging.getLogger("absl")
    absl_logger.addFilter(quiet)  # Also filters orbax's finalize thread, joined below.
    try:
        manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
            ),
            force=True,
        )
        manager.wait_until_finished()
    finally:
        absl_logger.removeFilter(quiet)
    fault_points.reached(fault_points.CHECKPOINT_COMMITTED, step)
    if distributed.is_primary():  # Every process has committed: orbax synced them.
        scrub(str(manager.directory), step, timeless=timeless)


def scrub_kept(manager: ocp.CheckpointManager, *, timeless: bool) -> None:
    """`scrub`s every kept checkpoint: at each start, for a session killed before its scrub.

    Orbax publishes a step by renaming it into place and only then can it be
    scrubbed: a kill in between leaves a local path and, in a private run, its
    times (a finished run's last checkpoint would keep them for good). Every
    start (process 0, the workdir locked) scrubs them before anything else.

    Raises:
      CheckpointUnreadable: a step's orbax metadata is garbled (orbax reads past
        it, its times kept): the caller's `checkpoint_recovery.read_newest` sets
        it aside where going back is exact, else refuses.
    """
    for step in manager.all_steps():
        try:
            scrub(str(manager.directory), step, timeless=timeless)
        except (ValueError, AttributeError) as error:  # JSON garbled, or not an object.
            raise CheckpointUnreadable(_workdir(manager), step, error) from error


def scrub(directory: str, step: int, *, timeless: bool) -> None:
    """Makes the checkpoint at `step` publishable: no local path; with `timeless`, no time.

    Args:
      directory: the `checkpoints/` folder (absolute, as orbax has it).
      step: the checkpoint just committed.
      timeless: empty orbax's init/commit times of that step and set the
        modification time of every file and folder under `directory` to 0.
    """
    workdir = os.path.dirname(os.path.normpath(directory))
    step_dir = os.path.join(directory, str(step))
    for folder, _, files in os.walk(step_dir):
        if _COMMIT_FILE in files:  # Orbax checks that it exists, not what it says.
            name = os.path.relpath(folder, workdir)
            text = f"Checkpoint commit was successful to {name}"
            atomic_file.write_atomic(os.path.join(folder, _COMMIT_FILE), text, private=True)
    if not timeless:
        return
    path = os.path.join(step_dir, _STEP_METADATA_FILE)
    if os.path.exists(path):
        with open(path) as f:
            metadata = json.load(f)
        metadata.update(dict.fromkeys(_TIMESTAMP_FIELDS))  # None: orbax reads it as unknown.
        atomic_file.write_atomic(path, json.dumps(metadata), private=True)  # Old or new.
    for folder, dirs, files in os.walk(directory):
        for name in dirs + files:
            os.utime(os.path.join(folder, name), (0, 0), follow_symlinks=False)
    os.utime(directory, (0, 0))


def restore_latest(manager: ocp.CheckpointManager, like: Any) -> tuple[int, Any, dict] | None:
    """(step, state, meta) of the latest checkpoint, or None if there is none.

    Args:
      manager: from `make_manager`.
      like: a pytree with the structure, shapes and dtypes of the saved state.
    """
    step = manager.latest_step()
    if step is None:
        return None
    args = ocp.args.Composite(state=ocp.args.StandardRestore(like), meta=ocp.args.JsonRestore())
    restored = _read(manager, step, lambda: manager.restore(step, args=args))
    return step, restored["state"], restored["meta"]


def _read(manager: ocp.CheckpointManager, step: int, read):
    """`read()`, any error it raises as `CheckpointUnreadable` naming the step (one line)."""
    # Orbax logs a failed read's traceback, then raises it; its other reads' futures, failed
    # too, are logged by asyncio ("exception was never retrieved") when collected.
    quiet, loggers = _DropReadErrors(), [logging.getLogger(n) for n in ("absl", "asyncio")]
    for logger in loggers:
        logger.addFilter(quiet)
    try:
        return read()
    except Exception as error:  # noqa: BLE001 - orbax and tensorstore raise many kinds.
        gc.collect()  # Those futures go now, while their records are dropped.
        raise CheckpointUnreadable(_workdir(manager), step, error) from error
    finally:
        for logger in loggers:
            logger.removeFilter(quiet)


class _DropReadErrors(logging.Filter):
    """Drops orbax's error records of a read: the read's own error says it, in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR


def _workdir(manager: ocp.CheckpointManager) -> str:
    return os.path.dirname(os.path.normpath(str(manager.directory)))


def save_state(
    manager: ocp.CheckpointManager,
    run_dir: RunDir,
    state: LoopState,
    *,
    sampler_state: dict,
    run_id: int,
    plan: privacy.PrivacyPlan,
) -> None:
    """Checkpoints `state`; the sampler's state goes to `private/` (process 0 writes it)."""
    if distributed.is_primary():  # Every process holds the same sampler state.
        run_dir.save_sampler_state(state.step, sampler_state)
    meta = {
        "step": state.step,
        "run_id": str(run_id),  # A random nonce, independent of the seed.
        "best": state.best.to_json(),
        "history": state.history_json(),
        "plan": dataclasses.asdict(plan),
        "steps_done": state.step,
        "stopped_early": state.stopped_early,
    }
    save(
        manager,
        state.step,
        arrays_of(state),
        json.loads(run_dir_lib.json_dumps(meta)),
        timeless=plan.private,  # Two kept checkpoints would time the lots between them.
    )


def restore_state(
    manager: ocp.CheckpointManager,
    like: LoopState,
    *,
    noise_seed: int,
    run_id: int,
    run_dir: RunDir,
    plan: privacy.PrivacyPlan,
) -> LoopState:
    """The latest checkpoint's state, refused if it belongs to another run or plan."""
    step = manager.latest_step()
    if step is not None and has_average(manager, step) != (like.average is not None):
        kept = "keeps" if has_average(manager, step) else "does not keep"
        raise ValueError(
            f"The checkpoint at step {step} {kept} a parameter average, unlike this config "
            "(train.ema_decay): resume with the run's own train.ema_decay, or start a new workdir."
        )
    step, arrays, meta = restore_latest(manager, arrays_of(like))
    check_binding(meta, noise_seed, run_id, run_dir.path)
    changed = _plan_changes(meta["plan"], plan)
    if changed:
        raise ValueError(_plan_change_message(changed, run_dir.path))
    return LoopState(
        step=step,
        trainable=arrays["trainable"],
        opt_state=arrays["opt_state"],
        best=BestScore.from_json(meta["best"]),
        history=tuple(Validation.from_json(v) for v in meta["history"]),
        stopped_early=bool(meta.get("stopped_early", False)),
        average=arrays.get(AVERAGE),
    )


def saved_plan(
    manager: ocp.CheckpointManager, noise_seed: int, run_id: int, workdir: str
) -> dict | None:
    """The privacy plan (`PrivacyPlan` fields) in the latest checkpoint's meta; None if none.

    The checkpoint is first checked to belong to this workdir's private records
    (`check_binding`): a foreign checkpoint is refused as such, not as a plan change.
    """
    step = manager.latest_step()
    if step is None:
        return None
    meta = restore_meta(manager, step)
    check_binding(meta, noise_seed, run_id, workdir)
    return meta["plan"]


def restore_meta(manager: ocp.CheckpointManager, step: int) -> dict:
    """The JSON meta of the checkpoint at `step` alone (no arrays read)."""
    args = ocp.args.Composite(meta=ocp.args.JsonRestore())
    meta = _read(manager, step, lambda: manager.restore(step, args=args)["meta"])
    if not isinstance(meta, dict) or "plan" not in meta:
        raise CheckpointUnreadable(_workdir(manager), step, "its metadata holds no privacy plan")
    return meta


# How far a kept σ may be from this code's: the searches agree within their tolerance
# (1e-4 to 1e-3 relative); a wider gap means one calibration is wrong, not newer.
SIGMA_DRIFT = 1e-2


def resumed_plan(
    plan: privacy.PrivacyPlan, saved: dict, target_epsilon: float | None, workdir: str
) -> privacy.PrivacyPlan:
    """The plan a resumed run continues with: the checkpoint's, σ included.

    A run resumed on newer code can calibrate a slightly different σ for the
    same target (the search changed, `core.accounting`); its lots would mix
    two σ while results.json reports one. The checkpoint's σ is kept instead,
    after checking that it still meets the target at the planned T with this
    code's accountant and lies within `SIGMA_DRIFT` of this code's σ. Any other
    difference (N, L, T, C, δ, ...) is refused.

    Args:
      plan: this session's plan (`privacy.plan_privacy`).
      saved: `saved_plan(manager)`, the plan the run started with.
      target_epsilon: `dp.target_epsilon` when σ is calibrated, else None.
      workdir: named in the refusal.

    Raises:
      ValueError: a field other than a calibrated σ differs, the saved σ is
        more than `SIGMA_DRIFT` away, or it no longer meets the target.
    """
    changed = _plan_changes(saved, plan)
    if list(changed) != ["noise_multiplier"] or target_epsilon is None or not plan.private:
        if changed:
            raise ValueError(_plan_change_message(changed, workdir))
        return plan
    kept = dataclasses.replace(plan, noise_multiplier=float(saved["noise_multiplier"]))
    if not abs(kept.noise_multiplier / plan.noise_multiplier - 1) <= SIGMA_DRIFT:
        raise ValueError(
            _plan_change_message(changed, workdir)
            + f" (The two σ for dp.target_epsilon={target_epsilon} are more than "
            f"{SIGMA_DRIFT:.0%} apart: more than the calibration's tolerance.)"
        )
    # As calibrated: a fixed (test-only) seed makes every ε ∞, not σ wrong.
    epsilon = dataclasses.replace(kept, seed_is_secret=True).epsilon_after(kept.num_steps)
    if not epsilon <= target_epsilon:
        raise ValueError(
            f"--workdir={workdir}: the run started with σ={kept.noise_multiplier!r}, whose ε at "
            f"T={kept.num_steps} is {epsilon:.6g} with this code's accountant, above "
            f"dp.target_epsilon={target_epsilon}; finish it with the code that started it, or "
            "start a new workdir."
        )
    logging.info(
        "Resuming with the run's own σ=%r (this code calibrates σ=%r for the same target; "
        "ε at T of the run's σ: %.6g ≤ %g).",
        kept.noise_multiplier,
        plan.noise_multiplier,
        epsilon,
        target_epsilon,
    )
    return kept


def _plan_changes(saved: dict, plan: privacy.PrivacyPlan) -> dict[str, tuple]:
    """{field: (saved, now)} where `plan` differs from the saved plan (a JSON dict).

    Fields an older plan lacks take their defaults (`largest_group` none: saved
    before groups were read, not a change); a field this code does not know is
    a change.
    """
    now = dataclasses.asdict(plan)
    if "largest_group" not in saved:
        now["largest_group"] = None
    known = {k: v for k, v in saved.items() if k in now}
    # Every field of the plan, in order, then the fields this code does not know.
    before = dataclasses.asdict(privacy.PrivacyPlan(**known)) | {
        k: v for k, v in saved.items() if k not in now
    }
    absent = "(absent)"
    return {k: (v, now.get(k, absent)) for k, v in before.items() if v != now.get(k, absent)}


def _plan_change_message(changed: dict[str, tuple], workdir: str) -> str:
    differ = "; ".join(f"{k}: checkpoint {a!r}, now {b!r}" for k, (a, b) in changed.items())
    return (
        f"--workdir={workdir}: this session's privacy plan differs from the checkpoint's "
        f"({differ}; changed training data, or library versions?): resume with the data and "
        "code that started the run, or start a new workdir."
    )


AVERAGE = "average"  # The checkpoint's item for `LoopState.average` (train.ema_decay > 0).


def has_average(manager: ocp.CheckpointManager, step: int) -> bool:
    """Whether the checkpoint at `step` holds a parameter average (`AVERAGE`)."""
    return AVERAGE in _read(manager, step, lambda: manager.item_metadata(step)["state"].keys())


def arrays_of(state: LoopState) -> dict:
    """A checkpoint's arrays: trainable params, optimizer state, and the average if kept."""
    arrays = {"trainable": state.trainable, "opt_state": state.opt_state}
    if state.average is not None:
        arrays[AVERAGE] = state.average
    return arrays


def legacy_seed_hash(seed: int) -> str:
    """The unsalted seed hash that checkpoints written before the run id published."""
    return hashlib.sha256(f"dpnmt-noise-seed:{seed}".encode()).hexdigest()


def check_binding(meta: dict, noise_seed: int, run_id: int, workdir: str) -> None:
    """Refuses a checkpoint that belongs to another workdir's private records."""
    if "run_id" in meta:
        if int(meta["run_id"]) != run_id:
            raise ValueError(
                f"The checkpoint's run id differs from {workdir}/{PRIVATE_DIR}/run_id: the "
                "checkpoints come from another run; use that run's workdir or a new one."
            )
        return
    if meta.get("noise_seed_sha256") != legacy_seed_hash(noise_seed):
        raise ValueError(
            "The checkpoint's noise seed differs from the workdir's private record "
            f"({workdir}/{PRIVATE_DIR}/noise_seed); use that run's workdir or a new one."
        )
    logging.warning(
        "%s's older checkpoints hold a hash of the noise seed in their published metadata "
        "(an old format): new checkpoints do not; delete the old ones before publishing.",
        workdir,
    )
