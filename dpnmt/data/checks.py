"""What the `data` section asks of the corpora that exist, and N from a corpus's text.

The rules the data section alone can check are `dpnmt.config.DataConfig.problems`.
"""

import functools
import os
import re

from dpnmt.config import DataConfig, PrivacyConfig
from dpnmt.data import (
    corpora,
    dp_sentencepiece,
    groups,
    languages,
    objectives,
    preprocess,
    sentinels,
    tokenizers,
)
from dpnmt.errors import InputError
from dpnmt.models.checks import local_hf_config

# A learnt SentencePiece here has pad, eos and unk, 256 byte pieces (byte
# fallback) and one piece per character it covers (coverage 1.0), before any word.
SPECIAL_PIECES, BYTE_PIECES = 3, 256
_LEARNT = ("dp_sentencepiece", "sentencepiece_private")
# A DP vocabulary keeps a word only if it occurs in more than C pairs (its
# threshold); below N = PAIRS_PER_THRESHOLD * C few words pass and sentences are
# spelt in characters (2,000 Multi30K pairs at σ 20: C = 136, 43 words, 1,433 of
# the 2,000 T5 sources longer than 64 pieces; docs/data.md "Small corpora").
PAIRS_PER_THRESHOLD = 200


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


def kept_groups(train, pair: str) -> list | None:
    """The group label of each train pair `preprocess` keeps, in order (None: no groups).

    Row i is the group of kept pair i, the example i of the training set
    (tokenized up front or per lot), so lots of groups index the examples.
    """
    if groups.GROUP_COLUMN not in train.column_names:
        return None
    direction = languages.parse_pair(pair)
    labels = []
    for batch in train.iter(batch_size=10_000):
        sources = [t[direction.source] for t in batch["translation"]]
        targets = [t[direction.target] for t in batch["translation"]]
        source_empty, target_empty = preprocess.empty_sides(sources, targets)
        labels += [
            label
            for label, s, t in zip(
                batch[groups.GROUP_COLUMN], source_empty, target_empty, strict=True
            )
            if not (s or t)
        ]
    return labels


def corpus_identity(registry_name: str) -> str:
    """What a corpus name reads: a `files:` folder's real path, else the name itself."""
    corpus, argument = corpora.lookup(registry_name)
    if corpus.name == "files":
        return "files:" + os.path.realpath(corpora.files.resolve_folder(argument))
    return registry_name


def _mixture_problems(data: DataConfig, dp: PrivacyConfig) -> list[str]:
    """Several corpora (or weights) in `data.corpus`: well formed, and never in a DP run."""
    spec, weights = data.corpus, tuple(data.corpus_weights)
    try:
        entries = corpora.parse_corpus_names(spec)
        problems = corpora.mixture.check_weights(spec, weights)
    except InputError as error:
        return [str(error)]
    if dp.enabled and (len(entries) > 1 or weights):
        problems.append(
            f"data.corpus={spec!r}"
            + (f" with data.corpus_weights={weights!r}" if weights else "")
            + " in a private run: a DP run's N, q and guarantee come from its private corpus "
            "alone, and the accounting "
            "for mixing in (or repeating) other pairs is not implemented. Give one corpus and "
            "no weights, or pre-train on the public mixture in a non-private run first."
        )
    return problems


def concat_problems(data: DataConfig, dp: PrivacyConfig) -> list[str]:
    """Concatenated pairs (`data.concat_weight`): public translation training only."""
    if not data.concat_weight:
        return []
    if dp.enabled:
        return [
            f"data.concat_weight={data.concat_weight:g} in a private run: each pair would sit "
            "in several examples, which DP-SGD's per-example bound C does not cover. Set "
            "data.concat_weight=0, or use it in a non-private run on public data."
        ]
    if data.objective != "translation":
        return [
            f"data.concat_weight={data.concat_weight:g} with data.objective="
            f"{data.objective!r}: concatenation joins translation pairs; set "
            "data.concat_weight=0."
        ]
    return []


def objective_problems(run) -> list[str]:
    """A pre-training objective (`data.objective`) with mBART, or too few sentinels.

    Args:
      run: the `RunConfig` (its data, model and tokenizer sections).
    """
    data = run.data
    if data.objective == "translation":
        return []
    if run.model.family == "mbart":
        return [
            f"data.objective={data.objective!r} with model.family='mbart': mBART's language "
            "codes have no place in a monolingual example; use a T5 model (family t5 or none)."
        ]
    try:
        kind = run.tokenizer_kind
    except InputError:
        return []  # Named by the tokenizer problems.
    if data.objective != "span_corruption":
        return []
    needed = objectives.span_count(
        data.max_source_length - 1,
        noise_density=data.noise_density,
        mean_span_length=data.mean_span_length,
    )
    count = run.tokenizer.sentinels
    if kind == "pretrained" and _pretrained_has_sentinels(run.model) is not False:
        return []  # Its own (a hub model's are looked up when it loads).
    if count < needed:
        what = "appended to the pretrained tokenizer" if kind == "pretrained" else "reserved"
        return [
            f"data.objective='span_corruption' on texts of up to {data.max_source_length - 1} "
            f"tokens uses up to {needed} sentinels, but tokenizer.sentinels="
            f"{count}; set tokenizer.sentinels >= {needed} (<extra_id_i> pieces {what}: "
            "no privacy cost)."
        ]
    return []


