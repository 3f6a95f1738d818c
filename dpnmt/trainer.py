"""DP-SGD training of a seq2seq model: the library behind `python -m dpnmt.train`.

One step = one lot. The lot source (Poisson or shuffled, from `dpnmt.bridge`)
yields the lot's examples; they are split into fixed-shape masked micro-batches,
each contributes its sum of clipped per-example gradients to an accumulator
(`dpnmt.core`), and the lot's update adds Gaussian noise once and divides by
the fixed expected lot size L. σ, q = L/N and T come from one `PrivacyPlan`,
which the sampler, the step and the accountant all read.
"""

import dataclasses
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable
from typing import Any

import datasets
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from dpnmt import (
    bridge,
    checkpointing,
    config_check,
    config_lib,
    core,
    distributed,
    experiment,
    models,
    privacy,
    training,
)
from dpnmt.errors import ConfigError
from dpnmt.training.steps import example_loss, make_optimizer  # noqa: F401 (re-exported)

CONFIG_FILE = "config.json"
PRIVATE_DIR = "private"  # Secret seed and sampler state: never publish this folder.
RESULTS_FILE = "results.json"
PREPROCESSING_FILE = "preprocessing.json"  # In private/: exact counts of private splits.
# Config fields a resumed run may change (config.json records the latest).
NOT_BINDING_CONFIG_FIELDS = config_check.NOT_BINDING_FIELDS
# Rates (lots/s, examples/s, s/epoch) are published only as means over at least
# this many lots: a shorter window could time one lot (how many micro-batches it took).
MIN_RATE_WINDOW_LOTS = 50


def _examples(split, config, pad_id: int) -> bridge.TokenizedExamples:
    return bridge.TokenizedExamples(
        split["input_ids"],
        split["labels"],
        max_source_length=config.data.max_source_length,
        max_target_length=config.data.max_target_length,
        pad_id=pad_id,
    )


def tokenize_splits(config, corpus, tokenizer):
    """Tokenized evaluation splits, the train split's examples, and per-split counts.

    The train split is tokenized up front, or per lot (`data.tokenize_train`):
    then a process tokenizes only the rows it fetches, and the train split's
    truncation counts are None (not counted). Either way the examples, N and
    the lots are the same.

    Returns:
      (DatasetDict of the tokenized splits: all of them, or all but train when
      per lot; the train examples, a torch Dataset; split -> `SplitStats`).
    """
    if not experiment.tokenizes_train_per_lot(config):
        tokenized, stats = experiment.tokenize_corpus(config, corpus, tokenizer)
        return tokenized, _examples(tokenized["train"], config, tokenizer.pad_id), stats.splits
    evaluation_splits = datasets.DatasetDict({k: v for k, v in corpus.items() if k != "train"})
    tokenized, stats = experiment.tokenize_corpus(config, evaluation_splits, tokenizer)
    train, train_stats = experiment.tokenize_train_on_demand(config, corpus["train"], tokenizer)
    logging.info(
        "The train split is tokenized per lot (data.tokenize_train=%s): each process "
        "tokenizes only the rows it feeds; its truncation is not counted "
        "(python -m dpnmt.data.inspect counts it).",
        config.data.tokenize_train,
    )
    examples = bridge.TokenizedOnDemand(
        train.encode,
        len(train),
        max_source_length=config.data.max_source_length,
        max_target_length=config.data.max_target_length,
        pad_id=tokenizer.pad_id,
    )
    return tokenized, examples, {"train": train_stats, **stats.splits}


def check_workdir_config(workdir: str, config: ml_collections.ConfigDict) -> None:
    """Writes the resolved config, or refuses a workdir made by a different one.

    A workdir is bound to its config once it holds a checkpoint; one holding
    only a learnt vocabulary is bound in the fields the vocabulary depends on
    (`config_check.binding_changes`: learning it again would spend privacy
    again). Otherwise a corrected config simply replaces the old one.
    """
    problems = config_check.workdir_problems(workdir, config)
    config_check.raise_problems(problems)
    path = os.path.join(workdir, CONFIG_FILE)
    resolved = json.loads(config.to_json_best_effort())
    try:
        os.makedirs(workdir, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"--workdir={workdir} cannot be created: {error}") from error
    if os.path.exists(path):
        with open(path) as f:
            if json.load(f) == resolved:
                return
    with open(path, "w") as f:
        json.dump(resolved, f, indent=2, sort_keys=True)


