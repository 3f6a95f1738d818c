"""Builds each piece of a run from its config: corpus, tokenizer, tokenized splits, model.

Shared by training (`dpnmt.training.setup.build_run` puts them in order) and
decoding (`dpnmt.evaluation.decode`), so both see the same data and model. Each
public function takes the section it reads (`DataConfig`, `ModelConfig`), or the
`RunConfig` where it needs several, and hands its helpers only those sections.
"""

import contextlib
import dataclasses
import json
import logging
import os
from typing import Any

import datasets
import jax

from dpnmt import models
from dpnmt.config import RunConfig
from dpnmt.config.sections import DataConfig, ModelConfig, TokenizerConfig
from dpnmt.data import (
    concatenation,
    corpora,
    dp_sentencepiece,
    groups,
    health,
    objectives,
    public_vocab,
    sentinels,
    text_objective,
    tokenizers,
)
from dpnmt.data import preprocess as preprocess_lib
from dpnmt.data.corpora.common import validation_is_carved_from_train
from dpnmt.data.languages import parse_pair
from dpnmt.errors import ConfigError, ModelUnavailableError
from dpnmt.models import lora
from dpnmt.models.vocabulary import grow_vocabulary
from dpnmt.training import pretrained_privacy
from dpnmt.training.run_dir import (
    TOKENIZER_FILE,
    VOCABULARY_RECORD_FILE,
)


def load_corpus(data: DataConfig) -> datasets.DatasetDict:
    """The corpus named by the `data` section, train split limited if asked."""
    options = data.corpus_options()  # data.dir -> data_dir, ...
    first = corpora.mixture.first_registry_name(data.corpus)
    if data.objective != "translation" and "monolingual_language" in corpora.accepted_options(
        first
    ):
        options["monolingual_language"] = data.text_language  # `files:` may hold it alone.
    corpus = corpora.load_corpora(
        data.corpus, data.pair, weights=tuple(data.corpus_weights), **options
    )
    if data.objective != "translation":
        corpus = text_objective.monolingual_corpus(corpus, data.text_language)
    limit = data.max_train_examples
    if limit is not None and limit < len(corpus["train"]):
        # Not how many there were: the private split's exact size is not logged.
        logging.info("Keeping the first %d training pairs (data.max_train_examples).", limit)
        corpus["train"] = corpus["train"].select(range(limit))
    corpus["train"] = concatenation.for_data(corpus["train"], data)  # Public runs only.
    return corpus


def largest_group(corpus: datasets.DatasetDict) -> int | None:
    """Pairs in the train split's largest group (its privacy unit), None if it names none."""
    sizes = groups.summarize(corpus["train"])
    return None if sizes is None else sizes.largest


@contextlib.contextmanager
def _hub_errors(name_or_path: str):
    """Turns "cannot reach the hub" into a message that says what to do."""
    try:
        yield
    except OSError as error:
        if os.path.isdir(name_or_path):
            raise
        raise ModelUnavailableError(
            f"model.name_or_path={name_or_path!r} could not be loaded: it is not a local "
            "directory and the Hugging Face hub could not be reached (offline?). Download it "
            "where you have internet and set --config.model.name_or_path to the local "
            f"directory. Original error: {error}"
        ) from error


def _mbart_langs(model: ModelConfig, data: DataConfig) -> tuple[str | None, str | None]:
    if model.family != "mbart":
        return None, None
    from dpnmt.data.languages import mbart_codes

    pair = parse_pair(data.pair)
    return mbart_codes(pair)


def _export_vocabulary(
    name_or_path: str, record: tokenizers.VocabularyRecord
) -> tokenizers.VocabularyRecord:
    """A dpnmt export's vocabulary is its run's: say so, and where its ε is accounted."""
    try:
        is_export, export_record = pretrained_privacy.read_export_record(name_or_path)
    except pretrained_privacy.RecordUnreadable:  # Private runs: refused unless declared disjoint.
        return dataclasses.replace(
            record,
            note=f"{record.note}; whether it is a dpnmt export's vocabulary (then the export's, "
            "accounted under 'pretrained') is unknown: its dpnmt.json could not be read",
        )
    if not is_export:
        return record
    kind = ((export_record or {}).get("vocabulary") or {}).get("kind", "unknown")
    return dataclasses.replace(
        record,
        note=f"the pretrained dpnmt export's own vocabulary ({kind} in its run): its privacy "
        "is the export's, accounted under 'pretrained'",
    )


