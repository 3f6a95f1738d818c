"""DP-SGD training of a seq2seq model: the library behind `python -m dpnmt.train`.

One step = one lot. The lot source (Poisson or shuffled, from `dpnmt.bridge`)
yields the lot's examples; they are split into fixed-shape masked micro-batches,
each contributes its sum of clipped per-example gradients to an accumulator
(`dpnmt.core`), and the lot's update adds Gaussian noise once and divides by
the fixed expected lot size L. σ, q = L/N and T come from one `PrivacyPlan`,
which the sampler, the step and the accountant all read.

`train_and_evaluate` is the driver: `setup.build_run` builds the pieces, a
`lot_runner.LotRunner` runs each lot, and the periodic actions of
`dpnmt.training.actions` (log, validate, checkpoint, profile) follow each lot,
each enforcing its own privacy rules. This module also writes results.json.
"""

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from dpnmt import distributed, models, privacy
from dpnmt.config import RunConfig
from dpnmt.data import text_objective
from dpnmt.evaluation.evaluator import EvalSettings, Evaluator
from dpnmt.training import actions, checkpointing, interruption, steps, workdir_lock
from dpnmt.training.checkpoint_recovery import CheckpointUnreadable, read_newest
from dpnmt.training.lot_runner import LotRunner
from dpnmt.training.metrics import MIN_RATE_WINDOW_LOTS, MetricsWriter
from dpnmt.training.privacy_report import privacy_report
from dpnmt.training.records import RunPieces
from dpnmt.training.run_dir import PREPROCESSING_FILE, PRIVATE_DIR, json_dumps
from dpnmt.training.setup import build_run
from dpnmt.training.state import LoopState


def train_and_evaluate(
    config: RunConfig,
    workdir: str,
    *,
    stop_after_steps: int | None = None,
    corpus_transform: Callable[[Any], Any] | None = None,
) -> dict:
    """Trains (resuming from `workdir` if it holds a checkpoint), evaluates, reports.

    Args:
      config: the resolved experiment config, from `preflight.read_config` or `RunConfig.parse`
        (`RunConfig.of` ignores misspelt fields); checked before anything is written.
      workdir: output folder: config.json, tokenizer, checkpoints, results.json.
      stop_after_steps: end this session after this step (checkpointed; Ctrl-C: after the
        lot in progress, then `interruption.TrainingInterrupted`); None: to the end.
      corpus_transform: `DatasetDict -> DatasetDict` applied to the loaded
        corpus before the tokenizer and the privacy plan are built, so rows it
        adds to train are training examples like any other (in the vocabulary's
        histogram, in N and q). `dpnmt.auditing` adds its canaries this way; a
        resumed run must pass the same transform.

    In a multi-process run (`jax.distributed` initialised, see
    `dpnmt.distributed`) every process calls this with the same config and a
    shared `workdir`; process 0 alone writes files, logs and reports ε.

    Returns:
      The results dict (process 0 also writes it to `workdir/results.json`).

    Raises:
      ConfigError: among the config's problems, another process writes `workdir` (it is
        locked from the checks to the end: `workdir_lock`).
    """
    with workdir_lock.released_at_exit(workdir):
        return _train_and_evaluate(config, workdir, stop_after_steps, corpus_transform)


def _train_and_evaluate(config, workdir, stop_after_steps, corpus_transform) -> dict:
    """`train_and_evaluate`'s body (the workdir is locked in `build_run`)."""
    profile = actions.Profile(config.train)
    timer = profile.timer
    run = build_run(config, workdir, corpus_transform=corpus_transform, timer=timer)
    plan = run.privacy.plan
    lots = LotRunner(run, config.dp, timer)
    state = _resume(run, lots)
    lots.derive_keys()
    evaluator = _evaluator(config, run, timer)
    writer = _metrics_writer(workdir, plan.private, state.step if run.files.resuming else None)
    every = config.eval_every_steps(plan.num_steps)
    validate = actions.Validate(
        config.train, every, run.privacy, evaluator, lots.frozen, writer, timer
    )
    state = validate.before_training(state)
    start_step = state.step
    log = actions.LogProgress(config.train, run.privacy, writer, start_step)
    last_stop = (
        plan.num_steps if stop_after_steps is None else min(plan.num_steps, stop_after_steps)
    )
    source = lots.source(config.data, config.train, state.trainable)
    checkpoint = actions.Checkpoint(config.train, run.files, run.privacy, last_stop, source, timer)
    stop = interruption.StopRequest()  # Ctrl-C: commit this lot's state, then stop.
    try:
        with stop:
            while state.step < last_stop and not state.stopped_early and not stop.stopping:
                state, train_loss = lots.run_lot(state, source)
                log(state.step, train_loss)
                state = validate(state)
                validate.publish(checkpoint(state, commit=validate.waits_on_commit or stop.agree()))
    finally:
        source.close()
        checkpoint.close()
        writer.close()
    stop.raise_if_stopping(state.step, plan.num_steps)

    if state.step < plan.num_steps and not state.stopped_early:
        logging.info(
            "Stopped after step %d of %d as asked; rerun to resume.", state.step, plan.num_steps
        )
        profile.write(run.files, run.privacy)
        return {"steps_done": state.step, "finished": False}
    with timer.phase("final evaluation"):
        params = models.merge_params(state.model, lots.frozen)
        results = _results(run, state, evaluator, params, state.step - start_step, log.timed())
    if distributed.is_primary():
        run.files.run_dir.write_results(results)
    profile.write(run.files, run.privacy)
    # The whole record (2 KB) for --verbosity=1; the app ends with its human summary.
    logging.debug(
        "Test: %s  Privacy: %s", json_dumps(results["test"]), json_dumps(results["privacy"])
    )
    return results


