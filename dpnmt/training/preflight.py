"""Every check of a run before it writes a file or spends privacy, in order, all at once.

The rules live with their owners: each config section's `problems()`
(`dpnmt.config`), the corpora (`data.checks`), public vocabulary text
(`data.public_checks`), the models (`models.checks`), length buckets
(`bridge.buckets`), a pretrained export's record (`training.pretrained_privacy`),
the compilation cache, the workdir (`training.run_dir`) and, once N is known
from the corpus text, the privacy plan (`dpnmt.privacy`). This module asks
them in order and raises every problem as one `ConfigError`.
"""

import logging
from collections.abc import Callable
from typing import Any

import jax
import ml_collections

from dpnmt import privacy
from dpnmt.bridge import buckets
from dpnmt.config import DataConfig, RunConfig
from dpnmt.data import checks as data_checks
from dpnmt.data import health, public_checks
from dpnmt.data.corpora.common import validation_is_carved_from_train
from dpnmt.errors import ConfigError, raise_problems
from dpnmt.models import checks as model_checks
from dpnmt.models import hub
from dpnmt.public_names import public_corpus
from dpnmt.training import compilation_cache, pretrained_privacy
from dpnmt.training.run_dir import workdir_problems


def read_config(config: ml_collections.ConfigDict, workdir: str | None = None) -> RunConfig:
    """The apps' `--config` as a `RunConfig`, its field names checked (values: `check_run`).

    The edge where a ConfigDict becomes sections, once, right after the flags.
    A config naming a field this version does not know is refused here, with
    every other problem the config and `workdir` show on their own (no devices
    are counted: `jax.distributed` may not be initialised yet), in one message;
    otherwise the values are checked with the devices, the workdir and the
    corpus, all at once, by `check_run` before anything is written.

    Raises:
      ConfigError: every field this version does not know, with the closest
        one, and the config's and the workdir's other problems.
    """
    run, unknown = RunConfig.build(config)
    if unknown:
        workdir_lines = workdir_problems(workdir, run) if workdir is not None else []
        raise_problems([*unknown, *run.problems(), *workdir_lines])
    return run


def config_problems(run: RunConfig, *, device_count: int | None = None) -> list[str]:
    """Every problem of `run` found without reading the corpus, one line each.

    Args:
      run: the resolved experiment config.
      device_count: devices the batch is split over (default `jax.device_count()`).

    Returns:
      Problems naming the field and the fix; empty when none.
    """
    device_count = jax.device_count() if device_count is None else device_count
    # An unloadable model's privacy record cannot be read either: its problem alone.
    model_files = model_files_problems(run)
    return [
        *run.problems(),
        *data_checks.data_problems(run.data, run.dp),  # The user's own files first.
        *public_checks.public_source_problems(run),
        *model_checks.model_problems(run.model),
        *(model_files or pretrained_privacy.pretrained_problems(run)),  # The files first.
        *data_checks.objective_problems(run),
        *data_checks.appended_sentinel_problems(run),
        *buckets.length_bucket_problems(run.data, jax.process_count()),
        *run.train.device_problems(device_count),
        *compilation_cache.problems(run.train.compilation_cache),
    ]


def model_files_problems(run: RunConfig) -> list[str]:
    """The pretrained model's files (config, weights, tokenizer) cannot be had here.

    Asked before anything is written: a local folder's files, else the hub
    (one short request) or, offline or unreachable, the Hugging Face cache
    (`models.hub.availability_problem`). Nothing is downloaded.
    """
    name = run.model.name_or_path
    if name is None:
        return []
    try:
        needs_tokenizer = run.tokenizer_kind == "pretrained"
    except ConfigError:  # Named by the tokenizer problems.
        needs_tokenizer = False
    problem = hub.availability_problem(name, needs_tokenizer=needs_tokenizer)
    return [problem] if problem else []


def check_static(run: RunConfig, workdir: str | None) -> None:
    """Raises every problem of `run` and `workdir` found without reading the corpus."""
    raise_problems(
        [
            *config_problems(run),
            *workdir_problems(workdir, run),
            *compilation_cache.in_workdir_problems(run.train.compilation_cache, workdir),
        ]
    )