ASSUMED_PUBLIC = (
    "dataset_size (N, training examples after preprocessing: q = L/N, σ and T derive from it)",
    "expected_lot_size (L), noise_multiplier (σ), l2_clip (C), steps_planned (T), the config",
    "the validation and test splits, unless validation_is_private",
)


def adjacency(plan: privacy.PrivacyPlan) -> str:
    """Which neighbouring datasets ε is stated for (see `dpnmt.core.accounting`)."""
    if not plan.private:
        return "none (no guarantee)"
    if plan.sampling == privacy.POISSON:
        return "add/remove one training example (Poisson-sampled Gaussian)"
    return (
        "replace one training example by a null example that contributes zero (the "
        "dataset size N is unchanged; each epoch is one Gaussian mechanism on it)"
    )


def privacy_report(
    plan: privacy.PrivacyPlan,
    steps_done: int,
    vocabulary,
    *,
    validation_is_private: bool = False,
) -> dict:
    """The ε the run can defend, by which bound, composed with the vocabulary's.

    The guarantee is ε at the PLANNED T steps, fixed before training: early
    stopping picks the stop step from validation scores, so ε at the realised
    step is chosen adaptively and is reported only as
    `epsilon_at_realised_stop_NOT_A_GUARANTEE` (no privacy filter is used).
    """
    sgd_epsilon = plan.epsilon_after(plan.num_steps)
    report = {
        "private": plan.private,
        "bound": plan.bound,
        "sampling": plan.sampling,
        "adjacency": adjacency(plan),
        "noise_multiplier": plan.noise_multiplier,
        "l2_clip": plan.l2_clip,
        "expected_lot_size": plan.expected_lot_size,
        "dataset_size": plan.dataset_size,
        "sampling_rate": plan.sampling_rate,
        "assumed_public": list(ASSUMED_PUBLIC),
        "steps_done": steps_done,
        "steps_planned": plan.num_steps,
        "dp_sgd_epsilon": sgd_epsilon,
        "dp_sgd_epsilon_is_at": "the planned T steps (steps_planned), fixed before training",
        "dp_sgd_delta": plan.delta,
        "validation_is_private": validation_is_private,
        "vocabulary": {
            "kind": vocabulary.kind,
            "covered_by_guarantee": vocabulary.covered_by_guarantee,
            "epsilon": vocabulary.epsilon,
            "delta": vocabulary.delta,
            "note": vocabulary.note,
        },
    }
    if plan.private and steps_done < plan.num_steps:
        report["epsilon_at_realised_stop_NOT_A_GUARANTEE"] = plan.epsilon_after(steps_done)
    poisson_figure = plan.poisson_figure_not_a_guarantee(plan.num_steps)
    if poisson_figure is not None:
        report["epsilon_if_poisson_NOT_A_GUARANTEE"] = poisson_figure
    vocab_epsilon = vocabulary.epsilon or 0.0
    analytic = (vocabulary.details or {}).get("epsilon_analytic")
    if analytic is not None:  # The classical formula can understate ε above 1.
        vocab_epsilon = max(vocab_epsilon, analytic)
    if plan.private and not plan.seed_is_secret:
        # What the run would claim with a secret seed: for tests to check the accounting.
        as_if_secret = dataclasses.replace(plan, seed_is_secret=True)
        report["epsilon_if_seed_were_secret_NOT_A_GUARANTEE"] = as_if_secret.epsilon_after(
            plan.num_steps
        )
        report["total_epsilon"] = math.inf
        report["composition"] = (
            f"{config_lib.FIXED_SEED_NOTE} (config.{config_lib.FIXED_SEED_SWITCH}: tests only)"
        )
    elif not vocabulary.covered_by_guarantee:
        report["total_epsilon"] = math.inf
        report["composition"] = "vocabulary learnt from private data without DP: no guarantee"
    else:
        report["total_epsilon"] = sgd_epsilon + vocab_epsilon
        report["total_delta"] = plan.delta + (vocabulary.delta or 0.0)
        report["composition"] = "basic composition (ε and δ add) of DP-SGD and the vocabulary"
    return report


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
    config_lib.check_noise_seed(config)  # Before anything is written.
    # Everything checked before a file is written (process 0 alone reads the
    # shared workdir: no race with its own writes below).
    distributed.on_primary(
        lambda: config_check.check_run(
            config, workdir, load_corpus=experiment.load_corpus, corpus_transform=corpus_transform
        ),
        "validating the config",
    )
    distributed.on_primary(
        lambda: check_workdir_config(workdir, config_lib.published_config(config)),
        "checking the workdir's config",
    )
    manager = checkpointing.make_manager(workdir)
    resuming = manager.latest_step() is not None
    if (
        config.dp.enabled
        and config.dp.target_epsilon is None
        and config.dp.noise_multiplier is None
    ):
        raise ValueError("Set dp.target_epsilon or dp.noise_multiplier for a private run.")
    # Process 0 reads or draws the secret seed and broadcasts it (no other
    # process touches private/, and no shared-filesystem race on its creation).
    noise_seed = distributed.broadcast_int(
        distributed.on_primary(
            lambda: _noise_seed(config, workdir, resuming), "reading the secret noise seed"
        )
    )
    # A random nonce (not derived from the seed) binds checkpoints to private/.
    run_id = distributed.broadcast_int(
        distributed.on_primary(lambda: _run_id(workdir), "reading the private run id")
    )

    corpus = experiment.load_corpus(config)
    if corpus_transform is not None:
        corpus = corpus_transform(corpus)

    def tokenizer_and_vocabulary(learn: bool):
        return experiment.build_tokenizer(
            config,
            corpus,
            workdir,
            noise_seed=_derived_seed(noise_seed, "vocabulary"),
            learn=learn,
        )

    # A resumed run reloads its vocabulary, never relearns it; process 0 learns
    # it once and the others load what it saved.
    built = distributed.on_primary(
        lambda: tokenizer_and_vocabulary(not resuming), "building the vocabulary"
    )
    tokenizer, vocabulary = built if built is not None else tokenizer_and_vocabulary(False)
    tokenized, train_examples, split_stats = tokenize_splits(config, corpus, tokenizer)
    validation_is_private = experiment.validation_is_carved_from_train(corpus)
    private_splits = {"train", "validation"} if validation_is_private else {"train"}
    distributed.on_primary(
        lambda: write_json(
            os.path.join(workdir, PRIVATE_DIR, PREPROCESSING_FILE),
            {s: dataclasses.asdict(v) for s, v in split_stats.items()},
        ),
        "writing the private preprocessing counts",
    )
    for split, counts in split_stats.items():
        if split not in private_splits:  # Exact counts of private data stay in private/.
            logging.info("Preprocessing %s: %s", split, counts)
    plan = privacy.plan_privacy(
        config.dp,
        config.train,
        len(train_examples),
        seed_is_secret=not config_lib.fixed_noise_seed(config),
    )
    if not plan.seed_is_secret and plan.private:
        logging.warning(
            "config.%s: the noise seed is fixed, this run has NO privacy guarantee (ε = ∞).",
            config_lib.FIXED_SEED_SWITCH,
        )
    planned = privacy_report(plan, plan.num_steps, vocabulary)
    logging.info(
        "Privacy plan: %s; σ=%.4f, C=%g, L=%d, N=%d, q=%.5f, T=%d steps; planned DP-SGD "
        "ε=%.4g at δ=%g; with the vocabulary (%s) the total is ε=%.4g, δ=%.3g.",
        plan.bound,
        plan.noise_multiplier,
        plan.l2_clip,
        plan.expected_lot_size,
        plan.dataset_size,
        plan.sampling_rate,
        plan.num_steps,
        plan.epsilon_after(plan.num_steps),
        plan.delta,
        vocabulary.kind,
        planned["total_epsilon"],
        planned.get("total_delta", math.nan),
    )

    root = jax.random.key(config.seed)
    model, model_config, params = experiment.build_model(
        config, tokenizer, jax.random.fold_in(root, 0)
    )
    trainable, frozen = models.split_params(params, experiment.trainable_predicate(config))
    tx = training.make_optimizer(config.train, plan.num_steps)
    opt_state = tx.init(trainable)

    def loss_fn(full_params, example, dropout_key):
        return training.example_loss(model, model_config, full_params, example, dropout_key)

    mesh = bridge.make_data_mesh()
    bridge.check_physical_batch_size(config.train.physical_batch_size, mesh)
    step_fns = training.make_lot_step(
        loss_fn,
        tx,
        training.StepPrivacy.from_plan(plan),
        mesh,
        clipping=config.dp.clipping,
        clipping_chunk=config.dp.clipping_chunk,
    )
    # Lot membership must be secret for Poisson amplification: the sampler is
    # seeded from the private run seed, never from the public config.seed.
    # Lots are drawn over indices only (identically on every process); each
    # process then fetches just the rows its devices hold.
    # The samplers take every bit of the 128-bit derived seed (numpy PCG64).
    sampler_seed = _derived_seed(noise_seed, "sampler")
    lot_indices = bridge.IndexOnly(train_examples)
    if plan.sampling == privacy.POISSON:
        lots = bridge.PoissonLots(
            lot_indices,
            plan.expected_lot_size,
            seed=None if config.dp.secure_rng else sampler_seed,
            secure_rng=config.dp.secure_rng,
        )
    else:
        lots = bridge.ShuffledLots(lot_indices, plan.expected_lot_size, seed=sampler_seed)

    # Parameters and optimizer state live replicated on the data mesh.
    replicated = bridge.replicated_sharding(mesh)
    trainable, frozen, opt_state = jax.device_put((trainable, frozen, opt_state), replicated)
    start_step, best = 0, {"bleu": -1.0, "step": 0, "evals_without_gain": 0}
    history, stopped_early = [], False
    if resuming:
        restored = checkpointing.restore_latest(
            manager, {"trainable": trainable, "opt_state": opt_state}
        )
        start_step, state, meta = restored
        _check_checkpoint_binding(meta, noise_seed, run_id, workdir)
        if privacy.PrivacyPlan(**meta["plan"]) != plan:
            raise ValueError(
                f"The resumed run's privacy plan {plan} differs from the checkpoint's "
                f"{meta['plan']} (changed data or library versions?); start a new workdir."
            )
        trainable, opt_state = jax.device_put((state["trainable"], state["opt_state"]), replicated)
        with open(_sampler_path(workdir, start_step)) as f:
            lots.load_state_dict(_sampler_state_from_json(json.load(f)))
        best, history = meta["best"], meta["history"]
        stopped_early = bool(meta.get("stopped_early", False))
        logging.info("Resumed from step %d.", start_step)

    noise_base = core.key_from_seed(_derived_seed(noise_seed, "noise"))
    if config.dp.secure_rng and plan.private:
        # Fresh secure lots after a resume: never pair them with replayed noise keys.
        noise_base = jax.random.fold_in(noise_base, _count_session(workdir))
    dropout_base = jax.random.fold_in(root, 1)
    # Every process evaluates on its own devices (identical results, no
    # cross-process traffic); process 0 alone writes them.
    local_mesh = distributed.local_mesh()
    evaluator = Evaluator(
        config,
        model,
        model_config,
        tokenizer,
        tokenized,
        corpus,
        training.make_eval_loss(loss_fn, local_mesh),
        local_mesh,
    )
    writer = MetricsWriter(workdir) if distributed.is_primary() else distributed.NullWriter()
    if start_step == 0 and config.train.eval_every_steps:
        metrics = evaluator.validation(models.merge_params(trainable, frozen))
        metrics.update(step=0, epsilon=plan.epsilon_after(0))
        history.append(metrics)
        writer.write(0, {f"validation/{k}": v for k, v in metrics.items()})
        logging.info("eval before training: %s", metrics)
    started = time.time()
    rates = RateWindow(start_step, started)
    step = start_step
    # Host side (sampling, micro-batching, sharding) runs a lot ahead in a thread.
    prefetched = bridge.device_lots(
        lots,
        mesh,
        config.train.physical_batch_size,
        pad_values=train_examples.pad_values,
        rows_from=train_examples,
    )
    last_stop = (
        plan.num_steps if stop_after_steps is None else min(plan.num_steps, stop_after_steps)
    )
    try:
        while step < last_stop and not stopped_early:
            microbatches = next(prefetched)  # Empty for an empty lot: still a step.
            # Placed like the step's output, so add_microbatch compiles once, not twice.
            acc = jax.device_put(core.init_accumulator(trainable), replicated)
            loss_sum = jnp.zeros(())
            for index, micro in enumerate(microbatches):
                key = jax.random.fold_in(jax.random.fold_in(dropout_base, step), index)
                acc, micro_loss = step_fns.add_microbatch(acc, trainable, frozen, micro, key)
                loss_sum = loss_sum + micro_loss
            # The lot's mean loss, divided on device by its (private) size.
            train_loss = loss_sum / jnp.maximum(acc.num_examples, 1)
            trainable, opt_state = step_fns.apply_lot(
                trainable, opt_state, acc, core.noise_key_for_step(noise_base, step)
            )
            step += 1
            if step % config.train.log_every_steps == 0 or step == plan.num_steps:
                # A private run's training loss is an un-noised statistic of the lot
                # (0.0 exactly for an empty lot): it is not released.
                loss = None if plan.private else float(train_loss)
                _log_progress(writer, plan, step, rates.update(step, time.time()), loss)
            evaluate_now = (
                config.train.eval_every_steps and step % config.train.eval_every_steps == 0
            )
            if evaluate_now and step < plan.num_steps:
                metrics = evaluator.validation(models.merge_params(trainable, frozen))
                metrics.update(step=step, epsilon=plan.epsilon_after(step))
                history.append(metrics)
                writer.write(step, {f"validation/{k}": v for k, v in metrics.items()})
                logging.info("eval at step %d: %s", step, metrics)
                if metrics["bleu"] > best["bleu"]:
                    best = {"bleu": metrics["bleu"], "step": step, "evals_without_gain": 0}
                else:
                    best["evals_without_gain"] += 1
                patience = config.train.early_stopping_patience
                if patience and best["evals_without_gain"] >= patience:
                    logging.info(
                        "Early stopping at step %d (best BLEU at step %d).", step, best["step"]
                    )
                    stopped_early = True
                stopped_early = distributed.agree(stopped_early)
            if (
                step % config.train.checkpoint_every_steps == 0
                or step in (plan.num_steps, last_stop)
                or stopped_early
            ):
                _save(
                    manager,
                    workdir,
                    step,
                    trainable,
                    opt_state,
                    prefetched,
                    run_id,
                    best,
                    history,
                    plan,
                    stopped_early,
                )
            if stopped_early:
                break
    finally:
        prefetched.close()
        manager.wait_until_finished()
        writer.close()

    if step < plan.num_steps and not stopped_early:
        logging.info("Stopped after step %d of %d as asked; rerun to resume.", step, plan.num_steps)
        return {"steps_done": step, "finished": False}
    train_seconds = time.time() - started
    lots_this_session = step - start_step
    timed = lots_this_session >= MIN_RATE_WINDOW_LOTS  # Else no rate is published.
    params = models.merge_params(trainable, frozen)
    results = {
        "finished": True,
        "validation": evaluator.validation(params),
        "test": evaluator.test(params),
        "privacy": privacy_report(
            plan, step, vocabulary, validation_is_private=validation_is_private
        ),
        "history": history,
        "stopped_early": stopped_early,
        "steps_done": step,
        "train_seconds_this_session": train_seconds if timed else None,
        "seconds_per_epoch": (
            train_seconds / lots_this_session * max(plan.steps_per_epoch, 1) if timed else None
        ),
        "timing_note": f"means over this session's {lots_this_session} lots, published only "
        f"over at least {MIN_RATE_WINDOW_LOTS} lots (None: fewer); never per lot",
        "preprocessing": {
            s: dataclasses.asdict(v) for s, v in split_stats.items() if s not in private_splits
        }
        | {"train": {"num_kept": plan.dataset_size}},
        "preprocessing_note": "exact counts of public splits; of the private training "
        "split (and of a validation split carved from it) only num_kept = N, assumed "
        f"public; the exact counts stay in {PRIVATE_DIR}/{PREPROCESSING_FILE}. None: not "
        "counted (the train split was tokenized per lot, data.tokenize_train)",
        "validation_is_private": validation_is_private,
        "validation_note": (
            "validation pairs were carved from the private training data: their loss and "
            "BLEU (metrics, history, early stopping, this file) are NOT covered by the "
            "guarantee"
            if validation_is_private
            else "validation is the corpus's own public split (drives evaluation and "
            "early stopping)"
        ),
    }
    if distributed.is_primary():
        write_json(os.path.join(workdir, RESULTS_FILE), results)
    logging.info(
        "Test: %s  Privacy: %s",
        json.dumps(results["test"], default=_json_default),
        json.dumps(results["privacy"], default=_json_default),
    )
    return results


