"""Validates a run's whole config (and its workdir) before anything is written or spent.

Every problem is one line naming the field and the fix; `check_run` raises
them all at once as a `ConfigError`. The checks need neither the model nor the
vocabulary: the static ones read only the config and the file system, the
size-dependent ones (L < N, a reachable target ε) the corpus text alone.
"""

import dataclasses
import difflib
import hashlib
import json
import logging
import math
import os
import re
from collections.abc import Callable, Iterable
from typing import Any

import jax
import ml_collections

from dpnmt import config_lib, core, privacy
from dpnmt.bridge import buckets as length_buckets
from dpnmt.data import corpora, languages, overlap, preprocess, public_vocab
from dpnmt.errors import ConfigError, InputError
from dpnmt.training import compilation_cache, pretrained_privacy
from dpnmt.training.run_dir import (
    CHECKPOINT_DIR,
    CONFIG_FILE,
    METRICS_FILE,
    PRIVATE_DIR,
    TOKENIZER_FILE,
)

SWEEP_MANIFEST_FILE = "sweep.json"  # dpnmt.sweeps.grid.MANIFEST_FILE (not imported: flags).

TOKENIZER_KINDS = (
    "auto",
    "pretrained",
    "dp_sentencepiece",
    "sentencepiece_public",
    "sentencepiece_private",
)
# Every field whose value must be one of a fixed set, and that set.
ENUM_FIELDS: dict[str, tuple[str, ...]] = {
    "data.tokenize_train": ("auto", "upfront", "per_lot"),
    "data.bsd_train_split": ("train", "dev"),
    "tokenizer.kind": TOKENIZER_KINDS,
    "tokenizer.model_type": ("unigram", "bpe"),
    "model.family": preprocess.FAMILIES,
    "model.finetune": ("all", "lora", "bias"),
    "dp.accountant": tuple(a.value for a in core.accounting.Accountant),
    "dp.sampling": (privacy.POISSON, privacy.SHUFFLE),
    "dp.clipping": core.private_grad.CLIPPING_METHODS,
    "dp.noise_mode": core.noise.NOISE_MODES,
    "train.optimizer": ("sgd", "adam", "adamw", "adafactor"),
    "train.decay": ("constant", "linear", "cosine"),
}
# config.data field -> the corpus loader option it feeds (`corpora.CORPORA`).
CORPUS_OPTION_FIELDS = {
    "data.dir": "data_dir",
    "data.validation_size": "validation_size",
    "data.bsd_train_split": "train_split",
}
# A learnt vocabulary depends on these (prefixes end in "."): the train text
# (corpus, pair, folder, carving, truncation to K pairs), how it is learnt, and
# its noise seed (`training.pieces.build_tokenizer`). A workdir holding a vocabulary
# but no checkpoint accepts a config that differs in other fields only.
VOCABULARY_FIELDS = (
    "data.corpus",
    "data.corpus_weights",
    "data.pair",
    "data.dir",
    "data.validation_size",
    "data.bsd_train_split",
    "data.max_train_examples",
    "tokenizer.",
    "noise_seed",
    "model.name_or_path",
)
# Fields a resumed run may change: they change how, not what, it trains (the
# examples, N, lots and noise are the same).
# `dp.allow_large_delta` changes what is accepted, not what trains or is claimed.
# `model.pretrained_data_disjoint` changes the claimed ε (the export's is not
# composed): it binds once the run has started, like the fields that change what
# trains (a run from before it resumes with it at its default, False).
NOT_BINDING_FIELDS = frozenset(
    {
        "data.tokenize_train",
        "data.length_buckets",
        "train.profile",
        "train.compilation_cache",
        "dp.allow_large_delta",
    }
)


def _get(config: ml_collections.ConfigDict, field: str) -> Any:
    value = config
    for part in field.split("."):
        value = value[part]
    return value


