"""Builds a training run's pieces in order, for the loop to consume.

`build_run` reads top to bottom: checks and the run directory (config
binding, secret seed, run id) -> corpus -> vocabulary -> tokenized splits ->
privacy plan -> model and optimizer -> the DP lot step -> the lot sampler. It
returns a `RunPieces` record (`dpnmt.training.records`); `dpnmt.training.loop`
trains and evaluates it.
"""

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import datasets
import jax

from dpnmt import bridge, config_lib, core, distributed, privacy
from dpnmt.config import RunConfig, lot_size
from dpnmt.data import checks as data_checks
from dpnmt.data import text_objective
from dpnmt.errors import ConfigError
from dpnmt.evaluation.evaluator import tokenized_examples
from dpnmt.training import (
    checkpoint_recovery,
    checkpointing,
    pieces,
    preflight,
    pretrained_privacy,
    steps,
    workdir_lock,
)
from dpnmt.training.privacy_report import PretrainedClaim, privacy_report
from dpnmt.training.profile import PhaseTimer
from dpnmt.training.records import (
    RunData,
    RunFiles,
    RunModel,
    RunPieces,
    RunPrivacy,
    RunSecrets,
    RunStep,
)
from dpnmt.training.run_dir import PREPROCESSING_FILE, RunDir, derived_seed


def tokenize_splits(run: RunConfig, corpus, tokenizer, objective=None):
    """Tokenized evaluation splits, the train split's examples, and per-split counts.

    The train split is tokenized up front, or per lot (`data.tokenize_train`):
    then a process tokenizes only the rows it fetches, and the train split's
    truncation counts are None (not counted). Either way the examples, N and
    the lots are the same.

    Returns:
      (DatasetDict of the tokenized splits: all of them, or all but train when
      per lot; the train examples, a torch Dataset; split -> `SplitStats`).
      `objective`: the run's pre-training objective (`pieces.make_objective`), or None.
    """
    if not pieces.tokenizes_train_per_lot(run.data):
        tokenized, stats = pieces.tokenize_corpus(run, corpus, tokenizer, objective)
        examples = tokenized_examples(tokenized["train"], run.data, tokenizer.pad_id)
        return tokenized, examples, stats.splits
    evaluation_splits = datasets.DatasetDict({k: v for k, v in corpus.items() if k != "train"})
    tokenized, stats = pieces.tokenize_corpus(run, evaluation_splits, tokenizer, objective)
    train, train_stats = pieces.tokenize_train_on_demand(run, corpus["train"], tokenizer, objective)
    logging.info(
        "The train split is tokenized per lot (data.tokenize_train=%s): each process "
        "tokenizes only the rows it feeds; its truncation is not counted "
        "(python -m dpnmt.data.inspect counts it).",
        run.data.tokenize_train,
    )
    examples = bridge.TokenizedOnDemand(
        train.encode,
        len(train),
        max_source_length=run.data.max_source_length,
        max_target_length=run.data.max_target_length,
        pad_id=tokenizer.pad_id,
    )
    return tokenized, examples, {"train": train_stats, **stats.splits}


def _check_secure_noise(plan: privacy.PrivacyPlan, trainable) -> None:
    """dp.noise_mode=secure: refuses a σ and size its int32 grid cannot hold, before any step."""
    size = sum(leaf.size for leaf in jax.tree_util.tree_leaves(trainable))
    stddev = plan.noise_multiplier * plan.l2_clip
    try:
        grid = core.secure_noise.secure_grid(size, stddev, plan.l2_clip)
    except ValueError as error:
        raise ConfigError(f"dp.noise_mode=secure: {error}") from error
    logging.info(
        "Secure noise: grid %g, integer scale %d, noise stddev %g (σC = %g); sums beyond ±%g "
        "per coordinate saturate.",
        grid.grid,
        grid.integer_scale,
        grid.stddev,
        stddev,
        grid.signal_limit,
    )


def _building(run: RunConfig) -> str:
    """How the model's parameters come about, for the progress log."""
    if run.model.name_or_path is None:
        return "Initialising the model from scratch (compiling its init program)"
    return "Loading the pretrained model"


