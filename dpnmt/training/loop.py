"""DP-SGD training of a seq2seq model: the library behind `python -m dpnmt.train`.

One step = one lot. The lot source (Poisson or shuffled, from `dpnmt.bridge`)
yields the lot's examples; they are split into fixed-shape masked micro-batches,
each contributes its sum of clipped per-example gradients to an accumulator
(`dpnmt.core`), and the lot's update adds Gaussian noise once and divides by
the fixed expected lot size L. σ, q = L/N and T come from one `PrivacyPlan`,
which the sampler, the step and the accountant all read. The pieces are built
by `dpnmt.training.setup.build_run`; this module runs the lots, evaluates,
checkpoints a `LoopState` and writes results.json.
"""

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from dpnmt import bridge, config_lib, core, distributed, models
from dpnmt.evaluation.evaluator import Evaluator
from dpnmt.training import checkpointing, steps
from dpnmt.training.checkpointing import LoopState
from dpnmt.training.metrics import MIN_RATE_WINDOW_LOTS, MetricsWriter, RateWindow, log_progress
from dpnmt.training.privacy_report import privacy_report, total_epsilon_after
from dpnmt.training.profile import PhaseTimer, format_table
from dpnmt.training.run_dir import PREPROCESSING_FILE, PRIVATE_DIR, derived_seed, json_dumps
from dpnmt.training.setup import RunPieces, build_run