def flatten(tree: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_fields(config: ml_collections.ConfigDict | None = None) -> list[str]:
    """Every leaf field of `config` (default: the base config), dotted."""
    config = config_lib.base_config() if config is None else config
    return sorted(flatten(config.to_dict()))


def unknown_field_message(field: str, known: Iterable[str]) -> str:
    """The line for an unknown field, with the closest known one (`no field dp.epsilon; ...`)."""
    known = list(known)
    close = difflib.get_close_matches(field, known, n=1, cutoff=0.5)
    if not close:  # Same group, closest leaf name ("dp.epsilon" -> "dp.target_epsilon").
        group, _, leaf = field.rpartition(".")
        leaves = [k for k in known if k.rpartition(".")[0] == group]
        by_leaf = [k for k in leaves if leaf and leaf in k.rpartition(".")[2]]
        close = by_leaf[:1] or difflib.get_close_matches(field, leaves, n=1, cutoff=0.3)
    hint = f"did you mean {close[0]}?" if close else "see dpnmt/config_lib.py for the fields."
    return f"no field {field}; {hint}"


def check_override_flags(argv: Iterable[str], known: Iterable[str] | None = None) -> list[str]:
    """One line for each `--config.<field>` flag naming a field the config lacks.

    Args:
      argv: command-line arguments (`--config.dp.epsilon=1`, `--noconfig.x`, ...).
      known: the config's fields (default: the base config's).

    Returns:
      Problems, one line each with the closest field; empty when all are known.
    """
    known = set(config_fields() if known is None else known)
    problems = []
    for arg in argv:
        match = re.match(r"^--(?:no)?config\.([^=\s]+)", arg)
        if match and match.group(1) not in known:
            problems.append(
                f"--config.{match.group(1)}: {unknown_field_message(match.group(1), known)}"
            )
    return problems


def _enum_problems(config) -> list[str]:
    problems = []
    for field, allowed in ENUM_FIELDS.items():
        value = _get(config, field)
        if value is None and field == "data.bsd_train_split":
            continue
        if value not in allowed:
            close = difflib.get_close_matches(str(value), allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"{field}={value!r} is unknown{hint}; use one of {list(allowed)}.")
    return problems


# (field, test, what it must be); None values (unset placeholders) are skipped.
_RANGES: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("data.max_source_length", lambda v: v >= 1, ">= 1 (tokens per source)"),
    ("data.max_target_length", lambda v: v >= 1, ">= 1 (tokens per target)"),
    ("data.max_train_examples", lambda v: v >= 1, ">= 1 (or unset for all)"),
    ("data.max_eval_examples", lambda v: v >= 1, ">= 1"),
    ("data.max_test_examples", lambda v: v >= 1, ">= 1 (or unset for all)"),
    ("data.validation_size", lambda v: v >= 1, ">= 1 (or unset)"),
    ("tokenizer.vocab_size", lambda v: v >= 8, ">= 8 pieces"),
    ("tokenizer.dp_max_words", lambda v: v >= 1, ">= 1"),
    ("model.d_model", lambda v: v >= 1, ">= 1"),
    ("model.d_kv", lambda v: v >= 1, ">= 1"),
    ("model.d_ff", lambda v: v >= 1, ">= 1"),
    ("model.num_layers", lambda v: v >= 1, ">= 1"),
    ("model.num_decoder_layers", lambda v: v >= 1, ">= 1"),
    ("model.num_heads", lambda v: v >= 1, ">= 1"),
    ("model.dropout_rate", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("model.lora_rank", lambda v: v >= 0, ">= 0 (0: no adapters)"),
    ("model.lora_alpha", lambda v: v > 0 and math.isfinite(v), "> 0 (or unset: alpha = rank)"),
    ("dp.clipping_chunk", lambda v: v >= 0, ">= 0 (0: the whole micro-batch at once)"),
    ("train.expected_lot_size", lambda v: v >= 1, ">= 1 (L, examples per lot)"),
    ("train.physical_batch_size", lambda v: v >= 1, ">= 1 (rows per micro-batch)"),
    ("train.num_epochs", lambda v: v >= 1 and float(v).is_integer(), "a whole number >= 1"),
    ("train.learning_rate", lambda v: v > 0 and math.isfinite(v), "> 0"),
    ("train.warmup_steps", lambda v: v >= 0, ">= 0"),
    ("train.weight_decay", lambda v: v >= 0, ">= 0"),
    ("train.label_smoothing", lambda v: 0 <= v < 1, "in [0, 1) (0: plain cross-entropy)"),
    ("train.eval_every_steps", lambda v: v >= 0, ">= 0 (0: only at the end; unset: auto)"),
    ("train.early_stopping_patience", lambda v: v >= 0, ">= 0 (0: never stop early)"),
    ("train.checkpoint_every_steps", lambda v: v >= 1, ">= 1"),
    ("train.log_every_steps", lambda v: v >= 1, ">= 1"),
    ("eval.num_beams", lambda v: v >= 1, ">= 1 (1: greedy)"),
    ("eval.max_new_tokens", lambda v: v >= 1, ">= 1"),
    ("eval.batch_size", lambda v: v >= 1, ">= 1"),
)
# Checked only for private runs (a non-private run has no clipping or noise).
_PRIVATE_RANGES: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("dp.l2_clip", lambda v: v > 0 and math.isfinite(v), "> 0 (the clipping norm C)"),
    ("dp.delta", lambda v: 0 < v < 1, "in (0, 1), e.g. 1e-8 (below 1/N)"),
    ("dp.target_epsilon", lambda v: v > 0 and math.isfinite(v), "> 0"),
    ("dp.noise_multiplier", lambda v: v > 0 and math.isfinite(v), "> 0 (or use :nonprivate)"),
)
_DP_VOCABULARY_RANGES: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("tokenizer.dp_noise_stddev", lambda v: v > 0 and math.isfinite(v), "> 0"),
    ("tokenizer.dp_delta", lambda v: 0 < v < 1, "in (0, 1)"),
)


def _range_problems(config, ranges) -> list[str]:
    problems = []
    for field, test, must in ranges:
        value = _get(config, field)
        if value is None:
            continue
        try:
            ok = bool(test(value))
        except TypeError:
            ok = False
        if not ok:
            problems.append(f"{field}={value!r} must be {must}.")
    return problems


def _looks_local(name_or_path: str) -> bool:
    """A path, not a hub id ("org/name"): starts like a path or has two slashes."""
    return name_or_path.startswith(("/", ".", "~")) or name_or_path.count("/") > 1


def _model_problems(config) -> list[str]:
    problems = []
    name = config.model.name_or_path
    if name is not None:
        path = os.path.expanduser(name)
        if _looks_local(name) and not os.path.isdir(path):
            problems.append(
                f"model.name_or_path={name!r}: no such folder; give a local folder holding "
                "the model (config.json and weights) or a hub id such as 'google/t5-small'."
            )
    else:
        if config.tokenizer.kind == "pretrained":
            problems.append(
                "tokenizer.kind='pretrained' needs model.name_or_path (a pretrained model); "
                "set it, or use tokenizer.kind='dp_sentencepiece' for a model from scratch."
            )
        from dpnmt.models.config import T5Config  # noqa: PLC0415 - flax only when needed.

        try:
            T5Config(feed_forward_proj=config.model.feed_forward_proj)
        except ValueError as error:
            problems.append(f"model.{error}")
    if config.model.trainable is not None:
        try:
            re.compile(config.model.trainable)
        except re.error as error:
            problems.append(
                f"model.trainable={config.model.trainable!r} is not a regex ({error}); fix it."
            )
    return problems