def _local_pretrained_tokenizer(model):
    """A local pretrained folder's tokenizer (None: not a local folder, or unreadable)."""
    path = model.name_or_path or ""
    if not os.path.isdir(path):
        return None
    stamp = tuple(sorted((e.name, e.stat().st_mtime_ns) for e in os.scandir(path)))
    return _load_local_tokenizer(path, stamp)


@functools.lru_cache(maxsize=4)
def _load_local_tokenizer(path: str, stamp: tuple):
    """Loaded once per folder state (`stamp`: its files' names and times), not per check."""
    del stamp
    try:
        return tokenizers.load_pretrained_tokenizer(path)[0]
    except (OSError, ValueError):
        return None  # Named by the model files' problems.


def _pretrained_has_sentinels(model) -> bool | None:
    """Whether a local pretrained folder's tokenizer has `<extra_id_0>` (None: not local)."""
    tokenizer = _local_pretrained_tokenizer(model)
    if tokenizer is None:
        return None
    return sentinels.has_sentinels(tokenizer)


# Parameter paths of the vocabulary-sized tables (`models.vocabulary.grow_vocabulary`).
EMBEDDING_PATH, HEAD_PATH = "shared/embedding", "lm_head/kernel"


def appended_sentinel_problems(run) -> list[str]:
    """`tokenizer.sentinels` that would be APPENDED to a local pretrained tokenizer, refused.

    Appended sentinels (`dpnmt.data.sentinels`) need span corruption (nothing
    else uses them), a T5-family model whose embedding has one row per
    tokenizer id (the new ids are the new rows), and those rows trained (the
    embedding, and an untied `lm_head`): frozen, the K new rows stay the
    near-identical public mean and the sentinels indistinct. Asked by the
    preflight, before anything is written; a hub id is checked when it loads.

    Args:
      run: the `RunConfig` (its data, model and tokenizer sections).
    """
    count, model = run.tokenizer.sentinels, run.model
    if not count or model.name_or_path is None:
        return []
    try:
        if run.tokenizer_kind != "pretrained":
            return []
    except InputError:
        return []  # Named by the tokenizer problems.
    tokenizer = _local_pretrained_tokenizer(model)
    if tokenizer is None or sentinels.has_sentinels(tokenizer):
        return []  # Not local, or has its own sentinels: nothing is appended.
    where = (
        f"tokenizer.sentinels={count} appends {count} sentinels to the tokenizer of "
        f"model.name_or_path={model.name_or_path!r} (it has none)"
    )
    if run.data.objective != "span_corruption":
        return [
            f"{where}, but data.objective={run.data.objective!r} uses no sentinels (only "
            "span_corruption does): set tokenizer.sentinels=0, or data.objective="
            "'span_corruption'."
        ]
    hf_config = local_hf_config(model.name_or_path) or {}
    model_type = str(hf_config.get("model_type"))
    if model_type not in ("t5", "mt5"):
        return [
            f"{where}, but it is a {model_type!r} model: sentinel rows are appended to T5 and "
            "mT5 models only; use a T5-family model, or a tokenizer that has sentinels "
            "(tokenizer.sentinels=0)."
        ]
    rows = hf_config.get("vocab_size")
    if rows != tokenizer.vocab_size:
        return [
            f"{where}, but its model has {rows} embedding rows and its tokenizer "
            f"{tokenizer.vocab_size} ids: the sentinels' ids would not be the new rows. Append "
            "sentinels only to a model whose config.json vocab_size equals its tokenizer's "
            "size, or use a tokenizer that has them (tokenizer.sentinels=0)."
        ]
    tables = [EMBEDDING_PATH]
    if not hf_config.get("tie_word_embeddings", True):
        tables.append(HEAD_PATH)
    if model.finetune != "all":
        frozen = tables
    elif model.trainable:
        try:
            frozen = [t for t in tables if re.search(model.trainable, t) is None]
        except re.error:
            return []  # Named when the model is split (`training.pieces.split_trainable`).
    else:
        frozen = []
    if frozen:
        how = (
            f"model.finetune={model.finetune!r}"
            if model.finetune != "all"
            else f"model.trainable={model.trainable!r}"
        )
        return [
            f"{where}, but {how} freezes {' and '.join(frozen)}: the {count} new rows would "
            "stay the near-identical public mean, the sentinels indistinct. Train them "
            "(model.finetune='all' with a model.trainable matching "
            f"{' and '.join(tables)}, or unset), or use a tokenizer that has sentinels."
        ]
    return []