def _with_added(record, tokenizer) -> tokenizers.VocabularyRecord:
    """The pretrained vocabulary's record, saying which sentinels the run appended."""
    added = sentinels.added_sentinels(tokenizer)
    if not added:
        return record
    return dataclasses.replace(
        record,
        note=f"{record.note}; {added} T5 sentinels appended (tokenizer.sentinels, no data used)",
        details={**record.details, "vocab_size": tokenizer.vocab_size, "sentinels_added": added},
    )


def build_tokenizer(
    run: RunConfig,
    corpus: datasets.DatasetDict,
    workdir: str,
    *,
    noise_seed: int | None,
    learn: bool = True,
) -> tuple[tokenizers.Tokenizer, tokenizers.VocabularyRecord]:
    """The run's tokenizer: reloaded from `workdir` if saved, else built and saved.

    A vocabulary learnt from the private split is saved on first use and always
    reloaded afterwards: learning it again would spend its privacy again.

    Args:
      run: the run config (its `tokenizer`, `model` and `data` sections).
      corpus: the loaded corpus (its train split is private).
      workdir: the run's folder.
      noise_seed: seed of DP-SentencePiece's noise (private).
      learn: False (resume, decode): only load the saved vocabulary; a missing
        one is an error, never a reason to learn (and spend privacy) again.

    Returns:
      (tokenizer, record of how the vocabulary was made).
    """
    kind = run.tokenizer_kind
    src_lang, tgt_lang = _mbart_langs(run.model, run.data)
    if kind == "pretrained":
        name_or_path = run.model.name_or_path
        if name_or_path is None:
            raise ValueError("tokenizer.kind='pretrained' needs model.name_or_path.")
        with _hub_errors(name_or_path):
            tokenizer, record = tokenizers.load_pretrained_tokenizer(
                name_or_path, src_lang=src_lang, tgt_lang=tgt_lang
            )
        tokenizer = sentinels.with_sentinels(tokenizer, run.tokenizer.sentinels)
        return tokenizer, _with_added(_export_vocabulary(name_or_path, record), tokenizer)
    model_path = os.path.join(workdir, TOKENIZER_FILE)
    record_path = os.path.join(workdir, VOCABULARY_RECORD_FILE)
    if os.path.exists(model_path) and os.path.exists(record_path):
        with open(record_path) as f:
            record = tokenizers.VocabularyRecord(**json.load(f))
        return tokenizers.SentencePieceTokenizer.load(model_path), record
    if not learn or os.path.exists(model_path) or os.path.exists(record_path):
        raise FileNotFoundError(
            f"{workdir} lacks its saved vocabulary ({TOKENIZER_FILE} and "
            f"{VOCABULARY_RECORD_FILE} are both needed). It is not learnt again from the "
            "private data: restore the files, or train in a new workdir."
        )
    tokenizer, record = _learn_vocabulary(
        run.tokenizer, kind, run.data.pair, corpus, noise_seed, prefix_words(run)
    )
    health.log_warnings(
        [health.vocabulary_warning(run.tokenizer.vocab_size, tokenizer.vocab_size, kind)]
    )
    os.makedirs(workdir, exist_ok=True)
    tokenizer.save(model_path)
    with open(record_path, "w") as f:
        json.dump(dataclasses.asdict(record), f, indent=2, default=str)
    return tokenizer, record


def prefix_words(run: RunConfig) -> tuple[str, ...]:
    """The words of the source prefix `preprocess` puts before every source (public text)."""
    pair = parse_pair(run.data.pair)
    prefix = preprocess_lib.family_source_prefix(run.model.family, pair, run.model.source_prefix)
    return tuple(prefix.split())