class RateWindow:
    """Lots per second, measured only over windows of at least `MIN_RATE_WINDOW_LOTS` lots.

    A rate over a few lots could reveal how many micro-batches one lot took (its
    private size); `update` returns a rate only when a window closes, and the
    same (stale) rate until the next one closes.
    """

    def __init__(self, start_step: int, start_time: float):
        """Opens the first window at `start_step`, `start_time` (seconds)."""
        self._step, self._time = start_step, start_time
        self._rate: float | None = None

    def update(self, step: int, now: float) -> float | None:
        """The last closed window's lots/s (None before the first one closes)."""
        if step - self._step >= MIN_RATE_WINDOW_LOTS:
            self._rate = (step - self._step) / max(now - self._time, 1e-9)
            self._step, self._time = step, now
        return self._rate


def _log_progress(writer, plan, step, lots_per_second: float | None, train_loss: float | None):
    """Logs one progress line and its scalars.

    Rates use the EXPECTED lot size L (realised sizes are private) and come only
    from windows of at least `MIN_RATE_WINDOW_LOTS` lots (`RateWindow`);
    tokens/s is not shown. The training loss is shown for non-private runs only.
    """
    epsilon = plan.epsilon_after(step)
    loss_text = "" if train_loss is None else f"  train loss {train_loss:.4f}"
    rate_text = f"  (rates over >= {MIN_RATE_WINDOW_LOTS} lots only)"
    scalars = {"privacy/epsilon_spent": epsilon}
    if lots_per_second is not None:
        eta = (plan.num_steps - step) / max(lots_per_second, 1e-9)
        rate_text = (
            f"  {lots_per_second:.3f} lots/s  ~{lots_per_second * plan.expected_lot_size:.1f} "
            f"examples/s (L x lots/s, mean over >= {MIN_RATE_WINDOW_LOTS} lots)  ETA {eta:.0f} s"
        )
        scalars["train/lots_per_second"] = lots_per_second
    logging.info(
        "step %d/%d%s%s  ε spent %.4g", step, plan.num_steps, rate_text, loss_text, epsilon
    )
    if train_loss is not None:
        scalars["train/loss"] = train_loss
    writer.write(step, scalars)