def train_and_evaluate(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    stop_after_steps: int | None = None,
    corpus_transform: Callable[[Any], Any] | None = None,
) -> dict:
    """Trains (resuming from `workdir` if it holds a checkpoint), evaluates, reports.

    Args:
      config: the resolved experiment config (see `dpnmt.config_lib`).
      workdir: output folder: config.json, tokenizer, checkpoints, results.json.
      stop_after_steps: end this session after this step (checkpointed), as if
        interrupted; rerunning resumes. None trains to the end.
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
    """
    timer = PhaseTimer(enabled=config.train.profile)
    run = build_run(config, workdir, corpus_transform=corpus_transform, timer=timer)
    plan = run.plan
    # Parameters and optimizer state live replicated on the data mesh.
    replicated = bridge.replicated_sharding(run.mesh)
    trainable, frozen, opt_state = jax.device_put(
        (run.trainable, run.frozen, run.opt_state), replicated
    )
    state = LoopState.initial(trainable, opt_state)
    if run.resuming:
        state = checkpointing.restore_state(
            run.manager,
            state,
            noise_seed=run.noise_seed,
            run_id=run.run_id,
            run_dir=run.run_dir,
            plan=plan,
        )
        trainable, opt_state = jax.device_put((state.trainable, state.opt_state), replicated)
        state = dataclasses.replace(state, trainable=trainable, opt_state=opt_state)
        run.lots.load_state_dict(run.run_dir.load_sampler_state(state.step))
        logging.info("Resumed from step %d.", state.step)

    noise_base = core.key_from_seed(derived_seed(run.noise_seed, "noise"))
    # Dropout keys are secret too: an example's key follows its row position in
    # the lot, and adding an example shifts the others' rows. With public keys
    # that would change the other examples' (known) dropout masks, moving the
    # clipped sum by more than C; with secret keys the others' masks stay iid.
    dropout_base = core.key_from_seed(derived_seed(run.noise_seed, "dropout"))
    secure_lots = bool(config.dp.secure_rng and plan.private)
    if secure_lots:
        # Fresh secure lots after a resume: never pair them with replayed keys.
        session = run.run_dir.count_session()
        noise_base = jax.random.fold_in(noise_base, session)
        dropout_base = jax.random.fold_in(dropout_base, session)
    # Every process evaluates on its own devices (identical results, no
    # cross-process traffic); process 0 alone writes them.
    local_mesh = distributed.local_mesh()
    evaluator = Evaluator(
        config,
        run.model,
        run.model_config,
        run.tokenizer,
        run.tokenized,
        run.corpus,
        steps.make_eval_loss(run.eval_loss_fn or run.loss_fn, local_mesh),
        local_mesh,
        timer=timer,
    )
    writer = MetricsWriter(workdir) if distributed.is_primary() else distributed.NullWriter()
    eval_every = config_lib.eval_every_steps(config, plan.num_steps)
    if state.step == 0 and eval_every:
        with timer.phase("evaluation"):
            metrics = evaluator.validation_loss(models.merge_params(state.trainable, frozen))
        metrics.update(step=0, epsilon=plan.epsilon_after(0))
        state = dataclasses.replace(state, history=[*state.history, metrics])
        writer.write(0, {f"validation/{k}": v for k, v in metrics.items()})
        logging.info("eval before training: %s", metrics)
    start_step = state.step
    started = time.time()
    rates = RateWindow(start_step, started)
    buckets = bridge.resolve_length_buckets(
        config.data.length_buckets,
        config.data.max_source_length,
        config.data.max_target_length,
        lengths_known=hasattr(run.train_examples, "lengths"),
    )
    if buckets is not None:
        with timer.phase("start-up: compile every length bucket"):
            _compile_buckets(run, buckets, replicated, state.trainable, frozen, dropout_base)
    # Host side (sampling, micro-batching, sharding) runs a lot ahead in a thread.
    prefetched = bridge.device_lots(
        run.lots,
        run.mesh,
        config.train.physical_batch_size,
        pad_values=run.train_examples.pad_values,
        rows_from=run.train_examples,
        # Shapes per lot depend on its rows, like the micro-batch count: never logged.
        length_buckets=buckets,
    )
    # On a CPU forced to several devices, one multi-device program at a time:
    # with many queued, a collective once never completed (WORKSPACE.md, CI).
    one_at_a_time = jax.default_backend() == "cpu" and run.mesh.devices.size > 1
    last_stop = (
        plan.num_steps if stop_after_steps is None else min(plan.num_steps, stop_after_steps)
    )
    try:
        while state.step < last_stop and not state.stopped_early:
            with timer.phase("lot preparation (waiting on the prefetcher)"):
                microbatches = next(prefetched)  # Empty for an empty lot: still a step.
            step = state.step
            timer.start("device steps")
            # Placed like the step's output, so add_microbatch compiles once, not twice.
            acc = jax.device_put(core.init_accumulator(state.trainable), replicated)
            loss_sum = jnp.zeros(())
            for index, micro in enumerate(microbatches):
                key = core.dropout_key(dropout_base, step, index)
                acc, micro_loss = run.step_fns.add_microbatch(
                    acc, state.trainable, frozen, micro, key
                )
                if one_at_a_time:
                    jax.block_until_ready(acc)
                loss_sum = loss_sum + micro_loss
            # The lot's mean loss, divided on device by its (private) size.
            train_loss = loss_sum / jnp.maximum(acc.num_examples, 1)
            # At most two lots in flight: wait for the previous lot's update
            # before queueing more. Unbounded asynchronous dispatch queues every
            # lot's programs at once; on a forced multi-device CPU that is where
            # a collective once never completed (WORKSPACE.md, CI).
            jax.block_until_ready(state.trainable)
            # The core's key schedule: lot `step` is noised with
            # noise_key_for_step(noise_base, step), inside the step.
            lot_state = core.TrainState(jnp.int32(step), state.trainable, state.opt_state)
            lot_state = run.step_fns.apply_lot(lot_state, acc, noise_base)
            timer.sync(lot_state.params)  # Profiling only: charge the lot's device time here.
            timer.stop()
            step += 1
            state = dataclasses.replace(
                state, step=step, trainable=lot_state.params, opt_state=lot_state.opt_state
            )
            if step % config.train.log_every_steps == 0 or step == plan.num_steps:
                # A private run's training loss is an un-noised statistic of the lot
                # (0.0 exactly for an empty lot): it is not released.
                loss = None if plan.private else float(train_loss)
                total = total_epsilon_after(plan, step, run.vocabulary, run.pretrained)
                log_progress(
                    writer, plan, step, rates.update(step, time.time()), loss, total_epsilon=total
                )
            evaluate_now = eval_every and step % eval_every == 0
            validated = None
            if evaluate_now and step < plan.num_steps:
                with timer.phase("evaluation"):
                    state, validated = _validate(state, run, evaluator, frozen)
            # A resume redoes the steps after its checkpoint, and may not replay
            # them bit for bit (secure lots are redrawn; length buckets or the
            # device count may differ): scores published from redone steps
            # would be releases the accountant never counted. A private run
            # publishes validation only from a committed checkpoint.
            commit_first = validated is not None and plan.private
            if (
                step % config.train.checkpoint_every_steps == 0
                or step in (plan.num_steps, last_stop)
                or state.stopped_early
                or commit_first
            ):
                with timer.phase("checkpointing"):
                    checkpointing.save_state(
                        run.manager,
                        run.run_dir,
                        state,
                        sampler_state=prefetched.state_dict(),
                        run_id=run.run_id,
                        plan=plan,
                    )
                    if commit_first:
                        run.manager.wait_until_finished()
            if validated is not None:
                _publish_validation(writer, step, validated)
            if state.stopped_early:
                break
    finally:
        prefetched.close()
        with timer.phase("checkpointing"):
            run.manager.wait_until_finished()
        writer.close()

    if state.step < plan.num_steps and not state.stopped_early:
        logging.info(
            "Stopped after step %d of %d as asked; rerun to resume.", state.step, plan.num_steps
        )
        _write_profile(run, timer)
        return {"steps_done": state.step, "finished": False}
    with timer.phase("final evaluation"):
        results = _results(run, state, evaluator, frozen, start_step, time.time() - started)
    if distributed.is_primary():
        run.run_dir.write_results(results)
    _write_profile(run, timer)
    logging.info(
        "Test: %s  Privacy: %s", json_dumps(results["test"]), json_dumps(results["privacy"])
    )
    return results