def _architecture(config) -> tuple[str, bool] | None:
    """(model_type, gated feed-forward) of the model the run builds, if known unloaded.

    From scratch it is a T5 of `model.feed_forward_proj`; a local pretrained
    folder says in its config.json; a hub id is not looked up (None).
    """
    name = config.model.name_or_path
    if name is None:
        return "t5", str(config.model.feed_forward_proj).startswith("gated-")
    path = os.path.join(os.path.expanduser(name), "config.json")  # Hugging Face config.
    try:
        with open(path) as f:
            hf_config = json.load(f)
    except (OSError, json.JSONDecodeError):
        return None
    gated = str(hf_config.get("feed_forward_proj", "relu")).startswith("gated-")
    return str(hf_config.get("model_type")), gated


def _finetune_problems(config) -> list[str]:
    """`model.finetune` and the LoRA fields agree, name real layers, fit the model."""
    from dpnmt.models import lora  # noqa: PLC0415 - flax only when needed.

    mode, rank, field = config.model.finetune, config.model.lora_rank, config.model.lora_targets
    if not isinstance(rank, int) or rank < 0:
        return []  # Named by the range check.
    problems = []
    if mode == "lora" and rank == 0:
        problems.append(
            "model.finetune='lora' needs model.lora_rank >= 1 (the adapters' rank, e.g. 8)."
        )
    if rank > 0 and mode != "lora":
        problems.append(
            f"model.lora_rank={rank} adds adapters, but model.finetune={mode!r} would not "
            "train them alone: set model.finetune='lora' (or model.lora_rank=0)."
        )
    if mode in ("lora", "bias") and config.model.trainable is not None:
        problems.append(
            f"model.trainable={config.model.trainable!r} and model.finetune={mode!r} both "
            "choose the trained parameters; unset model.trainable (it applies to "
            "finetune='all')."
        )
    architecture = _architecture(config)
    known = architecture is not None and architecture[0] in ("t5", "mt5", "mbart")
    if mode == "lora" and rank > 0:
        valid = lora.valid_targets(architecture[0], gated=architecture[1]) if known else None
        problem = lora.check_targets(config_lib.lora_targets(config), valid or lora.ALL_TARGETS)
        if problem:
            problems.append(f"model.lora_targets={field!r}: {problem}")
    if mode == "bias" and known and architecture[0] in ("t5", "mt5"):
        problems.append(
            "model.finetune='bias' trains only bias terms, and T5 and mT5 layers have none "
            "(they are bias-free): use model.finetune='lora' or 'all', or an mBART model."
        )
    return problems


def _tokenizer_problems(config) -> list[str]:
    if config.tokenizer.kind not in TOKENIZER_KINDS:
        return []  # Named by the enum check.
    try:
        kind = config_lib.tokenizer_kind(config)
    except ConfigError as error:
        return [str(error)]
    problems = []
    if kind == "dp_sentencepiece":
        problems += _range_problems(config, _DP_VOCABULARY_RANGES)
    if kind == "sentencepiece_public":
        paths = list(config.tokenizer.public_text_paths)
        public_corpora = config.tokenizer.get("public_corpora", "")
        if not paths and not public_corpora:
            problems.append(
                "tokenizer.kind='sentencepiece_public' needs tokenizer.public_corpora (public "
                "corpora, e.g. 'files:tatoeba_de_en,detok:wmt16') or tokenizer.public_text_paths "
                "(public text files) to learn the vocabulary from."
            )
        problems += public_corpora_problems(config)
        problems += [
            f"tokenizer.public_text_paths: {p} does not exist; fix the path."
            for p in paths
            if not os.path.isfile(p)
        ]
    if kind == "sentencepiece_private" and not config.tokenizer.private_data_ok:
        problems.append(
            "tokenizer.kind='sentencepiece_private' learns the vocabulary from private data "
            "WITHOUT DP: set tokenizer.private_data_ok=True to accept that, or use "
            "dp_sentencepiece."
        )
    return problems


def public_corpora_problems(config) -> list[str]:
    """`tokenizer.public_corpora`: known names, not with text paths, never the private corpus."""
    spec = config.tokenizer.get("public_corpora", "")
    if not spec:
        return []
    if list(config.tokenizer.public_text_paths):
        return [
            "tokenizer.public_corpora and tokenizer.public_text_paths are both set; give one "
            "source of public text for the vocabulary."
        ]
    try:
        public = corpora.parse_corpus_names(spec, "tokenizer.public_corpora")
        private = corpora.parse_corpus_names(config.data.corpus)
    except InputError as error:
        return [str(error)]
    problems = [p for e in public if (p := _public_corpus_problem(e, config.data.pair))]
    if problems or not config.dp.enabled:
        return problems  # Non-private: the public stage trains on these corpora too.
    folders = {_corpus_identity(entry.registry_name) for entry in private}
    shared = [e.name for e in public if _corpus_identity(e.registry_name) in folders]
    if shared:
        return [
            f"tokenizer.public_corpora={spec!r} includes {shared}, the private training data of "
            f"this DP run (data.corpus={config.data.corpus!r}): a vocabulary learnt from it "
            "without DP voids the guarantee. Name public corpora only, or use "
            "tokenizer.kind='dp_sentencepiece'."
        ]
    return []