def _count_session(workdir: str) -> int:
    """How many sessions this workdir has run (0 for the first), counted in private/."""
    path = os.path.join(workdir, PRIVATE_DIR, "sessions")
    count = int(open(path).read()) if os.path.exists(path) else 0
    with open(path, "w") as f:
        f.write(str(count + 1))
    return count


class MetricsWriter:
    """Scalars to `workdir/metrics.jsonl` and TensorBoard event files in `workdir/tensorboard`."""

    def __init__(self, workdir: str):
        from tensorboardX import SummaryWriter  # Deferred: only the app writes events.

        self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a")  # noqa: SIM115
        self._tensorboard = SummaryWriter(os.path.join(workdir, "tensorboard"))
        # One wall time for every event: per-event times would time the lots
        # between two log steps (see `RateWindow`).
        self._walltime = float(int(time.time()))

    def write(self, step: int, scalars: dict) -> None:
        """Appends one JSON line and one TensorBoard scalar per numeric value."""
        numeric = {k: float(v) for k, v in scalars.items() if isinstance(v, (int, float))}
        self._jsonl.write(json.dumps({"step": step, **numeric}) + "\n")
        self._jsonl.flush()
        for name, value in numeric.items():
            if math.isfinite(value):
                self._tensorboard.add_scalar(name, value, step, walltime=self._walltime)

    def close(self) -> None:
        """Flushes and closes both outputs."""
        self._jsonl.close()
        self._tensorboard.close()