def _learn_vocabulary(
    settings: TokenizerConfig,
    kind: str,
    pair_name: str,
    corpus: datasets.DatasetDict,
    noise_seed: int | None,
    public_words: tuple[str, ...] = (),
) -> tuple[tokenizers.Tokenizer, tokenizers.VocabularyRecord]:
    """A new vocabulary of the resolved `kind` (DP, public or, if accepted, private text).

    `public_words` (the source prefix's) join a DP vocabulary's survivors at no ε.
    """
    pair = parse_pair(pair_name)
    train = corpus["train"]["translation"]
    common = dict(
        vocab_size=settings.vocab_size,
        model_type=settings.model_type,
        sentinels=settings.sentinels,
    )
    if kind == "dp_sentencepiece":
        params = dp_sentencepiece.DPVocabularyParams(
            noise_stddev=settings.dp_noise_stddev,
            delta=settings.dp_delta,
            max_words=settings.dp_max_words,
        )
        examples = [(row[pair.source], row[pair.target]) for row in train]
        tokenizer, record = dp_sentencepiece.train_dp_sentencepiece(
            examples, params=params, seed=noise_seed, public_words=public_words, **common
        )
    elif kind == "sentencepiece_public" and settings.public_corpora:
        built = public_vocab.build_public_vocabulary(
            public_vocab.PublicVocabSpec.from_sections(settings, pair_name)
        )
        logging.info(
            "Public vocabulary (%s): %s.", "learnt" if built.built else "cached", built.record.note
        )
        tokenizer, record = built.tokenizer, built.record
    elif kind == "sentencepiece_public":
        tokenizer, record = tokenizers.train_sentencepiece(
            list(settings.public_text_paths), **common
        )
    elif kind == "sentencepiece_private":
        texts = [row[side] for row in train for side in (pair.source, pair.target)]
        tokenizer, record = tokenizers.train_private_sentencepiece(
            texts, private_data_ok=settings.private_data_ok, **common
        )
    else:
        raise ValueError(
            f"tokenizer.kind={kind!r} is unknown; use auto, pretrained, dp_sentencepiece, "
            "sentencepiece_public or sentencepiece_private."
        )
    return tokenizer, record


def make_objective(
    data: DataConfig, tokenizer: tokenizers.Tokenizer
) -> text_objective.TextObjective | None:
    """The run's pre-training objective (None: translation), a public function of each text.

    Its draws come from the public `data.objective_seed` alone (`text_objective`), so
    training, decode (zero-shot too), noise-to-signal and the memorization audit build
    the same examples, from a published copy of the run as well.

    Raises:
      ValueError: span corruption and the tokenizer lacks the sentinels it needs.
    """
    if data.objective == "translation":
        return None
    sentinels = []
    if data.objective == "span_corruption":
        needed = objectives.span_count(
            data.max_source_length - 1,
            noise_density=data.noise_density,
            mean_span_length=data.mean_span_length,
        )
        sentinels = text_objective.sentinel_ids(tokenizer, needed)
    return text_objective.TextObjective(
        data.objective,
        data.objective_seed,
        sentinel_ids=sentinels,
        noise_density=data.noise_density,
        mean_span_length=data.mean_span_length,
        prefix_min_fraction=data.prefix_min_fraction,
        prefix_max_fraction=data.prefix_max_fraction,
    )


def tokenize_corpus(
    run: RunConfig,
    corpus: datasets.DatasetDict,
    tokenizer: tokenizers.Tokenizer,
    objective: text_objective.TextObjective | None = None,
) -> tuple[datasets.DatasetDict, preprocess_lib.PreprocessStats]:
    """Tokenized splits (input_ids, labels, ...) and the drop/truncation counts.

    `objective`: the run's (`make_objective`), needed when `data.objective` is one.
    """
    _check_objective(run.data, objective)
    options = _preprocess_options(run.data, run.model)
    tokenized, stats = preprocess_lib.preprocess(corpus, tokenizer, objective=objective, **options)
    carved, per_pair = validation_is_carved_from_train(corpus), run.dp.unit != "group"
    warnings = health.truncation_warnings(
        stats, tokenized, validation_is_private=carved, pairs_are_public=per_pair
    )
    health.log_warnings(warnings)
    return tokenized, stats


def _check_objective(data: DataConfig, objective) -> None:
    if (data.objective == "translation") != (objective is None):
        raise ValueError(
            f"data.objective={data.objective!r} needs the run's TextObjective "
            "(pieces.make_objective) exactly when it is a pre-training objective."
        )


def _preprocess_options(data: DataConfig, model: ModelConfig) -> dict:
    """`preprocess`'s keyword arguments from the data and model sections."""
    prefix = model.source_prefix
    if prefix is None and data.objective != "translation":
        prefix = ""  # No task prefix ("translate ...") before a pre-training text.
    return dict(
        pair=data.pair,
        family=model.family,
        max_source_length=data.max_source_length,
        max_target_length=data.max_target_length,
        source_prefix=prefix,
    )


TOKENIZE_TRAIN_MODES = ("auto", "upfront", "per_lot")


def tokenizes_train_per_lot(data: DataConfig) -> bool:
    """Whether the train split is tokenized per lot (`data.tokenize_train`)."""
    if data.tokenize_train not in TOKENIZE_TRAIN_MODES:
        raise ValueError(
            f"data.tokenize_train={data.tokenize_train!r} is unknown; use one of "
            f"{TOKENIZE_TRAIN_MODES}."
        )
    return data.tokenize_per_lot(jax.process_count())


