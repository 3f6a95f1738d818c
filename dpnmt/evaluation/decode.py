"""Decoding a trained (or pretrained) model and scoring it: the library behind `dpnmt.decode`.

A trained run is decoded from its workdir (its saved config, vocabulary and
latest checkpoint); a pretrained model without training from a config
(`python -m dpnmt.decode --config=... --zero_shot`).
"""

import dataclasses
import json
import logging
import os

import jax

from dpnmt import bridge, decode_folders, models, privacy, public_names
from dpnmt.config import RunConfig
from dpnmt.data import text_objective, tokenizers
from dpnmt.errors import ConfigError, MissingInputError, raise_problems
from dpnmt.evaluation import evaluator as evaluator_lib
from dpnmt.training import checkpointing, pieces, preflight, pretrained_privacy, steps
from dpnmt.training.privacy_report import privacy_report
from dpnmt.training.run_dir import CHECKPOINT_DIR, RESULTS_FILE, RunDir, write_json
from dpnmt.training.state import LoopState


def load_run_config(workdir: str) -> RunConfig:
    """The resolved config a training run wrote into `workdir` (unchecked: `RunConfig.of`).

    Fields an older config.json lacks take their defaults; fields this version
    does not know are ignored.
    """
    path = RunDir(workdir).config_path
    if not os.path.exists(path):
        raise MissingInputError(
            f"{path} does not exist: --workdir must be a training run's folder "
            "(or pass --config and --zero_shot for a pretrained model's baseline)."
        )
    with open(path) as f:
        return RunConfig.of(json.load(f))


def warn_if_unfinished(workdir: str) -> bool:
    """Warns when the run in `workdir` has not finished; returns whether it has."""
    path = RunDir(workdir).results_path
    finished = False
    if os.path.exists(path):
        with open(path) as f:
            finished = bool(json.load(f).get("finished"))
    if not finished:
        logging.warning(
            "The run in %s has not finished (no finished %s): decoding its latest "
            "checkpoint. Rerun python -m dpnmt.train with the same --workdir to finish it.",
            workdir,
            os.path.basename(path),
        )
    return finished


def check_tag(tag: str | None) -> None:
    """Raises ConfigError unless `tag` is None or a tag (`decode_folders.is_tag`)."""
    if tag is not None and not decode_folders.is_tag(tag):
        raise ConfigError(
            f"tag={tag!r}: use letters, digits, '-' and '_' only (it names the folder "
            "decode_<split>_<tag> inside the run's folder)."
        )


def decode_and_score(
    run: RunConfig,
    workdir: str,
    *,
    split: str = "test",
    max_examples: int | None = None,
    bertscore: bool = True,
    output_dir: str | None = None,
    zero_shot: bool = False,
    tag: str | None = None,
) -> dict:
    """Translates a split by generation, scores it, writes hypotheses and results.json.

    Args:
      run: the run config (`load_run_config`), or a config for a pretrained
        model when `zero_shot`.
      workdir: the training run's folder (checkpoint, tokenizer); ignored for
        reading when `zero_shot`.
      split: "validation" or "test".
      max_examples: score only the first pairs of the split.
      bertscore: also compute BERTScore (`eval.bertscore_model`, default
        the offline MiniLM encoder).
      output_dir: where to write `hypotheses.<split>.txt` and `results.json`
        (default `workdir/decode_<split>`, or `workdir/private/decode_validation`
        when validation was carved from the private train split:
        `RunDir.output_path`).
      zero_shot: decode the pretrained model named by `model.name_or_path`
        without any training (baseline; no privacy cost).
      tag: the default folder becomes `decode_<split>_<tag>` (another decoding
        setting beside the run's own; letters, digits, '-' and '_'; an earlier
        decoding with the same tag is replaced). Ignored when `output_dir` is
        given: the caller then owns the privacy routing of that folder.

    Returns:
      The results dict (scores, privacy report, decoding settings).
    """
    if split not in ("validation", "test"):
        raise ValueError(f"split={split!r}: use 'validation' or 'test'.")
    check_tag(tag)
    if zero_shot and (run.model.name_or_path is None or run.tokenizer_kind != "pretrained"):
        raise ConfigError(
            "--zero_shot needs a pretrained model and its tokenizer: set "
            "model.name_or_path in --config (tokenizer.kind auto or 'pretrained')."
        )
    if zero_shot:  # At once, not after the corpus and the hub client's retries.
        raise_problems(preflight.model_files_problems(run))
    corpus = pieces.load_corpus(run.data)
    # Reloads the run's saved vocabulary: never learns one again.
    tokenizer, vocabulary = pieces.build_tokenizer(
        run, corpus, workdir, noise_seed=None, learn=False
    )
    # An objective run's examples: the public draws of data.objective_seed (zero-shot too).
    objective = pieces.make_objective(run.data, tokenizer)
    tokenized, _ = pieces.tokenize_corpus(run, corpus, tokenizer, objective)
    model, model_config, params = pieces.build_model(
        run.model, tokenizer, jax.random.fold_in(jax.random.key(run.seed), 0)
    )
    report, steps_done = {"private": False, "note": decode_folders.ZERO_SHOT_NOTE}, 0
    if zero_shot:
        report |= zero_shot_claim(run, corpus)
    else:
        params, plan, steps_done = restore_params(run, workdir, params)
        report = privacy_report(
            plan,
            steps_done,
            vocabulary,
            validation_is_private=pieces.validation_is_carved_from_train(corpus),
            pretrained=pretrained_privacy.recorded_claim(run, workdir),
            example=text_objective.example_unit(run.data),
        ).to_json()
    settings = evaluator_lib.EvalSettings(run.eval, run.data, run.train.physical_batch_size)
    evaluator = evaluator_lib.Evaluator(
        settings, model, model_config, tokenizer, tokenized, corpus, None, bridge.make_data_mesh()
    )
    hypotheses, references = evaluator.translate(params, split, max_examples)
    results = {
        "split": split,
        "scores": evaluator.scores(hypotheses, references, bertscore=bertscore),
        "privacy": report,
        "steps_done": steps_done,
        "decoding": run.eval.decoding(),
        "vocabulary": dataclasses.asdict(vocabulary)
        if isinstance(vocabulary, tokenizers.VocabularyRecord)
        else None,
    }
    # Hypotheses of pairs carved from the private train split are private.
    private = split == "validation" and pieces.validation_is_carved_from_train(corpus)
    name = decode_folders.folder(split, tag)
    output_dir = output_dir or RunDir(workdir).output_path(name, private=private)
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, f"hypotheses.{split}.txt"), "w", encoding="utf-8") as f:
        # One line per hypothesis, whatever line breaks generation produced.
        f.writelines(" ".join(h.splitlines()) + "\n" for h in hypotheses)
    write_json(os.path.join(output_dir, RESULTS_FILE), results)
    logging.info(
        "Decoded %s: %s (written to %s)",
        split,
        json.dumps(results["scores"], default=str),
        output_dir,
    )
    return results