def _derived_seed(seed: int, purpose: str) -> int:
    """A 128-bit seed for `purpose` ("noise", "sampler", "vocabulary") from the run seed."""
    purposes = {"noise": 0, "sampler": 1, "vocabulary": 2}
    words = np.random.SeedSequence([seed, purposes[purpose]]).generate_state(4, np.uint32)
    return sum(int(word) << (32 * i) for i, word in enumerate(words))


def _json_default(value):
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    return str(value)


def strict_json(value):
    """`value` with non-finite floats as strings ("inf"), so files are strict JSON."""
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    if isinstance(value, (float, np.floating)) and not math.isfinite(value):
        return str(float(value))
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    return value


def write_json(path: str, value) -> None:
    """Writes strict JSON (no NaN/Infinity tokens)."""
    with open(path, "w") as f:
        json.dump(strict_json(value), f, indent=2, default=_json_default, allow_nan=False)


def _noise_seed(config, workdir: str, resuming: bool) -> int:
    """The run's secret seed: 128 bits from the OS (or a test's fixed one), in `private/`.

    It derives the noise keys, the Poisson sampler's seed and the vocabulary's
    noise. Anyone who has it can subtract the noise: never publish `private/`.
    Nothing published holds it or anything derived from it.
    """
    path = os.path.join(workdir, PRIVATE_DIR, "noise_seed")
    if os.path.exists(path):
        with open(path) as f:
            seed = int(f.read())
        if config.noise_seed is not None and int(config.noise_seed) != seed:
            raise ValueError(
                f"config.noise_seed differs from the seed in {path}; drop --config.noise_seed "
                "to resume, or use a new --workdir."
            )
        return seed
    if resuming:
        raise ValueError(f"{workdir} has checkpoints but no {path}; cannot resume safely.")
    seed = config.noise_seed if config.noise_seed is not None else core.fresh_seed()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(str(seed))
    return seed