def measure_split_problems(config, measure: str | None, split: str) -> list[str]:
    """`python -m dpnmt.public_vocab --measure`: never the train split of a DP config's corpus.

    A private run's train split is private: its size and length statistics are
    not published, and lengths or buckets fitted on them are choices made on
    private data outside the guarantee. Its public validation split is measured
    instead.
    """
    if not measure or split != "train" or config is None or not config.dp.enabled:
        return []
    try:
        measured = corpora.parse_corpus_names(measure, "--measure")
        private = corpora.parse_corpus_names(config.data.corpus)
    except InputError as error:
        return [str(error)]
    folders = {_corpus_identity(entry.registry_name) for entry in private}
    if not any(_corpus_identity(entry.registry_name) in folders for entry in measured):
        return []
    return [
        f"--measure={measure} --measure_split=train reads the train split of "
        f"data.corpus={config.data.corpus!r}, the private training data of this DP --config: "
        "its size and length statistics are private, and lengths or buckets chosen from "
        "them are choices made on private data. Measure its public validation split "
        "(--measure_split=validation, the default), or give a non-private --config."
    ]


def measure_options(config, measure: str) -> dict[str, Any]:
    """The loader options `--measure` is read with: the config's, when it names the config's corpus.

    So a validation split is carved (`data.validation_size`, ...) as the runs carve it.
    """
    if config is None:
        return {}
    try:
        (measured,) = corpora.parse_corpus_names(measure, "--measure")
        first = corpora.mixture.first_registry_name(config.data.corpus)
    except (InputError, ValueError):
        return {}
    if _corpus_identity(measured.registry_name) != _corpus_identity(first):
        return {}
    return corpus_options(config)


def measured_content_problems(
    config, measure: str | None, split: str, measured, private
) -> list[str]:
    """`--measure`: its split must not be a DP config's private data under another name or split.

    `measure_split_problems` compares names; this reads the text: the measured
    split is refused when it is a validation split carved from the train split
    of the config's corpus, or when it holds more than `overlap.OVERLAP_LIMIT`
    of a side of a private split (train, and a validation carved from it), so
    a copy of the private corpus, or its carved validation, is refused.

    Args:
      config: the `--config` (None: nothing is private).
      measure: the `--measure` corpus name.
      split: `--measure_split`.
      measured: the measured corpus as loaded (`measure_options`).
      private: the config's corpus (`training.pieces.load_corpus`).
    """
    if not measure or config is None or not config.dp.enabled:
        return []
    from dpnmt.training import pieces  # Deferred: pieces imports this module.

    where = f"--measure={measure} --measure_split={split}"
    fix = (
        "Measure a public split that is not this run's data (a corpus's own validation or "
        "test split), or give a non-private --config."
    )
    first = corpora.mixture.first_registry_name(config.data.corpus)
    (entry,) = corpora.parse_corpus_names(measure, "--measure")
    same = _corpus_identity(entry.registry_name) == _corpus_identity(first)
    if same and split == "validation" and pieces.validation_is_carved_from_train(measured):
        return [
            f"{where} reads the validation split of data.corpus={config.data.corpus!r}, which "
            "is carved from its train split, the private training data of this DP --config: "
            f"its size and length statistics are private. {fix}"
        ]
    rows = measured[split]["translation"]
    text = overlap.sentence_set(text for row in rows for text in row.values())
    found = overlap.large_overlaps(text, overlap.private_sides(private, _private_splits(private)))
    if not found:
        return []
    return [
        f"{where} holds {'; '.join(o.describe() for o in found)} of data.corpus="
        f"{config.data.corpus!r}, up to case and spacing: that is the private training data "
        "of this DP --config, whose size and length statistics are private (more than "
        f"{overlap.OVERLAP_LIMIT:.0%} of a private side shared is refused). {fix}"
    ]


def _public_corpus_problem(entry, pair: str) -> str | None:
    """A public corpus that is missing or lacks the run's pair (cheap: folder and pair)."""
    corpus, argument = corpora.lookup(entry.registry_name)
    try:
        direction = languages.parse_pair(pair)
    except ValueError:
        return None  # Named by the data checks.
    where = f"tokenizer.public_corpora: {entry.name!r}"
    if corpus.name == "wmt16":
        try:
            languages.check_pair_available(direction, corpora.WMT16_PAIRS, "wmt16")
        except ValueError as error:
            return f"{where}: {error} Name public corpora of data.pair={pair!r}."
    if corpus.name != "files":
        return None
    folder = corpora.files.resolve_folder(argument)
    if not os.path.isdir(folder):
        return f"{where}: folder {argument} does not exist here or under ${corpora.DATA_DIR_ENV}."
    try:
        found = corpora.common.read_local_split(folder, "train", direction)
    except InputError as error:
        return f"{where}: {error}"
    if found is None:
        return f"{where}: {folder} has no train file for {pair}."
    return None


def _corpus_identity(registry_name: str) -> str:
    """What a corpus name reads: a `files:` folder's real path, else the name itself."""
    corpus, argument = corpora.lookup(registry_name)
    if corpus.name == "files":
        return "files:" + os.path.realpath(corpora.files.resolve_folder(argument))
    return registry_name