def data_problems(data: DataConfig, dp: PrivacyConfig) -> list[str]:
    """Problems of the `data` section against the corpora that exist (and a DP run's one corpus).

    Args:
      data: the run's `data` section.
      dp: its `dp` section (a private run trains on one corpus).
    """
    problems = []
    try:
        languages.parse_pair(data.pair)
    except ValueError as error:
        problems.append(f"data.pair={data.pair!r}: {error}")
    mixture_problems = _mixture_problems(data, dp) + concat_problems(data, dp)
    try:
        first = corpora.mixture.first_registry_name(data.corpus)
        accepted = corpora.accepted_options(first)
    except InputError:
        return [*problems, *mixture_problems]
    problems += mixture_problems
    options = data.CORPUS_OPTIONS
    for name, option in options.items():
        value = getattr(data, name)
        if value is not None and option not in accepted:
            takes = [f"data.{f}" for f, o in options.items() if o in accepted]
            problems.append(
                f"data.{name}={value!r}: corpus {data.corpus!r} does not use it (it takes "
                f"{takes or 'none of the data options'}); unset it."
            )
    if data.dir is not None and not os.path.isdir(data.dir):
        problems.append(
            f"data.dir={data.dir!r} is not a folder; give the corpus folder (or the data "
            f"root holding it), or unset it to use ${corpora.DATA_DIR_ENV} or the download."
        )
    for entry in corpora.parse_corpus_names(data.corpus):
        corpus, argument = corpora.lookup(entry.registry_name)
        if corpus.name == "files" and not os.path.isdir(corpora.files.resolve_folder(argument)):
            problems.append(
                f"data.corpus={data.corpus!r}: folder {argument} does not exist here or "
                f"under ${corpora.DATA_DIR_ENV}; give a "
                "folder of train/validation/test files (docs/data.md: 'Your own data and model')."
            )
    return problems + private_pair_problems(data)


def private_pair_problems(data: DataConfig) -> list[str]:
    """`data.pair` against the languages the run's own `files:` folders hold (asked first)."""
    if data.objective != "translation":  # Monolingual text may hold one language only.
        return []
    try:
        pair = languages.parse_pair(data.pair)
        found = [corpora.lookup(e.registry_name) for e in corpora.parse_corpus_names(data.corpus)]
    except (ValueError, InputError):
        return []  # Named above.
    problems = [corpora.files.pair_problem(arg, pair) for c, arg in found if c.name == "files"]
    return [f"data.pair={data.pair!r}: {problem}" for problem in problems if problem]


def _distinct_characters_exceed(train, limit: int) -> bool:
    """Whether train's text (both sides) holds more than `limit` distinct characters."""
    seen: set[str] = set()
    for batch in train.iter(batch_size=10_000):
        for row in batch["translation"]:
            for text in row.values():
                seen.update(text)
        if len(seen) > limit:
            return True
    return False