def _run_id(workdir: str) -> int:
    """A random 128-bit nonce in `private/run_id`, drawn once; checkpoints record it.

    It ties a checkpoint to this workdir's private records without publishing
    anything derived from the seed (it is independent of the seed).
    """
    path = os.path.join(workdir, PRIVATE_DIR, "run_id")
    if os.path.exists(path):
        with open(path) as f:
            return int(f.read())
    value = core.fresh_seed()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(str(value))
    return value


def _legacy_seed_hash(seed: int) -> str:
    # Checkpoints written before the run id published this unsalted hash.
    return hashlib.sha256(f"dpnmt-noise-seed:{seed}".encode()).hexdigest()


def _check_checkpoint_binding(meta: dict, noise_seed: int, run_id: int, workdir: str) -> None:
    """Refuses a checkpoint that belongs to another workdir's private records."""
    if "run_id" in meta:
        if int(meta["run_id"]) != run_id:
            raise ValueError(
                f"The checkpoint's run id differs from {workdir}/{PRIVATE_DIR}/run_id: the "
                "checkpoints come from another run; use that run's workdir or a new one."
            )
        return
    if meta.get("noise_seed_sha256") != _legacy_seed_hash(noise_seed):
        raise ValueError(
            "The checkpoint's noise seed differs from the workdir's private record "
            f"({workdir}/{PRIVATE_DIR}/noise_seed); use that run's workdir or a new one."
        )
    logging.warning(
        "%s's older checkpoints hold a hash of the noise seed in their published metadata "
        "(an old format): new checkpoints do not; delete the old ones before publishing.",
        workdir,
    )


