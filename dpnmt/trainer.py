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
import optax

from dpnmt import (
    bridge,
    checkpointing,
    config_check,
    core,
    distributed,
    experiment,
    models,
    privacy,
)
from dpnmt.bridge.dataset import INPUT_IDS, INPUT_LENGTH, LABEL_LENGTH, LABELS
from dpnmt.errors import ConfigError

CONFIG_FILE = "config.json"
PRIVATE_DIR = "private"  # Secret seed and sampler state: never publish this folder.
RESULTS_FILE = "results.json"
# Config fields a resumed run may change (config.json records the latest).
NOT_BINDING_CONFIG_FIELDS = config_check.NOT_BINDING_FIELDS
EXAMPLE_FIELDS = (INPUT_IDS, INPUT_LENGTH, LABELS, LABEL_LENGTH)


def example_loss(model, model_config, params, example, dropout_key) -> jax.Array:
    """Token-mean cross-entropy of ONE example (padding tokens ignored).

    Args:
      model: the Flax seq2seq module.
      model_config: its config (decoder input convention).
      params: full parameters.
      example: `input_ids [S]`, `input_length []`, `labels [T]`, `label_length []`.
      dropout_key: this example's own dropout key, or None for no dropout.

    Returns:
      float32 scalar: the mean over the example's own target tokens, so the
      loss never depends on other examples.
    """
    source_length = example[INPUT_IDS].shape[0]
    target_length = example[LABELS].shape[0]
    input_ids = example[INPUT_IDS][None]
    attention_mask = (jnp.arange(source_length) < example[INPUT_LENGTH])[None].astype(jnp.int32)
    target_mask = jnp.arange(target_length) < example[LABEL_LENGTH]
    labels = jnp.where(target_mask, example[LABELS], model_config.pad_token_id)[None]
    decoder_input_ids = models.decoder_inputs(model_config, labels)
    rngs = None if dropout_key is None else {"dropout": dropout_key}
    logits = model.apply(
        {"params": params},
        input_ids,
        attention_mask,
        decoder_input_ids,
        deterministic=dropout_key is None,
        rngs=rngs,
    )[0]
    token_losses = optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), labels[0]
    )
    num_tokens = jnp.maximum(jnp.sum(target_mask), 1)
    return jnp.sum(jnp.where(target_mask, token_losses, 0.0)) / num_tokens


def make_optimizer(train_config, num_steps: int) -> optax.GradientTransformation:
    """The optax optimizer, with linear warm-up and the configured decay."""
    peak, warmup = train_config.learning_rate, min(train_config.warmup_steps, num_steps)
    decay_steps = max(num_steps - warmup, 1)
    if train_config.decay == "constant":
        after = optax.constant_schedule(peak)
    elif train_config.decay == "linear":
        after = optax.linear_schedule(peak, 0.0, decay_steps)
    elif train_config.decay == "cosine":
        after = optax.cosine_decay_schedule(peak, decay_steps)
    else:
        raise ValueError(f"train.decay={train_config.decay!r}: use constant, linear or cosine.")
    schedule = optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), after], [warmup])
    name = train_config.optimizer
    if name == "sgd":
        return optax.sgd(schedule)
    if name == "adam":
        return optax.adam(schedule)
    if name == "adamw":
        return optax.adamw(schedule, weight_decay=train_config.weight_decay)
    if name == "adafactor":
        return optax.adafactor(schedule)
    raise ValueError(f"train.optimizer={name!r}: use sgd, adam, adamw or adafactor.")


@dataclasses.dataclass
class _Steps:
    """The jitted pieces of a step."""

    add_microbatch: Any  # (acc, trainable, frozen, micro, key) -> (acc, loss_sum)
    apply_lot: Any  # (trainable, opt_state, acc, noise_key) -> (trainable, opt_state)
    eval_loss: Any  # (params, micro) -> (loss_sum, count)