def _mixture_problems(config) -> list[str]:
    """Several corpora (or weights) in `data.corpus`: well formed, and never in a DP run."""
    spec, weights = config.data.corpus, tuple(config.data.get("corpus_weights", ()))
    try:
        entries = corpora.parse_corpus_names(spec)
        problems = corpora.mixture.check_weights(spec, weights)
    except InputError as error:
        return [str(error)]
    if config.dp.enabled and (len(entries) > 1 or weights):
        problems.append(
            f"data.corpus={spec!r}"
            + (f" with data.corpus_weights={weights!r}" if weights else "")
            + " in a private run: a DP run's N, q and guarantee come from its private corpus "
            "alone, and the accounting "
            "for mixing in (or repeating) other pairs is not implemented. Give one corpus and "
            "no weights, or pre-train on the public mixture in a non-private run first."
        )
    return problems


def corpus_options(config) -> dict[str, Any]:
    """The corpus loader's keyword options from `config.data` (unset fields left out)."""
    options = {}
    for field, option in CORPUS_OPTION_FIELDS.items():
        value = _get(config, field)
        if value is not None:
            options[option] = value
    return options


def _data_problems(config) -> list[str]:
    problems = []
    try:
        languages.parse_pair(config.data.pair)
    except ValueError as error:
        problems.append(f"data.pair={config.data.pair!r}: {error}")
    mixture_problems = _mixture_problems(config)
    try:
        first = corpora.mixture.first_registry_name(config.data.corpus)
        accepted = corpora.accepted_options(first)
    except InputError:
        return [*problems, *mixture_problems]
    problems += mixture_problems
    for field, option in CORPUS_OPTION_FIELDS.items():
        value = _get(config, field)
        if value is not None and option not in accepted:
            takes = [f for f, o in CORPUS_OPTION_FIELDS.items() if o in accepted]
            problems.append(
                f"{field}={value!r}: corpus {config.data.corpus!r} does not use it (it takes "
                f"{takes or 'none of the data options'}); unset it."
            )
    if config.data.dir is not None and not os.path.isdir(config.data.dir):
        problems.append(
            f"data.dir={config.data.dir!r} is not a folder; give the corpus folder (or the data "
            f"root holding it), or unset it to use ${corpora.DATA_DIR_ENV} or the download."
        )
    for entry in corpora.parse_corpus_names(config.data.corpus):
        corpus, argument = corpora.lookup(entry.registry_name)
        if corpus.name == "files" and not os.path.isdir(corpora.files.resolve_folder(argument)):
            problems.append(
                f"data.corpus={config.data.corpus!r}: folder {argument} does not exist here or "
                f"under ${corpora.DATA_DIR_ENV}; give a "
                "folder of train/validation/test files (README: 'Your own data and model')."
            )
    return problems


def _length_bucket_problems(config) -> list[str]:
    spec = config.data.length_buckets
    max_source, max_target = config.data.max_source_length, config.data.max_target_length
    if not (isinstance(max_source, int) and isinstance(max_target, int)):
        return []  # Reported by the ranges.
    try:
        lengths = length_buckets.parse_lengths(spec, max_source, max_target)
    except ValueError as error:
        return [str(error)]
    mode = config.data.tokenize_train
    per_lot = mode == "per_lot" or (mode == "auto" and jax.process_count() > 1)
    if lengths and per_lot and spec.strip().lower() != length_buckets.AUTO:
        return [
            f"data.length_buckets={spec!r} needs every row's lengths before its lot is "
            f"fetched, but the train split is tokenized per lot (data.tokenize_train={mode!r}"
            f"{' on several processes' if mode == 'auto' else ''}); set "
            "data.tokenize_train='upfront' (every process tokenizes the whole split) or "
            "data.length_buckets='none'."
        ]
    return []


def _privacy_problems(config) -> list[str]:
    if not config.dp.enabled:
        return []
    problems = _range_problems(config, _PRIVATE_RANGES)
    if config.dp.target_epsilon is None and config.dp.noise_multiplier is None:
        problems.append(
            "A private run needs dp.target_epsilon (σ is calibrated) or dp.noise_multiplier "
            "(ε is reported); set one, or use the :nonprivate variant."
        )
    return problems


def _device_problems(config, device_count: int) -> list[str]:
    b = config.train.physical_batch_size
    if isinstance(b, int) and b >= 1 and b % device_count:
        fix = max(1, round(b / device_count)) * device_count
        return [
            f"train.physical_batch_size={b} must be a multiple of the {device_count} devices; "
            f"use e.g. {fix}."
        ]
    return []


def config_problems(
    config: ml_collections.ConfigDict, *, device_count: int | None = None
) -> list[str]:
    """Every problem of `config` found without reading the corpus, one line each.

    Args:
      config: the resolved experiment config.
      device_count: devices the batch is split over (default `jax.device_count()`).

    Returns:
      Problems naming the field and the fix; empty when none.
    """
    device_count = jax.device_count() if device_count is None else device_count
    return [
        *_enum_problems(config),
        *_range_problems(config, _RANGES),
        *_privacy_problems(config),
        *_tokenizer_problems(config),
        *_model_problems(config),
        *pretrained_privacy.pretrained_problems(config),
        *_finetune_problems(config),
        *_data_problems(config),
        *_length_bucket_problems(config),
        *_device_problems(config, device_count),
        *compilation_cache.problems(config.train.compilation_cache),
    ]


def _trained(workdir: str) -> bool:
    """Whether a session trained at least one step here (metrics logged after step 0)."""
    path = os.path.join(workdir, METRICS_FILE)
    if not os.path.exists(path):
        return False
    with open(path) as f:
        for line in f:
            try:
                if json.loads(line).get("step", 0) > 0:
                    return True
            except (json.JSONDecodeError, AttributeError):
                return True  # Unreadable: assume the worst.
    return False