def _sampler_path(workdir: str, step: int) -> str:
    # Lot membership is private: the sampler state stays out of the checkpoint.
    return os.path.join(workdir, PRIVATE_DIR, f"sampler_step_{step}.json")


def _sampler_state_to_json(state: dict) -> dict:
    out = dict(state)
    if out.get("generator_state") is not None:
        out["generator_state"] = np.asarray(out["generator_state"], np.uint8).tolist()
    return out


def _sampler_state_from_json(state: dict) -> dict:
    out = dict(state)
    if out.get("generator_state") is not None:
        out["generator_state"] = np.asarray(out["generator_state"], np.uint8)
    return out


def _save(
    manager, workdir, step, trainable, opt_state, lots, run_id, best, history, plan, stopped
) -> None:
    if distributed.is_primary():  # Every process holds the same sampler state.
        with open(_sampler_path(workdir, step), "w") as f:
            json.dump(_sampler_state_to_json(lots.state_dict()), f)
    meta = {
        "step": step,
        "run_id": str(run_id),  # A random nonce, independent of the seed.
        "best": best,
        "history": history,
        "plan": dataclasses.asdict(plan),
        "steps_done": step,
        "stopped_early": stopped,
    }
    checkpointing.save(
        manager,
        step,
        {"trainable": trainable, "opt_state": opt_state},
        json.loads(json.dumps(meta, default=_json_default)),
    )