def tokenize_train_on_demand(
    run: RunConfig,
    split: datasets.Dataset,
    tokenizer: tokenizers.Tokenizer,
    objective: text_objective.TextObjective | None = None,
) -> tuple[preprocess_lib.OnDemandSplit, preprocess_lib.SplitStats]:
    """The train split as `tokenize_corpus` would give it, tokenized only when fetched."""
    _check_objective(run.data, objective)
    options = _preprocess_options(run.data, run.model)
    return preprocess_lib.preprocess_on_demand(split, tokenizer, objective=objective, **options)


def trainable_predicate(model: ModelConfig):
    """`(path, leaf) -> bool`: which parameters get per-example gradients.

    `model.finetune`: "lora" the adapters only, "bias" the bias terms only,
    "all" everything `model.trainable` matches (everything when unset).
    """
    if model.finetune == "lora":
        return models.is_adapter
    if model.finetune == "bias":
        return models.bias_only
    if model.trainable:
        return models.regex_trainable(model.trainable)
    return lambda path, leaf: True


def split_trainable(model: ModelConfig, params) -> tuple[Any, Any]:
    """(trainable, frozen) parameters by `trainable_predicate`.

    Raises:
      ConfigError: nothing is trainable (e.g. `model.finetune='bias'` on a T5).
    """
    try:
        return models.split_params(params, trainable_predicate(model))
    except ValueError as error:
        if model.finetune == "bias":
            raise ConfigError(
                "model.finetune='bias' trains only bias terms, and this model has none (T5 "
                "and mT5 layers are bias-free): use model.finetune='lora' or 'all', or an "
                "mBART model."
            ) from error
        raise ConfigError(f"model.trainable={model.trainable!r}: {error}") from error


def lora_spec(model: ModelConfig) -> models.LoRASpec:
    """The adapters `model.lora_*` ask for (none when `model.lora_rank` is 0)."""
    if not model.lora_rank:
        return models.LoRASpec()
    return models.LoRASpec(
        rank=model.lora_rank, alpha=model.lora_alpha, targets=model.lora_target_names
    )


def _with_adapters(model: ModelConfig, model_config, params, rng) -> tuple[Any, Any, Any]:
    """The model with `model.lora_*` adapters: base `params` kept, adapters initialised."""
    spec = lora_spec(model)
    if not spec.enabled:
        return models.create_model(model_config), model_config, params
    problem = lora.check_targets(spec.targets, lora.targets_of(model_config))
    if problem:
        raise ConfigError(f"model.lora_targets={model.lora_targets!r}: {problem}")
    model_config = dataclasses.replace(model_config, lora=spec)
    model = models.create_model(model_config)
    return model, model_config, models.add_adapters(model, params, jax.random.fold_in(rng, 1))


def build_model(
    model: ModelConfig, tokenizer: tokenizers.Tokenizer, rng: jax.Array
) -> tuple[Any, Any, Any]:
    """(flax module, its model config, initial params): pretrained or from scratch.

    With `model.lora_rank` > 0 the model carries adapters (`models.LoRASpec`):
    the base weights as without them, the adapters from `rng` (B = 0, so the
    initial model computes the same function).
    """
    if model.name_or_path is not None:
        with _hub_errors(model.name_or_path):
            pretrained, params, _ = models.load_pretrained(model.name_or_path)
        # Rows for the sentinels build_tokenizer appended (public init: models.vocabulary).
        added = sentinels.added_sentinels(tokenizer)
        params, config = grow_vocabulary(
            params, pretrained.config, added, total=tokenizer.vocab_size
        )
        return _with_adapters(model, config, params, rng)
    gated = model.feed_forward_proj.startswith("gated-")
    model_config = models.T5Config(
        model_type="t5",
        vocab_size=tokenizer.vocab_size,
        d_model=model.d_model,
        d_kv=model.d_kv,
        d_ff=model.d_ff,
        num_layers=model.num_layers,
        num_decoder_layers=model.num_decoder_layers,
        num_heads=model.num_heads,
        dropout_rate=model.dropout_rate,
        feed_forward_proj=model.feed_forward_proj,
        tie_word_embeddings=not gated,
        scale_decoder_outputs=not gated,
        pad_token_id=tokenizer.pad_id,
        eos_token_id=tokenizer.eos_id,
        decoder_start_token_id=tokenizer.pad_id,
    )
    params = models.init_params(models.create_model(model_config), rng)
    return _with_adapters(model, model_config, params, rng)