def zero_shot_claim(run: RunConfig, corpus) -> dict:
    """The decoded model's own privacy, as a DP run on this corpus would take it.

    Decided with `dp.enabled` on whatever the decode's config says, so that a
    disjoint declaration is checked against this corpus (its recorded
    training corpora and text) and an unreadable record counts as unknown;
    `dpnmt.report --starts` states ∞ for a claim with a problem.

    Returns:
      {"pretrained": the claim (JSON) or None, "pretrained_problems": [lines],
      "corpus": data.corpus's public name, "pair": data.pair}.
    """
    private = dataclasses.replace(run, dp=dataclasses.replace(run.dp, enabled=True))
    claim = pretrained_privacy.pretrained_claim(private, refuse=False)
    problems = pretrained_privacy.pretrained_problems(private)
    problems += pretrained_privacy.declared_text_problems(private, corpus)
    return {
        "pretrained": None if claim is None else claim.to_json(),
        "pretrained_problems": problems,
        "corpus": public_names.public_corpus(run.data.corpus),  # Published: no local path.
        "pair": run.data.pair,
    }


def load_trained_params(workdir: str):
    """(params, plan, steps done) of the latest checkpoint of a training run."""
    return load_trained(load_run_config(workdir), workdir)[3:]


def load_trained(run: RunConfig, workdir: str):
    """A trained run's (tokenizer, model, model config, params, plan, steps done).

    The saved vocabulary is reloaded (never learnt again) and the latest
    checkpoint's parameters restored into the model `run` builds.
    """
    tokenizer, _ = pieces.build_tokenizer(run, None, workdir, noise_seed=None, learn=False)
    model, model_config, params = pieces.build_model(
        run.model, tokenizer, jax.random.fold_in(jax.random.key(run.seed), 0)
    )
    return (tokenizer, model, model_config, *restore_params(run, workdir, params))


def restore_params(run: RunConfig, workdir: str, params, *, iterate: bool = False):
    """Params with the checkpoint's trainable part, the plan and the steps done.

    The trainable part is the run's model: the parameters' moving average
    when the run kept one (`train.ema_decay` > 0), else the last iterate;
    `iterate` asks for the last iterate (where the lots' gradients were taken).
    """
    manager = checkpointing.make_manager(workdir)
    if manager.latest_step() is None:
        raise MissingInputError(
            f"No checkpoint in {os.path.join(workdir, CHECKPOINT_DIR)}; "
            "train first (python -m dpnmt.train), or decode a pretrained model with "
            "--config=<its config> --zero_shot."
        )
    trainable, frozen = models.split_params(params, pieces.trainable_predicate(run.model))
    step = manager.latest_step()
    meta = checkpointing.restore_meta(manager, step)
    plan = privacy.PrivacyPlan(**meta["plan"])
    tx = steps.make_optimizer(run.train, plan.num_steps)
    # The checkpoint says whether the run kept an average (train.ema_decay > 0).
    average = checkpointing.has_average(manager, step)
    like = checkpointing.arrays_of(
        LoopState(step, trainable, tx.init(trainable), average=trainable if average else None)
    )
    _, state, _ = checkpointing.restore_latest(manager, like)
    chosen = state["trainable"] if iterate or not average else state[checkpointing.AVERAGE]
    return models.merge_params(chosen, frozen), plan, meta["steps_done"]