def _resume(run: RunPieces, lots: LotRunner) -> LoopState:
    """The initial state, or the latest checkpoint's (with its sampler state) if resuming."""
    average = run.config.train.ema_decay > 0
    state = lots.place(LoopState.initial(run.model.trainable, run.step.opt_state, average=average))
    if not run.files.resuming:
        return state
    files = run.files

    def read() -> tuple[LoopState, dict]:
        restored = checkpointing.restore_state(
            files.manager,
            state,
            noise_seed=run.secrets.noise_seed,
            run_id=files.run_id,
            run_dir=files.run_dir,
            plan=run.privacy.plan,
        )
        try:
            return restored, files.run_dir.load_sampler_state(restored.step)
        except (OSError, ValueError) as error:  # Missing or cut short: the step is unreadable.
            raise CheckpointUnreadable(files.run_dir.path, restored.step, error) from error

    state, sampler_state = read_newest(files.manager, files.run_dir, read, run.config.dp)
    run.step.lots.load_state_dict(sampler_state)
    logging.info("Resumed from step %d.", state.step)
    return lots.place(state)


def _evaluator(settings: RunConfig, run: RunPieces, timer) -> Evaluator:
    """The run's evaluator, on this process's own devices.

    Every process evaluates (identical results, no cross-process traffic);
    process 0 alone writes them.
    """
    local_mesh = distributed.local_mesh()
    model = run.model
    return Evaluator(
        EvalSettings(settings.eval, settings.data, settings.train.physical_batch_size),
        model.model,
        model.model_config,
        run.data.tokenizer,
        run.data.tokenized,
        run.data.corpus,
        steps.make_eval_loss(model.eval_loss_fn or model.loss_fn, local_mesh),
        local_mesh,
        timer=timer,
    )


def published_train_counts(plan: privacy.PrivacyPlan) -> dict[str, int]:
    """results.json's "preprocessing"/"train": the one count of the private split published.

    N, assumed public (`assumed_public`): the kept pairs (`num_kept`) when one
    example is the unit; N_groups (`num_groups`) when one group is, and then
    not the number of pairs, which is not assumed public (it moves by a whole
    group's size between neighbours).
    """
    if plan.unit == privacy.GROUP:
        return {"num_groups": plan.dataset_size}
    return {"num_kept": plan.dataset_size}


def objective_json(data) -> dict:
    """results.json's "objective" (pre-training runs only): what an example and the unit are."""
    if data.objective == "translation":
        return {}
    return {
        "objective": {
            "name": data.objective,
            "language": data.text_language,
            "unit": "one text (a line of data.objective_language): ε is stated for adding or "
            "removing one text; N counts the non-empty texts of that language (empty "
            "lines are dropped before sampling, decided from the text alone)",
        }
    }


def _metrics_writer(workdir: str, private: bool, resumed_step: int | None):
    """Process 0 writes metrics.jsonl and TensorBoard events; the other processes nothing."""
    if not distributed.is_primary():
        return distributed.NullWriter()
    return MetricsWriter(workdir, private=private, resumed_step=resumed_step)


def _results(
    run: RunPieces,
    state: LoopState,
    evaluator,
    params,
    lots_this_session: int,
    timed_windows: tuple[int, float],
) -> dict:
    """results.json (a published format: keys and meanings are fixed).

    `timed_windows`: (lots, seconds) of the session's closed rate windows, the
    only timing published (`metrics.RateWindow.closed`).
    """
    plan, record = run.privacy.plan, run.privacy
    timed_lots, train_seconds = timed_windows
    timed = timed_lots >= MIN_RATE_WINDOW_LOTS  # Else no rate is published.
    return {
        "finished": True,
        "validation": evaluator.validation(params),
        "test": evaluator.test(params),
        "privacy": privacy_report(
            plan,
            state.step,
            record.vocabulary,
            validation_is_private=record.validation_is_private,
            pretrained=record.pretrained,
            example=text_objective.example_unit(run.config.data),
        ).to_json(),
        **objective_json(run.config.data),
        "history": state.history_json(),
        "stopped_early": state.stopped_early,
        "steps_done": state.step,
        "train_seconds_this_session": train_seconds if timed else None,
        "seconds_per_epoch": (train_seconds / timed_lots * plan.lots_per_epoch if timed else None),
        "timing_note": f"means over the first {timed_lots} of this session's "
        f"{lots_this_session} lots: whole windows of at least {MIN_RATE_WINDOW_LOTS} lots, "
        "those of metrics.jsonl's lots/s (None: no window closed); never per lot, and never "
        "the lots after the last window",
        "preprocessing": {
            s: dataclasses.asdict(v)
            for s, v in run.data.split_stats.items()
            if s not in record.private_splits
        }
        | {"train": published_train_counts(plan)},
        "preprocessing_note": "exact counts of public splits; of the private training "
        "split (and of a validation split carved from it) only N, assumed public: num_kept "
        "(pairs) for dp.unit=example, num_groups (N_groups; its number of pairs is not "
        f"published) for dp.unit=group; the exact counts stay in {PRIVATE_DIR}/"
        f"{PREPROCESSING_FILE}. None: not counted (the train split was tokenized per lot, "
        "data.tokenize_train)",
        "validation_is_private": record.validation_is_private,
        "validation_note": (
            "validation pairs were carved from the private training data: their loss and "
            "BLEU (metrics, history, early stopping, this file) are NOT covered by the "
            "guarantee"
            if record.validation_is_private
            else "validation is the corpus's own public split (drives evaluation and "
            "early stopping)"
        ),
    }