def make_steps(
    model, model_config, tx, plan: privacy.PrivacyPlan, clipping="ghost", clipping_chunk=0
) -> _Steps:
    """Builds the jitted micro-batch, lot-update and evaluation functions.

    `clipping` ("ghost" | "vmap") and `clipping_chunk` (rows per sequential
    clipping chunk, 0: the whole micro-batch) are passed to
    `core.private_grad_sum`; they change cost, not the result.
    """

    def add_microbatch(acc, trainable, frozen, micro, key):
        batch = {name: micro[name] for name in EXAMPLE_FIELDS}
        mask = micro[bridge.MASK]

        def loss_fn(params, example, example_key):
            full = models.merge_params(params, frozen)
            return example_loss(model, model_config, full, example, example_key)

        real = jnp.sum(mask != 0).astype(jnp.int32)
        if plan.private:
            grad_sum, _, mean_loss = core.private_grad_sum(
                loss_fn,
                trainable,
                batch,
                mask,
                plan.l2_clip,
                key=key,
                clipping=clipping,
                microbatch_size=clipping_chunk or None,
            )
        else:  # Non-private baseline: plain gradient of the sum of example losses.
            keys = jax.random.split(key, mask.shape[0])

            def summed(params):
                losses = jax.vmap(loss_fn, in_axes=(None, 0, 0))(params, batch, keys)
                return jnp.sum(jnp.where(mask != 0, losses, 0.0))

            loss_sum, grad_sum = jax.value_and_grad(summed)(trainable)
            mean_loss = loss_sum / jnp.maximum(real, 1)
        return core.accumulate(acc, grad_sum, real), mean_loss * real

    def apply_lot(trainable, opt_state, acc, noise_key):
        if plan.private:
            grad = core.noisy_average(
                acc, noise_key, plan.noise_multiplier, plan.l2_clip, plan.expected_lot_size
            )
        else:
            grad = jax.tree.map(lambda g: g / plan.expected_lot_size, acc.grad_sum)
        updates, opt_state = tx.update(grad, opt_state, trainable)
        return optax.apply_updates(trainable, updates), opt_state

    def eval_loss(params, micro):
        batch = {name: micro[name] for name in EXAMPLE_FIELDS}
        losses = jax.vmap(lambda ex: example_loss(model, model_config, params, ex, None))(batch)
        mask = micro[bridge.MASK] != 0
        return jnp.sum(jnp.where(mask, losses, 0.0)), jnp.sum(mask)

    return _Steps(
        add_microbatch=jax.jit(add_microbatch, donate_argnums=0),
        apply_lot=jax.jit(apply_lot, donate_argnums=(0, 1)),
        eval_loss=jax.jit(eval_loss),
    )


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