def _is_bound(workdir: str) -> tuple[bool, bool]:
    """(bound in every field, holds a learnt vocabulary).

    Every field binds once a checkpoint exists, or once a session trained
    (metrics after step 0 may be published, and the noise seed in private/ is
    reused by a rerun: a different config would be a second, unaccounted use).
    """
    checkpoints = os.path.join(workdir, CHECKPOINT_DIR)
    has_checkpoint = os.path.isdir(checkpoints) and bool(os.listdir(checkpoints))
    fully = has_checkpoint or _trained(workdir)
    return fully, os.path.exists(os.path.join(workdir, TOKENIZER_FILE))


def _depends_vocabulary(field: str) -> bool:
    return any(field == f or (f.endswith(".") and field.startswith(f)) for f in VOCABULARY_FIELDS)


def binding_changes(workdir: str, config: ml_collections.ConfigDict) -> list[str]:
    """Fields in which `config` differs from the run `workdir` is bound to.

    A workdir is bound once it holds a checkpoint or trained a step (every
    field but `NOT_BINDING_FIELDS` counts), or a learnt vocabulary only (only
    `VOCABULARY_FIELDS` count: nothing else has been spent or released yet).

    Returns:
      The differing fields, sorted; empty when unbound or the same.
    """
    return _binding_diff(workdir, config)[0]


def _binding_diff(workdir: str, config: ml_collections.ConfigDict) -> tuple[list[str], dict, dict]:
    """(`binding_changes`, the run's flattened config.json, `config` flattened)."""
    path = os.path.join(workdir, CONFIG_FILE)
    fully_bound, has_vocabulary = _is_bound(workdir)
    if not os.path.exists(path) or not (fully_bound or has_vocabulary):
        return [], {}, {}
    with open(path) as f:
        previous = flatten(json.load(f))
    current = flatten(json.loads(config.to_json_best_effort()))
    # A field newer than the workdir's config.json, at its default, is not a
    # change: new fields default to the behaviour the run had.
    defaults = flatten(json.loads(config_lib.base_config().to_json_best_effort()))
    newer = {k for k in current.keys() - previous.keys() if defaults.get(k, ...) != current[k]}
    changed = sorted(
        (previous.keys() - current.keys())
        | newer
        | {k for k, v in current.items() if previous.get(k, v) != v}
    )
    changed = [k for k in changed if k not in NOT_BINDING_FIELDS]
    if not fully_bound:
        changed = [k for k in changed if _depends_vocabulary(k)]
    return changed, previous, current


def workdir_problems(
    workdir: str | None, config: ml_collections.ConfigDict | None = None
) -> list[str]:
    """Problems of a train workdir: unset, a file, a sweep folder, unwritable, bound elsewhere."""
    if not workdir:
        return ["--workdir is required: the run's output folder."]
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        return [f"--workdir={workdir} is a file; give a folder."]
    if os.path.exists(os.path.join(workdir, SWEEP_MANIFEST_FILE)):
        return [
            f"--workdir={workdir} is a sweep folder (it holds {SWEEP_MANIFEST_FILE}); train in a "
            "new folder, or rerun the sweep (python -m dpnmt.sweep) to resume its runs."
        ]
    existing = workdir
    while existing and not os.path.exists(existing):
        existing = os.path.dirname(existing.rstrip(os.sep)) or "."
    if not os.access(existing, os.W_OK):
        return [f"--workdir={workdir} is not writable ({existing}); choose another folder."]
    if config is not None:  # config.json holds the published config (no noise seed).
        changed, run, now = _binding_diff(workdir, config_lib.published_config(config))
        if changed:
            differ = "; ".join(
                f"{k}: run {run.get(k, '(absent)')!r}, now {now.get(k, '(absent)')!r}"
                for k in changed
            )
            resume = " ".join(f"--config.{k}={run[k]}" for k in changed if k in run and k in now)
            return [
                f"--workdir={workdir} holds a run with a different config (fields differ: "
                f"{differ}); use a new --workdir, or resume with the run's values"
                + (f": {resume}" if resume else "")
                + "."
            ]
    return []


def sweep_workdir_problems(workdir: str) -> list[str]:
    """Problems of a sweep folder: it must not be a training run's workdir."""
    held = [
        n
        for n in (CONFIG_FILE, CHECKPOINT_DIR, TOKENIZER_FILE)
        if os.path.exists(os.path.join(workdir, n))
    ]
    if held and not os.path.exists(os.path.join(workdir, SWEEP_MANIFEST_FILE)):
        return [
            f"--workdir={workdir} holds a training run ({', '.join(held)}), not a sweep; give "
            "the sweep a folder of its own."
        ]
    return []


def raise_problems(problems: list[str]) -> None:
    """Raises them as one `ConfigError`, one per line (nothing when empty)."""
    if problems:
        if len(problems) == 1:
            raise ConfigError(problems[0])
        raise ConfigError(f"{len(problems)} problems:\n" + "\n".join(f"  {p}" for p in problems))


def check_static(config: ml_collections.ConfigDict, workdir: str | None) -> None:
    """Raises every problem of `config` and `workdir` found without reading the corpus."""
    raise_problems(
        [
            *config_problems(config),
            *workdir_problems(workdir, config),
            *cache_in_workdir_problems(config, workdir),
        ]
    )