def check_run(
    run: RunConfig,
    workdir: str | None,
    *,
    load_corpus: Callable[[DataConfig], Any],
    corpus_transform: Callable[[Any], Any] | None = None,
) -> None:
    """Validates a training run completely before it writes a file or spends privacy.

    First the config and workdir alone (`check_static`), then, from the corpus
    text (reading it writes nothing), what needs N (L < N, a reachable ε, δ
    below 1/N) or the text itself (public vocabulary text that is the corpus's).

    Args:
      run: the resolved experiment config.
      workdir: the run's folder (need not exist).
      load_corpus: `data section -> DatasetDict` (`training.pieces.load_corpus`).
      corpus_transform: as for `training.loop.train_and_evaluate`.

    A sound run whose corpus is too small for its DP vocabulary gets a logged
    note first (`data.checks.small_corpus_note`), before anything is written.

    Raises:
      ConfigError: every problem found, one line each.
      InputError: the corpus cannot be loaded (missing files, offline hub, ...).
    """
    check_static(run, workdir)
    logging.disable(logging.INFO)  # The run loads it again and logs that.
    try:
        corpus = load_corpus(run.data)
    finally:
        logging.disable(logging.NOTSET)
    if corpus_transform is not None:
        corpus = corpus_transform(corpus)
    dataset_size = data_checks.kept_pairs(corpus["train"], run.data.pair)
    num_groups, counted = None, "training pairs"
    if run.dp.unit == privacy.GROUP:  # N is N_groups; δ below 1/N_groups.
        labels = data_checks.kept_groups(corpus["train"], run.data.pair)
        num_groups = None if labels is None else len(set(labels))
        counted = "groups"
    problems = privacy.size_problems(run.dp, run.train, dataset_size, num_groups)
    if not problems:  # The plan is sound: its δ against N.
        problems = privacy.delta_problems(
            run.dp, num_groups or dataset_size, _other_deltas(run), counted
        )
    problems += data_checks.vocabulary_problems(run, corpus["train"], dataset_size)
    problems += _group_pretrained_problems(run)
    problems += _group_carved_validation_problems(run, corpus)
    public = public_checks.public_text_problems(run, corpus)
    public += public_checks.public_corpora_content_problems(run, corpus)
    public += pretrained_privacy.declared_text_problems(run, corpus)
    raise_problems([*public, *problems])
    health.log_warnings(
        [
            data_checks.small_corpus_note(run, dataset_size),
            privacy.small_run_note(run.dp, run.train, dataset_size, num_groups),
        ]
    )


def _group_carved_validation_problems(run: RunConfig, corpus) -> list[str]:
    """dp.unit=group with validation pairs carved off train, pair by pair.

    Carving cuts across groups: part of a group's pairs would sit in
    validation, whose loss and BLEU are published unnoised, while the report
    says the whole group is protected.
    """
    if run.dp.unit != privacy.GROUP or not run.dp.enabled:
        return []
    if not validation_is_carved_from_train(corpus):
        return []
    return [
        f"dp.unit='group' with a validation split carved from the private train split of "
        f"data.corpus={public_corpus(run.data.corpus)!r} (data.validation_size): carving is "
        "pair by pair, so some groups would have pairs in validation, whose scores are "
        "published unnoised, and the whole group would not be protected. Give the corpus its "
        "own validation split (files: a validation file of groups not in train; bsd: "
        "train_split='train'), or use dp.unit='example'."
    ]


def _group_pretrained_problems(run: RunConfig) -> list[str]:
    """dp.unit=group from a dpnmt export whose per-pair ε would compose into the total."""
    if run.dp.unit != privacy.GROUP or not run.dp.enabled:
        return []
    claim = pretrained_privacy.pretrained_claim(run)
    if claim is None or not (claim.composed or claim.parallel) or not claim.epsilon:
        return []
    if claim.epsilon == float("inf"):  # Composes to ε = ∞: reported as no guarantee.
        return []
    if claim.parallel:
        return [
            f"dp.unit='group' starting from model.name_or_path={run.model.name_or_path!r}, a "
            "dpnmt export trained with DP on data declared disjoint "
            "(model.pretrained_data_disjoint=True): the total is the larger of its own "
            f"ε={claim.epsilon:.3g} and this run's, but its ε is per example of its own "
            "training data, not per group, so that total per group would be wrong. Start from "
            "a model trained without DP on public data, or use dp.unit='example'."
        ]
    return [
        f"dp.unit='group' starting from model.name_or_path={run.model.name_or_path!r}, a "
        f"dpnmt export whose own ε={claim.epsilon:.3g} composes into this run's total: that "
        "ε is not per group of this run, so the total per group would be wrong. Set "
        f"model.pretrained_data_disjoint=True only if its training data share no "
        f"{pretrained_privacy.shared_unit(run)} with this run's, or start from a model not "
        "trained on this data, or use dp.unit='example'."
    ]


def _other_deltas(run: RunConfig) -> tuple:
    """(what, δ) of the mechanisms composed with DP-SGD: the DP vocabulary, a pretrained export."""
    out = []
    if run.tokenizer_kind == "dp_sentencepiece":
        out.append((f"tokenizer.dp_delta={run.tokenizer.dp_delta:g}", run.tokenizer.dp_delta))
    claim = pretrained_privacy.pretrained_claim(run)
    if claim is not None and claim.composed and claim.composed_delta:
        out.append((f"the pretrained export's δ={claim.composed_delta:g}", claim.composed_delta))
    return tuple(out)