def privacy_report(plan: privacy.PrivacyPlan, steps_done: int, vocabulary) -> dict:
    """The ε the run can defend, by which bound, composed with the vocabulary's."""
    sgd_epsilon = plan.epsilon_after(steps_done)
    report = {
        "private": plan.private,
        "bound": plan.bound,
        "sampling": plan.sampling,
        "noise_multiplier": plan.noise_multiplier,
        "l2_clip": plan.l2_clip,
        "expected_lot_size": plan.expected_lot_size,
        "dataset_size": plan.dataset_size,
        "sampling_rate": plan.sampling_rate,
        "steps_done": steps_done,
        "steps_planned": plan.num_steps,
        "dp_sgd_epsilon": sgd_epsilon,
        "dp_sgd_delta": plan.delta,
        "vocabulary": {
            "kind": vocabulary.kind,
            "covered_by_guarantee": vocabulary.covered_by_guarantee,
            "epsilon": vocabulary.epsilon,
            "delta": vocabulary.delta,
            "note": vocabulary.note,
        },
    }
    poisson_figure = plan.poisson_figure_not_a_guarantee(steps_done)
    if poisson_figure is not None:
        report["epsilon_if_poisson_NOT_A_GUARANTEE"] = poisson_figure
    vocab_epsilon = vocabulary.epsilon or 0.0
    analytic = (vocabulary.details or {}).get("epsilon_analytic")
    if analytic is not None:  # The classical formula can understate ε above 1.
        vocab_epsilon = max(vocab_epsilon, analytic)
    if not vocabulary.covered_by_guarantee:
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
    # Everything checked before a file is written (process 0 alone reads the
    # shared workdir: no race with its own writes below).
    distributed.on_primary(
        lambda: config_check.check_run(
            config, workdir, load_corpus=experiment.load_corpus, corpus_transform=corpus_transform
        ),
        "validating the config",
    )
    distributed.on_primary(
        lambda: check_workdir_config(workdir, config), "checking the workdir's config"
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
    for split, counts in split_stats.items():
        logging.info("Preprocessing %s: %s", split, counts)
    plan = privacy.plan_privacy(config.dp, config.train, len(train_examples))
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
    tx = make_optimizer(config.train, plan.num_steps)
    opt_state = tx.init(trainable)
    steps = make_steps(model, model_config, tx, plan, config.dp.clipping, config.dp.clipping_chunk)

    mesh = bridge.make_data_mesh()
    bridge.check_physical_batch_size(config.train.physical_batch_size, mesh)
    # Lot membership must be secret for Poisson amplification: the sampler is
    # seeded from the private run seed, never from the public config.seed.
    # Lots are drawn over indices only (identically on every process); each
    # process then fetches just the rows its devices hold.
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
        if meta["noise_seed_sha256"] != _seed_hash(noise_seed):
            raise ValueError(
                "The checkpoint's noise seed differs from the workdir's private record."
            )
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
    evaluator = Evaluator(
        config, model, model_config, tokenizer, tokenized, corpus, steps, distributed.local_mesh()
    )
    writer = MetricsWriter(workdir) if distributed.is_primary() else distributed.NullWriter()
    if start_step == 0 and config.train.eval_every_steps:
        metrics = evaluator.validation(models.merge_params(trainable, frozen))
        metrics.update(step=0, epsilon=0.0)
        history.append(metrics)
        writer.write(0, {f"validation/{k}": v for k, v in metrics.items()})
        logging.info("eval before training: %s", metrics)
    started = time.time()
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
                acc, micro_loss = steps.add_microbatch(acc, trainable, frozen, micro, key)
                loss_sum = loss_sum + micro_loss
            # The lot's mean loss, divided on device by its (private) size.
            train_loss = loss_sum / jnp.maximum(acc.num_examples, 1)
            trainable, opt_state = steps.apply_lot(
                trainable, opt_state, acc, core.noise_key_for_step(noise_base, step)
            )
            step += 1
            if step % config.train.log_every_steps == 0 or step == plan.num_steps:
                # A private run's training loss is an un-noised statistic of the lot
                # (0.0 exactly for an empty lot): it is not released.
                loss = None if plan.private else float(train_loss)
                _log_progress(writer, plan, step, start_step, started, loss)
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
                    noise_seed,
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
    params = models.merge_params(trainable, frozen)
    results = {
        "finished": True,
        "validation": evaluator.validation(params),
        "test": evaluator.test(params),
        "privacy": privacy_report(plan, step, vocabulary),
        "history": history,
        "stopped_early": stopped_early,
        "steps_done": step,
        "train_seconds_this_session": train_seconds,
        "seconds_per_epoch": train_seconds
        / max(step - start_step, 1)
        * max(plan.steps_per_epoch, 1),
        "preprocessing": {s: dataclasses.asdict(v) for s, v in split_stats.items()},
        "preprocessing_note": "exact counts, including the private training split's: "
        "not covered by the privacy guarantee; None: not counted (the train split was "
        "tokenized per lot, data.tokenize_train)",
        "validation_note": "validation pairs drive evaluation and early stopping and are "
        "not protected by the guarantee; carve them from data you may publish",
    }
    if distributed.is_primary():
        write_json(os.path.join(workdir, RESULTS_FILE), results)
    logging.info(
        "Test: %s  Privacy: %s",
        json.dumps(results["test"], default=_json_default),
        json.dumps(results["privacy"], default=_json_default),
    )
    return results


def _log_progress(writer, plan, step, start_step, started, train_loss: float | None):
    """Logs one progress line and its scalars.

    Rates use the EXPECTED lot size L (realised sizes are private); tokens/s is
    not shown for the same reason. The training loss is shown for non-private
    runs only.
    """
    elapsed = time.time() - started
    lots_per_second = (step - start_step) / max(elapsed, 1e-9)
    eta = (plan.num_steps - step) / max(lots_per_second, 1e-9)
    epsilon = plan.epsilon_after(step)
    loss_text = "" if train_loss is None else f"  train loss {train_loss:.4f}"
    logging.info(
        "step %d/%d  %.3f lots/s  ~%.1f examples/s (L x lots/s)%s  ε spent %.4g  ETA %.0f s",
        step,
        plan.num_steps,
        lots_per_second,
        lots_per_second * plan.expected_lot_size,
        loss_text,
        epsilon,
        eta,
    )
    scalars = {"train/lots_per_second": lots_per_second, "privacy/epsilon": epsilon}
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

    def write(self, step: int, scalars: dict) -> None:
        """Appends one JSON line and one TensorBoard scalar per numeric value."""
        numeric = {k: float(v) for k, v in scalars.items() if isinstance(v, (int, float))}
        self._jsonl.write(json.dumps({"step": step, **numeric}) + "\n")
        self._jsonl.flush()
        for name, value in numeric.items():
            if math.isfinite(value):
                self._tensorboard.add_scalar(name, value, step)

    def close(self) -> None:
        """Flushes and closes both outputs."""
        self._jsonl.close()
        self._tensorboard.close()


def _derived_seed(seed: int, purpose: str) -> int:
    """A 63-bit seed for `purpose` ("noise", "sampler", "vocabulary") from the run seed."""
    purposes = {"noise": 0, "sampler": 1, "vocabulary": 2}
    words = np.random.SeedSequence([seed, purposes[purpose]]).generate_state(2, np.uint64)
    return int(words[0] >> np.uint64(1))


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
    """The run's secret seed: from config (tests), else the OS, kept in `workdir/private/`.

    It derives the noise keys, the Poisson sampler's seed and the vocabulary's
    noise. Anyone who has it can subtract the noise: never publish `private/`.
    Checkpoints hold only its hash.
    """
    path = os.path.join(workdir, PRIVATE_DIR, "noise_seed")
    if os.path.exists(path):
        with open(path) as f:
            return int(f.read())
    if resuming:
        raise ValueError(f"{workdir} has checkpoints but no {path}; cannot resume safely.")
    seed = config.noise_seed if config.noise_seed is not None else core.fresh_seed()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(str(seed))
    return seed


def _seed_hash(seed: int) -> str:
    return hashlib.sha256(f"dpnmt-noise-seed:{seed}".encode()).hexdigest()


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
    manager, workdir, step, trainable, opt_state, lots, noise_seed, best, history, plan, stopped
) -> None:
    if distributed.is_primary():  # Every process holds the same sampler state.
        with open(_sampler_path(workdir, step), "w") as f:
            json.dump(_sampler_state_to_json(lots.state_dict()), f)
    meta = {
        "step": step,
        "noise_seed_sha256": _seed_hash(noise_seed),
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

    def __init__(self, config, model, model_config, tokenizer, tokenized, corpus, steps, mesh):
        """Keeps what scoring needs; `steps` (for the loss) may be None."""
        self._config = config
        self._model = model
        self._tokenizer = tokenizer
        self._tokenized = tokenized
        self._corpus = corpus
        self._steps = steps
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
            loss_sum, n = self._steps.eval_loss(params, bridge.shard_microbatch(micro, self._mesh))
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