def check_sampler_matches_plan(lots, plan: privacy.PrivacyPlan) -> None:
    """The sampler draws with the plan's q (the plan is the one source of q, σ and T).

    The sampler computes q = L / N from the rows (or groups) it holds; the
    accountant used the plan's. Were they to differ (e.g. N_groups counted
    differently), ε would be for another mechanism than the one that ran.

    Raises:
      RuntimeError: the two rates differ (a dpnmt bug: report it).
    """
    if plan.private and lots.sampling_rate != plan.sampling_rate:
        raise RuntimeError(
            f"the lot sampler's q={lots.sampling_rate!r} differs from the privacy plan's "
            f"q={plan.sampling_rate!r} (N={plan.dataset_size}, unit={plan.unit}): the "
            "accountant's ε would not be for the lots drawn. This is a dpnmt bug; please report it."
        )


def _log_plan(
    plan: privacy.PrivacyPlan, vocabulary, pretrained: PretrainedClaim | None, example: str
) -> None:
    planned = privacy_report(
        plan, plan.num_steps, vocabulary, pretrained=pretrained, example=example
    )
    if pretrained is not None:
        logging.info("Pretrained model: %s.", pretrained.note)
    if planned.group_privacy is not None:
        logging.warning("Group privacy: %s", planned.group_privacy.note)
    if planned.privacy_unit is not None:
        logging.info("Privacy unit: %s", planned.privacy_unit.note)
    counts = (
        f"L={plan.expected_lot_size} groups, N_groups={plan.dataset_size}, k={plan.group_cap}"
        if plan.unit == privacy.GROUP
        else f"L={plan.expected_lot_size}, N={plan.dataset_size}"
    )
    logging.info(
        "Privacy plan: %s; σ=%.4f, C=%g, %s, q=%.5f, T=%d steps; planned DP-SGD "
        "ε=%.4g at δ=%g; with the vocabulary (%s)%s the total is ε=%.4g, δ=%.3g.",
        plan.bound,
        plan.noise_multiplier,
        plan.l2_clip,
        counts,
        plan.sampling_rate,
        plan.num_steps,
        plan.epsilon_after(plan.num_steps),
        plan.delta,
        vocabulary.kind,
        _pretrained_words(pretrained),
        planned.total_epsilon,
        planned.total_delta if planned.total_delta is not None else math.nan,
    )


def _pretrained_words(pretrained) -> str:
    if pretrained is not None and pretrained.composed:
        return " and the pretrained export"
    if pretrained is not None and pretrained.parallel:
        return ", the larger with the disjoint pretrained export's (parallel),"
    return ""