class Evaluator:
    """Scores a model on a split: teacher-forced loss and BLEU/chrF/BERTScore from generation."""

    def __init__(self, config, model, model_config, tokenizer, tokenized, corpus, eval_loss, mesh):
        """Keeps what scoring needs; `eval_loss` (`training.make_eval_loss`) may be None."""
        self._config = config
        self._model = model
        self._tokenizer = tokenizer
        self._tokenized = tokenized
        self._corpus = corpus
        self._eval_loss = eval_loss
        self._mesh = mesh
        self._gen = models.decoding.from_model_config(
            model_config,
            config.eval.max_new_tokens,
            num_beams=config.eval.num_beams,
            length_penalty=config.eval.length_penalty,
        )
        self._target = experiment.parse_pair(config.data.pair).target

    def _split(self, name: str, limit: int | None):
        split = self._tokenized[name]
        if limit is not None and limit < len(split):
            split = split.select(range(limit))
        originals = self._corpus[name]["translation"]
        references = [originals[i][self._target] for i in split["example_index"]]
        return split, references

    def _loss(self, params, split) -> float:
        examples = _examples(split, self._config, self._tokenizer.pad_id)
        lot = bridge.Lot(
            np.arange(len(examples), dtype=np.int64),
            examples.__getitems__(list(range(len(examples)))).fields,
        )
        total, count = 0.0, 0
        for micro in bridge.to_microbatches(
            lot, self._config.train.physical_batch_size, pad_values=examples.pad_values
        ):
            loss_sum, n = self._eval_loss(params, bridge.shard_microbatch(micro, self._mesh))
            total, count = total + float(loss_sum), count + int(n)
        return total / max(count, 1)

    def translate(self, params, name: str, limit: int | None) -> tuple[list[str], list[str]]:
        """(hypotheses by generation, references) for the first `limit` pairs of a split."""
        from dpnmt import evaluation

        split, references = self._split(name, limit)
        hypotheses = evaluation.translate(
            self._model,
            params,
            self._tokenizer,
            list(split["input_ids"]),
            gen=self._gen,
            batch_size=self._config.eval.batch_size,
            max_source_length=self._config.data.max_source_length,
        )
        return hypotheses, references

    def scores(self, hypotheses, references, *, bertscore: bool) -> dict:
        """SacreBLEU (score, signature), chrF and optionally BERTScore."""
        from dpnmt import evaluation

        kwargs = dict(detokenize=self._config.data.detokenize, target_lang=self._target)
        bleu = evaluation.corpus_bleu(hypotheses, references, **kwargs)
        chrf = evaluation.corpus_chrf(hypotheses, references, **kwargs)
        out = {
            "bleu": bleu["score"],
            "bleu_signature": bleu["signature"],
            "chrf": chrf["score"],
            "num_sentences": len(hypotheses),
        }
        if bertscore:
            hyp, ref = hypotheses, references
            if self._config.data.detokenize:
                hyp = evaluation.detokenize_moses(hyp, lang=self._target)
                ref = evaluation.detokenize_moses(ref, lang=self._target)
            out["bertscore"] = evaluation.bertscore(
                hyp, ref, model_type=self._config.eval.bertscore_model, lang=self._target
            )
        return out

    def validation(self, params) -> dict:
        """Validation loss and BLEU on the first `data.max_eval_examples` pairs."""
        params = distributed.to_local(params, self._mesh)
        limit = self._config.data.max_eval_examples
        hypotheses, references = self.translate(params, "validation", limit)
        split, _ = self._split("validation", limit)
        scores = self.scores(hypotheses, references, bertscore=False)
        return {"loss": self._loss(params, split), "bleu": scores["bleu"], "chrf": scores["chrf"]}

    def test(self, params) -> dict:
        """Test-split scores (BERTScore if `eval.bertscore`)."""
        params = distributed.to_local(params, self._mesh)
        hypotheses, references = self.translate(params, "test", self._config.data.max_test_examples)
        return self.scores(hypotheses, references, bertscore=self._config.eval.bertscore)