def cache_in_workdir_problems(config: ml_collections.ConfigDict, workdir: str | None) -> list[str]:
    """A compilation cache inside the published workdir (outside its private/) is refused.

    Which shapes compile can depend on private lot content (length buckets).
    """
    folder = compilation_cache.resolve(config.train.compilation_cache)
    if not workdir or folder is None or compilation_cache.problems(config.train.compilation_cache):
        return []
    folder, root = os.path.realpath(folder), os.path.realpath(workdir)
    private = os.path.join(root, PRIVATE_DIR)
    inside = os.path.commonpath([folder, root]) == root
    if inside and os.path.commonpath([folder, private]) != private:
        return [
            f"train.compilation_cache resolves to {folder}, inside --workdir={workdir} "
            "(published): which shapes compile can depend on private lots; use a folder "
            f"outside it or under its {PRIVATE_DIR}/."
        ]
    return []


def kept_pairs(train, pair: str) -> int:
    """N: train pairs `preprocess` keeps (neither side empty), from the text alone."""
    direction = languages.parse_pair(pair)
    kept = 0
    for batch in train.iter(batch_size=10_000):
        sources = [t[direction.source] for t in batch["translation"]]
        targets = [t[direction.target] for t in batch["translation"]]
        source_empty, target_empty = preprocess.empty_sides(sources, targets)
        kept += sum(not (s or t) for s, t in zip(source_empty, target_empty, strict=True))
    return kept


def size_problems(config: ml_collections.ConfigDict, dataset_size: int) -> list[str]:
    """Problems that need N: the lot size below N, a reachable target ε.

    Reachability is one accountant evaluation at the largest σ the calibration
    tries (the run calibrates σ itself, once).
    """
    dp = ml_collections.ConfigDict(config.dp.to_dict())
    calibrate = dp.enabled and dp.noise_multiplier is None and dp.target_epsilon is not None
    if calibrate:
        dp.noise_multiplier = 1.0  # Stand-in: the plan's L, N, q and T do not depend on σ.
    try:
        plan = privacy.plan_privacy(dp, config.train, dataset_size)
    except ValueError as error:
        return [str(error)]
    if not calibrate:
        return []
    largest = core.accounting._MAX_NOISE_MULTIPLIER  # noqa: SLF001 - the calibration's range.
    reached = dataclasses.replace(plan, noise_multiplier=largest).epsilon_after(plan.num_steps)
    if reached > dp.target_epsilon:
        return [
            f"dp.target_epsilon={dp.target_epsilon:g} is unreachable: even σ={largest:g} gives "
            f"ε={reached:.4g} (N={dataset_size}, q={plan.sampling_rate:.4g}, "
            f"T={plan.num_steps}, {plan.sampling}); raise dp.target_epsilon or dp.delta, or "
            "lower train.num_epochs."
        ]
    return []


def suggested_delta(dataset_size: int) -> float:
    """1/(10N) rounded down to a power of ten: a δ well below 1/N."""
    return 10.0 ** math.floor(math.log10(1.0 / (10 * dataset_size)))


def delta_problems(config: ml_collections.ConfigDict, dataset_size: int) -> list[str]:
    """A private run's total δ at or above 1/N is refused unless `dp.allow_large_delta`.

    δ ≥ 1/N admits a mechanism that publishes a random training example in full.
    The total is DP-SGD's δ plus the DP vocabulary's and a composed pretrained
    export's (`training.pretrained_privacy`).
    """
    dp = config.dp
    if not dp.enabled or dp.allow_large_delta or not isinstance(dp.delta, (int, float)):
        return []
    parts = [f"dp.delta={dp.delta:g}"]
    total = float(dp.delta)
    if config_lib.tokenizer_kind(config) == "dp_sentencepiece":
        total += float(config.tokenizer.dp_delta)
        parts.append(f"tokenizer.dp_delta={config.tokenizer.dp_delta:g}")
    claim = pretrained_privacy.pretrained_claim(config)
    if claim is not None and claim.composed and claim.composed_delta:
        total += claim.composed_delta
        parts.append(f"the pretrained export's δ={claim.composed_delta:g}")
    if total * dataset_size < 1:
        return []
    parts_text = parts[0] if len(parts) == 1 else f"{' + '.join(parts)}: total δ={total:g}"
    return [
        f"{parts_text} is at least 1/N = {1 / dataset_size:.3g} (N={dataset_size} training "
        "pairs after preprocessing): such a δ allows publishing a random training example "
        f"in full. Use e.g. dp.delta={suggested_delta(dataset_size):g} (1/(10N) rounded "
        "down to a power of ten), or set dp.allow_large_delta=True to accept it."
    ]


def _path_pieces(description: str) -> list[str]:
    """The file paths a split's recorded origin names (`corpora.common.make_corpus`)."""
    origin = re.sub(r"^\w+: ", "", description)
    origin = re.sub(r"^last \d+ \w+ of ", "", origin)
    origin = re.sub(r" less its last \d+ \w+$", "", origin)
    pieces = origin.split(" + ") + origin.split()
    return [p for p in pieces if os.path.isfile(p)]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _text_digest(lines: Iterable[str]) -> str:
    """Digest of the set of non-blank text lines: their order and repeats do not count.

    A file with a split side's sentences reordered (or deduplicated) is still
    that side's text.
    """
    distinct = sorted({line.strip() for line in lines} - {""})
    return _sha256("\n".join(distinct).encode("utf-8"))