def build_run(
    run: RunConfig,
    workdir: str,
    *,
    corpus_transform: Callable[[Any], Any] | None = None,
    timer: PhaseTimer | None = None,
) -> RunPieces:
    """Checks the config, prepares the workdir and builds the run's pieces in order.

    Args:
      run: the resolved experiment config (`preflight.read_config`; checked here).
      workdir: the run's folder.
      corpus_transform: `DatasetDict -> DatasetDict` applied to the loaded
        corpus before the vocabulary and the privacy plan (see `train_and_evaluate`).
      timer: charges each piece's time to a "start-up: ..." phase (`train.profile`).

    Returns:
      The `RunPieces` of this session (fresh or resuming).
    """
    timer = timer or PhaseTimer(enabled=False)
    run_dir = RunDir(workdir)
    with timer.phase("start-up: checks, workdir"):
        # 1. Checks, before a file is written (process 0 alone reads the shared
        # workdir: no race with its own writes below).
        config_lib.check_noise_seed(run)
        distributed.on_primary(
            lambda: preflight.check_run(
                run, workdir, load_corpus=pieces.load_corpus, corpus_transform=corpus_transform
            ),
            "validating the config",
        )
        # One writer per workdir, from here on (released when `train_and_evaluate` ends).
        distributed.on_primary(
            lambda: workdir_lock.acquire(workdir, workdir_lock.this_command()),
            "locking the workdir",
        )
        distributed.on_primary(
            lambda: run_dir.bind_config(run),
            "checking the workdir's config",
        )
        manager = checkpointing.make_manager(workdir)
        distributed.on_primary(  # A session killed between a commit and its scrub.
            lambda: checkpoint_recovery.read_newest(
                manager,
                run_dir,
                lambda: checkpointing.scrub_kept(manager, timeless=run.dp.enabled),
                run.dp,
            ),
            "scrubbing the kept checkpoints",
        )
        resuming = manager.latest_step() is not None
        if not resuming:  # Checkpoints deleted: never a silent second run from lot 1.
            distributed.on_primary(
                lambda: checkpoint_recovery.check_fresh_start(run_dir, run.dp),
                "checking the workdir's private records",
            )
        if run.dp.enabled and run.dp.target_epsilon is None and run.dp.noise_multiplier is None:
            raise ValueError("Set dp.target_epsilon or dp.noise_multiplier for a private run.")
        # 2. Private records. Process 0 reads or draws the secret seed and
        # broadcasts it (no other process touches private/, and no shared-filesystem
        # race on its creation). A random nonce (not derived from the seed) binds
        # checkpoints to private/.
        noise_seed = distributed.broadcast_int(
            distributed.on_primary(
                lambda: run_dir.noise_seed(run, resuming), "reading the secret noise seed"
            )
        )
        run_id = distributed.broadcast_int(
            distributed.on_primary(run_dir.run_id, "reading the private run id")
        )

    # 3. Corpus.
    with timer.phase("start-up: corpus"):
        corpus = pieces.load_corpus(run.data)
        if corpus_transform is not None:
            corpus = corpus_transform(corpus)

    # 4. Vocabulary. A resumed run reloads it, never relearns it; process 0
    # learns it once and the others load what it saved.
    def tokenizer_and_vocabulary(learn: bool):
        return pieces.build_tokenizer(
            run,
            corpus,
            workdir,
            noise_seed=derived_seed(noise_seed, "vocabulary"),
            learn=learn,
        )

    with timer.phase("start-up: vocabulary"):
        built = distributed.on_primary(
            lambda: tokenizer_and_vocabulary(not resuming), "building the vocabulary"
        )
        tokenizer, vocabulary = built if built is not None else tokenizer_and_vocabulary(False)

    # 5. Tokenized splits; exact counts of private splits stay in private/.
    with timer.phase("start-up: tokenization"):
        # A pre-training objective's draws: public, from data.objective_seed (text_objective).
        objective = pieces.make_objective(run.data, tokenizer)
        tokenized, train_examples, split_stats = tokenize_splits(run, corpus, tokenizer, objective)
    validation_is_private = pieces.validation_is_carved_from_train(corpus)
    private_splits = {"train", "validation"} if validation_is_private else {"train"}
    distributed.on_primary(
        lambda: run_dir.write_private_json(
            PREPROCESSING_FILE, {s: dataclasses.asdict(v) for s, v in split_stats.items()}
        ),
        "writing the private preprocessing counts",
    )
    for split, counts in split_stats.items():
        if split not in private_splits:
            logging.info("Preprocessing %s: %s", split, counts)

    # 6. Privacy plan: σ, q = L/N and T, read by the sampler, the step and the accountant.
    with timer.phase("start-up: privacy plan"):
        train_groups = None  # dp.unit="group": each train example's group, in order.
        if run.dp.unit == privacy.GROUP:
            train_groups = data_checks.kept_groups(corpus["train"], run.data.pair)
            if train_groups is not None and len(train_groups) != len(train_examples):
                raise RuntimeError("the kept pairs' groups do not line up with the examples.")
        plan = privacy.plan_privacy(
            run.dp,
            run.train,
            len(train_examples),
            seed_is_secret=not run.fixed_noise_seed,
            largest_group=pieces.largest_group(corpus),
            num_groups=None if train_groups is None else len(set(train_groups)),
        )
        if resuming:  # The run's own σ, before the step is built with it.
            saved = checkpoint_recovery.read_newest(  # An unreadable newest one: one line.
                manager,
                run_dir,
                lambda: checkpointing.saved_plan(manager, noise_seed, run_id, workdir),
                run.dp,
            )
            plan = checkpointing.resumed_plan(
                plan,
                saved,
                run.dp.target_epsilon if run.dp.calibrates_noise else None,
                workdir,
            )
    lot_field = lot_size(run.dp, run.train)[1]
    if plan.unit == privacy.GROUP and lot_field == "train.expected_lot_size":
        logging.warning(
            "dp.group_lot_size is unset: train.expected_lot_size=%d is read as groups per lot "
            "(L_groups, as runs before the field did); set dp.group_lot_size to say so.",
            plan.expected_lot_size,
        )
    elif plan.unit == privacy.GROUP and run.train.expected_lot_size != plan.expected_lot_size:
        logging.warning(  # An override of train.expected_lot_size would change nothing here.
            "dp.unit='group': lots of dp.group_lot_size=%d groups; train.expected_lot_size=%d "
            "(pairs) is not read. Change the lot with --config.dp.group_lot_size.",
            plan.expected_lot_size,
            run.train.expected_lot_size,
        )
    if not plan.seed_is_secret and plan.private:
        logging.warning(
            "config.%s: the noise seed is fixed, this run has NO privacy guarantee (ε = ∞).",
            config_lib.FIXED_SEED_SWITCH,
        )
    # The starting model's claim is fixed when the run starts: a resumed run, decode
    # and export read it back, never the base model's record again.
    pretrained = pretrained_privacy.claim_at_start(run, run_dir, resuming=resuming)
    # Written once: a resumed run keeps the record (rewriting it risks it for nothing).
    if pretrained is not None and (not resuming or run_dir.read_pretrained() is None):
        distributed.on_primary(
            lambda: run_dir.write_pretrained(pretrained.to_json()),
            "recording the starting model's privacy claim",
        )
    _log_plan(plan, vocabulary, pretrained, text_objective.example_unit(run.data))

    # 7. Model and optimizer.
    with timer.phase("start-up: model init"):
        logging.info("%s…", _building(run))
        started = time.perf_counter()
        root = jax.random.key(run.seed)
        model, model_config, params = pieces.build_model(
            run.model, tokenizer, jax.random.fold_in(root, 0)
        )
        trainable, frozen = pieces.split_trainable(run.model, params)
        if plan.private and plan.noise_mode == core.noise.SECURE:
            _check_secure_noise(plan, trainable)
        tx = steps.make_optimizer(run.train, plan.num_steps)
        opt_state = timer.sync(tx.init(trainable))
        logging.info("Model ready in %.1f s.", time.perf_counter() - started)

    label_smoothing = float(run.train.label_smoothing)

    def loss_fn(full_params, example, dropout_key):
        return steps.example_loss(
            model, model_config, full_params, example, dropout_key, label_smoothing=label_smoothing
        )

    def eval_loss_fn(full_params, example, dropout_key):  # Plain cross-entropy.
        return steps.example_loss(model, model_config, full_params, example, dropout_key)

    # 8. The DP lot step: noise once per lot on the sum of clipped gradients, ÷ L.
    mesh = bridge.make_data_mesh()
    bridge.check_physical_batch_size(run.train.physical_batch_size, mesh)
    step_fns = steps.make_lot_step(
        loss_fn,
        tx,
        steps.StepPrivacy.from_plan(plan),
        mesh,
        clipping=run.dp.clipping,
        clipping_chunk=run.dp.clipping_chunk,
        group_cap=plan.group_cap,
    )

    # 9. Lot sampler. Lot membership must be secret for Poisson amplification:
    # the sampler is seeded from the private run seed, never from the public
    # config.seed. Lots are drawn over indices only (identically on every
    # process); each process then fetches just the rows its devices hold.
    # The samplers take every bit of the 128-bit derived seed (numpy PCG64).
    sampler_seed = derived_seed(noise_seed, "sampler")
    lot_indices = bridge.IndexOnly(train_examples)
    if plan.unit == privacy.GROUP:  # Whole groups, q = L_groups / N_groups from the plan.
        lots = bridge.PoissonGroupLots(
            train_groups,
            plan.expected_lot_size,
            plan.group_cap,
            seed=None if run.dp.secure_rng else sampler_seed,
            secure_rng=run.dp.secure_rng,
        )
    elif plan.sampling == privacy.POISSON:
        lots = bridge.PoissonLots(
            lot_indices,
            plan.expected_lot_size,
            seed=None if run.dp.secure_rng else sampler_seed,
            secure_rng=run.dp.secure_rng,
        )
    else:
        lots = bridge.ShuffledLots(lot_indices, plan.expected_lot_size, seed=sampler_seed)
    check_sampler_matches_plan(lots, plan)

    return RunPieces(
        config=run,
        files=RunFiles(run_dir, manager, resuming, run_id),
        secrets=RunSecrets(noise_seed),
        data=RunData(corpus, tokenizer, tokenized, train_examples, split_stats),
        privacy=RunPrivacy(plan, vocabulary, pretrained, validation_is_private),
        model=RunModel(
            model, model_config, root, trainable, frozen, loss_fn, eval_loss_fn=eval_loss_fn
        ),
        step=RunStep(tx, opt_state, mesh, step_fns, lots),
    )