def _compile_buckets(run: RunPieces, buckets, replicated, trainable, frozen, dropout_base) -> None:
    """Runs the micro-batch step once per bucket shape on padding rows (no data).

    Every shape then compiles before the first lot, so which shapes compiled,
    and when, says nothing about the lots (see `bridge.padding_microbatches`).
    """
    for micro in bridge.padding_microbatches(
        buckets,
        run.train_examples.field_specs(),
        run.config.train.physical_batch_size,
        run.train_examples.pad_values,
    ):
        throwaway = jax.device_put(core.init_accumulator(trainable), replicated)
        out = run.step_fns.add_microbatch(
            throwaway, trainable, frozen, bridge.shard_microbatch(micro, run.mesh), dropout_base
        )
        jax.block_until_ready(out)


def _write_profile(run: RunPieces, timer: PhaseTimer) -> None:
    """Writes the session's profile (`train.profile`): private/ and unlogged if the run is."""
    if not timer.enabled:
        return
    summary = timer.summary()
    timer.close()
    if not distributed.is_primary():
        return
    private = run.plan.private
    table = format_table(summary)
    path = run.run_dir.write_profile({**summary, "table": table}, private=private)
    if private:
        # Step and preparation times depend on the realised lot sizes: not logged.
        logging.info("Profile of this session (private: lot-size dependent) in %s.", path)
    else:
        logging.info("Profile of this session (%s):\n%s", path, table)


def _validate(state: LoopState, run: RunPieces, evaluator, frozen) -> tuple[LoopState, dict]:
    """Validation scores at `state.step`, added to the history; early stopping decided.

    Returns the new state and the scores, which the caller publishes
    (`_publish_validation`) once the state they came from is safe to publish.
    """
    step, plan = state.step, run.plan
    metrics = evaluator.validation(models.merge_params(state.trainable, frozen))
    metrics.update(step=step, epsilon=plan.epsilon_after(step))
    if metrics["bleu"] > state.best["bleu"]:
        best = {"bleu": metrics["bleu"], "step": step, "evals_without_gain": 0}
    else:
        best = {**state.best, "evals_without_gain": state.best["evals_without_gain"] + 1}
    stopped_early = False
    patience = run.config.train.early_stopping_patience
    if patience and best["evals_without_gain"] >= patience:
        logging.info("Early stopping at step %d (best BLEU at step %d).", step, best["step"])
        stopped_early = True
    stopped_early = distributed.agree(stopped_early)
    state = dataclasses.replace(
        state, best=best, history=[*state.history, metrics], stopped_early=stopped_early
    )
    return state, metrics


def _publish_validation(writer, step: int, metrics: dict) -> None:
    """Writes validation scores to metrics.jsonl / TensorBoard and the log."""
    writer.write(step, {f"validation/{k}": v for k, v in metrics.items()})
    logging.info("eval at step %d: %s", step, metrics)


def _results(
    run: RunPieces, state: LoopState, evaluator, frozen, start_step: int, train_seconds: float
) -> dict:
    """results.json (a published format: keys and meanings are fixed)."""
    plan = run.plan
    lots_this_session = state.step - start_step
    timed = lots_this_session >= MIN_RATE_WINDOW_LOTS  # Else no rate is published.
    params = models.merge_params(state.trainable, frozen)
    return {
        "finished": True,
        "validation": evaluator.validation(params),
        "test": evaluator.test(params),
        "privacy": privacy_report(
            plan,
            state.step,
            run.vocabulary,
            validation_is_private=run.validation_is_private,
            pretrained=run.pretrained,
        ).to_json(),
        "history": state.history,
        "stopped_early": state.stopped_early,
        "steps_done": state.step,
        "train_seconds_this_session": train_seconds if timed else None,
        "seconds_per_epoch": (
            train_seconds / lots_this_session * max(plan.steps_per_epoch, 1) if timed else None
        ),
        "timing_note": f"means over this session's {lots_this_session} lots, published only "
        f"over at least {MIN_RATE_WINDOW_LOTS} lots (None: fewer); never per lot",
        "preprocessing": {
            s: dataclasses.asdict(v)
            for s, v in run.split_stats.items()
            if s not in run.private_splits
        }
        | {"train": {"num_kept": plan.dataset_size}},
        "preprocessing_note": "exact counts of public splits; of the private training "
        "split (and of a validation split carved from it) only num_kept = N, assumed "
        f"public; the exact counts stay in {PRIVATE_DIR}/{PREPROCESSING_FILE}. None: not "
        "counted (the train split was tokenized per lot, data.tokenize_train)",
        "validation_is_private": run.validation_is_private,
        "validation_note": (
            "validation pairs were carved from the private training data: their loss and "
            "BLEU (metrics, history, early stopping, this file) are NOT covered by the "
            "guarantee"
            if run.validation_is_private
            else "validation is the corpus's own public split (drives evaluation and "
            "early stopping)"
        ),
    }