def public_text_problems(config: ml_collections.ConfigDict, corpus) -> list[str]:
    """`tokenizer.public_text_paths` must not be the private corpus's own text.

    A private run (`sentencepiece_public`) refuses a path that resolves to a
    file its corpus was read from (any split), or whose bytes, or set of text
    lines (in any order), equal such a file or one language side of a split
    (the split as loaded: one corpus, unshuffled), or whose lines hold more
    than `overlap.OVERLAP_LIMIT` of a private split side's sentences: a
    vocabulary learnt from it would be learnt from the private data without
    DP, reported as ε 0.
    """
    if not config.dp.enabled or config_lib.tokenizer_kind(config) != "sentencepiece_public":
        return []
    by_path, by_bytes, by_text = {}, {}, {}
    sides = overlap.private_sides(corpus, _private_splits(corpus))
    for split, dataset in corpus.items():
        for path in _path_pieces(dataset.info.description or ""):
            by_path.setdefault(os.path.realpath(path), split)
            with open(path, "rb") as f:
                by_bytes.setdefault(_sha256(f.read()), split)
        translations = dataset["translation"]
        for language in translations[0] if len(translations) else ():
            by_text.setdefault(_text_digest(row[language] for row in translations), split)
    problems = []
    for path in config.tokenizer.public_text_paths:
        if not os.path.isfile(path):
            continue  # Named by the static checks.
        with open(path, "rb") as f:
            data = f.read()
        split, how = by_path.get(os.path.realpath(path)), "is"
        if split is None:
            split, how = by_bytes.get(_sha256(data)), "has the same bytes as"
        if split is None:
            text = data.decode("utf-8", errors="replace").splitlines()
            split, how = by_text.get(_text_digest(text)), "has the same lines as"
        if split is not None:
            problems.append(
                f"tokenizer.public_text_paths: {path} {how} the {split} split of this run's "
                f"corpus ({config.data.corpus}), not public text: a vocabulary learnt from it "
                "is learnt from the private data without DP, yet reported as ε 0. Give public "
                "text that is not this run's data, or use tokenizer.kind='dp_sentencepiece' "
                "(its ε is added), or 'sentencepiece_private' with "
                "tokenizer.private_data_ok=True (the report then says ε = ∞)."
            )
            continue
        text = overlap.text_sentence_set(data.decode("utf-8", errors="replace").splitlines())
        found = overlap.large_overlaps(text, sides)
        if found:
            problems.append(_overlap_message(f"tokenizer.public_text_paths: {path}", found, config))
    return problems


def _private_splits(corpus) -> list[str]:
    """The splits of `corpus` that are private: train, and a validation carved from it."""
    from dpnmt.training import pieces  # Deferred: pieces imports this module.

    return ["train", "validation"] if pieces.validation_is_carved_from_train(corpus) else ["train"]


def _overlap_message(where: str, found: list, config) -> str:
    return (
        f"{where} holds {'; '.join(o.describe() for o in found)} of this DP run's corpus "
        f"({config.data.corpus}), up to case and spacing: that text is not public (more than "
        f"{overlap.OVERLAP_LIMIT:.0%} of a private side shared is refused), and a vocabulary "
        "learnt from it is learnt from the private data without DP, yet reported as ε 0. "
        "Give public text that does not contain this run's data, or use "
        "tokenizer.kind='dp_sentencepiece' (its ε is added)."
    )


def public_corpora_content_problems(config: ml_collections.ConfigDict, corpus) -> list[str]:
    """`tokenizer.public_corpora` must not hold the private corpus's sentences.

    `public_corpora_problems` compares names and folders; this compares text, so
    a copy under another name, a reordered or partial copy, or the folder a
    `wmt16` or `hub:` corpus was read from all count. A DP run refuses a public
    corpus whose train split (both sides) holds more than `overlap.OVERLAP_LIMIT`
    of the distinct sentences of a side of a private split (a copy holds all).
    Reads the public corpora (a few seconds): `check_run` calls it, before
    anything is written.
    """
    spec = config.tokenizer.get("public_corpora", "")
    if not spec or not config.dp.enabled:
        return []
    if config_lib.tokenizer_kind(config) != "sentencepiece_public":
        return []
    sides = overlap.private_sides(corpus, _private_splits(corpus))
    problems = []
    for name, lines in public_vocab.public_texts(public_vocab.PublicVocabSpec.from_config(config)):
        found = overlap.large_overlaps(overlap.sentence_set(lines), sides)
        if found:
            where = f"tokenizer.public_corpora: {name!r}"
            problems.append(_overlap_message(where, found, config))
    return problems


def check_run(
    config: ml_collections.ConfigDict,
    workdir: str | None,
    *,
    load_corpus: Callable[[ml_collections.ConfigDict], Any],
    corpus_transform: Callable[[Any], Any] | None = None,
) -> None:
    """Validates a training run completely before it writes a file or spends privacy.

    First the config and workdir alone (`check_static`), then, from the corpus
    text (reading it writes nothing), what needs N (L < N, a reachable ε, δ
    below 1/N) or the text itself (public vocabulary text that is the corpus's).

    Args:
      config: the resolved experiment config.
      workdir: the run's folder (need not exist).
      load_corpus: `config -> DatasetDict` (`training.pieces.load_corpus`).
      corpus_transform: as for `training.loop.train_and_evaluate`.

    Raises:
      ConfigError: every problem found, one line each.
      InputError: the corpus cannot be loaded (missing files, offline hub, ...).
    """
    check_static(config, workdir)
    logging.disable(logging.INFO)  # The run loads it again and logs that.
    try:
        corpus = load_corpus(config)
    finally:
        logging.disable(logging.NOTSET)
    if corpus_transform is not None:
        corpus = corpus_transform(corpus)
    dataset_size = kept_pairs(corpus["train"], config.data.pair)
    problems = size_problems(config, dataset_size)
    if not problems:  # The plan is sound: its δ against N.
        problems = delta_problems(config, dataset_size)
    public = public_text_problems(config, corpus) + public_corpora_content_problems(config, corpus)
    raise_problems([*public, *problems])