def vocabulary_problems(run, train, dataset_size: int) -> list[str]:
    """A vocabulary learnt from the corpus that SentencePiece cannot build, found before any.

    Read before anything is written: too few pieces for the byte and special
    pieces and the text's characters, or (DP-SentencePiece) too few pairs for
    any word's count to pass the noisy threshold. The messages hold no count of
    the text (the refusal depends on it; nothing is logged or written).

    Args:
      run: the resolved `dpnmt.config.RunConfig`.
      train: the train split (a `datasets.Dataset` of {"translation": {...}}).
      dataset_size: N, the pairs `preprocess` keeps.

    Returns:
      One line per problem, naming the field and the fix.
    """
    kind, settings = run.tokenizer_kind, run.tokenizer
    if kind not in _LEARNT:
        return []
    floor = SPECIAL_PIECES + BYTE_PIECES
    fix = (
        "use tokenizer.vocab_size=1000 or more, or a public vocabulary "
        "(tokenizer.public_corpora, see python -m dpnmt.public_vocab)"
    )
    if settings.vocab_size <= floor + 1:  # + ▁ (SentencePiece's word boundary).
        return [
            f"tokenizer.vocab_size={settings.vocab_size} is too small for a SentencePiece "
            f"vocabulary: it needs {SPECIAL_PIECES} special and {BYTE_PIECES} byte pieces plus "
            f"one per distinct character of the text; {fix}."
        ]
    if kind == "dp_sentencepiece":
        params = dp_sentencepiece.DPVocabularyParams(
            noise_stddev=settings.dp_noise_stddev,
            delta=settings.dp_delta,
            max_words=settings.dp_max_words,
        )
        # A word in every pair passes the threshold with probability < 2.3% (2σ below it).
        if dataset_size * params.max_count_per_word + 2 * settings.dp_noise_stddev < (
            params.threshold
        ):
            return [
                f"N={dataset_size} training pairs is too few for a DP-SentencePiece vocabulary: "
                f"a word must occur in more than C={params.threshold:.1f} pairs to survive its "
                f"noise (tokenizer.dp_noise_stddev={settings.dp_noise_stddev:g}, "
                f"dp_delta={settings.dp_delta:g}), so almost surely none will. Use a public "
                "vocabulary "
                "(tokenizer.public_corpora or public_text_paths; python -m dpnmt.public_vocab), "
                "a pretrained model (model.name_or_path), or more data."
            ]
        return []  # Its characters are those of the words that survive: checked there.
    if _distinct_characters_exceed(train, settings.vocab_size - floor):
        return [
            f"tokenizer.vocab_size={settings.vocab_size} is too small for this corpus: "
            f"SentencePiece needs {SPECIAL_PIECES} special and {BYTE_PIECES} byte pieces plus "
            f"one per distinct character of the text, more than that here; {fix}."
        ]
    return []


def _dp_params(settings, noise_stddev: float) -> dp_sentencepiece.DPVocabularyParams:
    return dp_sentencepiece.DPVocabularyParams(
        noise_stddev=noise_stddev, delta=settings.dp_delta, max_words=settings.dp_max_words
    )


def small_corpus_note(run, dataset_size: int) -> str | None:
    """A note before anything is written when N is too small for a useful DP vocabulary.

    It reads only public values: N (assumed public, as in the accounting), σ,
    δ and W of the tokenizer section; never the text. It names the fixes: a
    public vocabulary, BPE (keeps the few surviving words whole), or the σ at
    which a word needs to occur in N / PAIRS_PER_THRESHOLD pairs, with its ε.

    Args:
      run: the resolved `dpnmt.config.RunConfig`.
      dataset_size: N, the pairs `preprocess` keeps.

    Returns:
      The note, or None (not DP-SentencePiece, or N large enough).
    """
    settings = run.tokenizer
    if run.tokenizer_kind != "dp_sentencepiece" or settings.dp_problems():
        return None
    params = _dp_params(settings, settings.dp_noise_stddev)
    if dataset_size >= PAIRS_PER_THRESHOLD * params.threshold:
        return None
    # C = m + σ q: the σ whose threshold is N / PAIRS_PER_THRESHOLD.
    quantile = (params.threshold - params.max_count_per_word) / params.noise_stddev
    sigma = (dataset_size / PAIRS_PER_THRESHOLD - params.max_count_per_word) / quantile
    if sigma > 0:
        smaller = _dp_params(settings, sigma)
        epsilon = max(smaller.epsilon, smaller.epsilon_analytic)
        lower = (
            f"tokenizer.dp_noise_stddev={sigma:.3g} (C={smaller.threshold:.1f}), whose vocabulary "
            f"ε is {epsilon:.3g} instead of {max(params.epsilon, params.epsilon_analytic):.3g} "
            "(added to DP-SGD's)"
        )
    else:
        lower = "no σ reaches that at this N"
    bpe = (
        " tokenizer.model_type=bpe keeps the surviving words whole (unigram splits them when few "
        "survive): on 2,000 Multi30K pairs at σ 20, 236 T5 sources over 64 pieces instead of 1,433."
        if settings.model_type == "unigram"
        else ""
    )
    return (
        f"DP-SentencePiece on N={dataset_size:,d} training pairs: a word is kept only if it occurs "
        f"in more than C={params.threshold:.1f} pairs (tokenizer.dp_noise_stddev="
        f"{settings.dp_noise_stddev:g}, dp_delta={settings.dp_delta:g}, dp_max_words="
        f"{settings.dp_max_words}), so few words will be pieces, sentences will be spelt in "
        f"characters and many cut to data.max_source_length; about "
        f"{PAIRS_PER_THRESHOLD * params.threshold:,.0f} pairs are needed at this σ. Better: a "
        "public vocabulary (tokenizer.kind=sentencepiece_public with tokenizer.public_corpora; "
        "python -m dpnmt.public_vocab) or a pretrained model (model.name_or_path), no ε spent; "
        f"or a smaller σ for C <= N/{PAIRS_PER_THRESHOLD}: {lower}.{bpe}"
    )
