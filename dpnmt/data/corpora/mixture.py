"""Several corpora in one run, and Moses-detokenised (`detok:`) corpora.

`data.corpus` (and `tokenizer.public_corpora`) name one corpus or several,
separated by commas: `"files:tatoeba_de_en,detok:wmt16"`. Each name is a
registry name (`dpnmt.data.corpora.registry`), optionally prefixed `detok:`:
that corpus's text (every split) is Moses-detokenised with sacremoses when
loaded, for corpora shipped tokenised (the WMT sample: `&apos;`, spaces before
punctuation) mixed with raw text (Tatoeba, Multi30K).

With several corpora the train split is each corpus's train split, weighted
(`weights[i]` times its size: whole copies, then a fixed-seed sample for the
fraction) and shuffled with a fixed seed, so `data.max_train_examples` keeps a
proportional sample; validation and test are the FIRST corpus's. That is for
non-private runs: a DP run's N, q and guarantee come from its private corpus
alone, and mixing public pairs into its train split is refused
(`dpnmt.data.checks`) until the accounting for it exists.
"""

import dataclasses
import functools
from collections.abc import Sequence

import datasets
import numpy as np

from dpnmt.data.corpora.registry import load_corpus, lookup
from dpnmt.data.groups import GROUP_COLUMN
from dpnmt.data.languages import LanguagePair, parse_pair
from dpnmt.errors import ConfigError

DETOK_PREFIX = "detok:"
MIX_SEED = 0  # Fixed: the sample and order of a mixture of public corpora are public.


@dataclasses.dataclass(frozen=True)
class CorpusName:
    """One entry of a corpus list.

    Attributes:
      name: as written, e.g. "detok:wmt16".
      registry_name: without the `detok:` prefix, e.g. "wmt16".
      detokenize: Moses-detokenise its text when loaded.
    """

    name: str
    registry_name: str
    detokenize: bool


def parse_corpus_names(spec: str, field: str = "data.corpus") -> tuple[CorpusName, ...]:
    """Splits "a,detok:b" into its entries (registry names are checked by `lookup`).

    Args:
      spec: the comma-separated names.
      field: the config field `spec` came from, for messages.

    Raises:
      ConfigError: an empty list, an empty entry, or a name given twice.
    """
    names = [part.strip() for part in str(spec or "").split(",")]
    if not names or any(not name for name in names):
        raise ConfigError(
            f"{field}={spec!r}: give one corpus name or several separated by commas "
            "(e.g. 'files:tatoeba_de_en,detok:wmt16'), with no empty entry."
        )
    if len(set(names)) != len(names):
        raise ConfigError(f"{field}={spec!r} names a corpus twice; give each once.")
    entries = []
    for name in names:
        detokenize = name.startswith(DETOK_PREFIX)
        registry_name = name[len(DETOK_PREFIX) :] if detokenize else name
        lookup(registry_name)  # Unknown names fail here, with the known ones.
        entries.append(CorpusName(name, registry_name, detokenize))
    return tuple(entries)


def is_mixture(spec: str) -> bool:
    """Whether `spec` names more than one corpus."""
    return "," in str(spec or "")


def first_registry_name(spec: str) -> str:
    """The registry name of the first corpus of `spec` (the one data options apply to)."""
    return parse_corpus_names(spec)[0].registry_name


def check_weights(spec: str, weights: Sequence[float]) -> list[str]:
    """Problems of `data.corpus_weights` for `data.corpus=spec`, one line each."""
    weights = tuple(weights or ())
    if not weights:
        return []
    count = len(parse_corpus_names(spec))
    if len(weights) != count:
        return [
            f"data.corpus_weights={weights!r} has {len(weights)} weights for {count} corpora "
            f"in data.corpus={spec!r}; give one weight a corpus (or none: 1 each)."
        ]
    if not all(isinstance(w, int | float) and np.isfinite(w) and w > 0 for w in weights):
        return [f"data.corpus_weights={weights!r}: every weight must be a finite number > 0."]
    return []


@functools.cache
def _moses_detokenizer(lang: str):
    from sacremoses import MosesDetokenizer  # Deferred: only detok: corpora need it.

    return MosesDetokenizer(lang=lang)


def moses_detokenize(texts: Sequence[str], lang: str) -> list[str]:
    """Moses-detokenised `texts` (XML escapes such as `&apos;` undone)."""
    detokenizer = _moses_detokenizer(lang)
    return [detokenizer.detokenize(text.split(), unescape=True) for text in texts]


def detokenize_corpus(corpus: datasets.DatasetDict, pair: LanguagePair) -> datasets.DatasetDict:
    """Every split's text Moses-detokenised, side by side; split origins kept."""
    out = {}
    for split, dataset in corpus.items():
        rows = dataset["translation"]
        sources = moses_detokenize([row[pair.source] for row in rows], pair.source)
        targets = moses_detokenize([row[pair.target] for row in rows], pair.target)
        columns = {
            "translation": [
                {pair.source: s, pair.target: t} for s, t in zip(sources, targets, strict=True)
            ]
        }
        if GROUP_COLUMN in dataset.column_names:
            columns[GROUP_COLUMN] = dataset[GROUP_COLUMN]
        out[split] = datasets.Dataset.from_dict(
            columns, features=dataset.features, info=dataset.info
        )
    return datasets.DatasetDict(out)


def load_one(entry: CorpusName, pair: str | LanguagePair, **options) -> datasets.DatasetDict:
    """One corpus through the registry, detokenised when its name says `detok:`."""
    pair = parse_pair(pair)
    corpus = load_corpus(entry.registry_name, pair, **options)
    return detokenize_corpus(corpus, pair) if entry.detokenize else corpus


def weighted_rows(size: int, weight: float, rng: np.random.Generator) -> np.ndarray:
    """Row indices of a split of `size` rows taken `weight` times (round(weight * size) rows).

    Whole copies for the integer part, then a sample without replacement for
    the fraction: each row appears floor(weight) or ceil(weight) times.
    """
    total = int(round(weight * size))
    copies, rest = divmod(total, size)
    sample = rng.choice(size, size=rest, replace=False) if rest else np.zeros(0, np.int64)
    return np.concatenate([np.tile(np.arange(size), copies), np.sort(sample)]).astype(np.int64)


def load_corpora(
    spec: str, pair: str | LanguagePair, *, weights: Sequence[float] = (), **options
) -> datasets.DatasetDict:
    """Loads `data.corpus`: one corpus, or a weighted mixture of several (module docstring).

    Args:
      spec: one name or several separated by commas, each optionally `detok:`.
      pair: direction, e.g. "de-en".
      weights: one weight > 0 a corpus (empty: 1 each). One corpus with weight
        1 is that corpus as read (its order and origin kept), like no weights.
      **options: loader options (data.dir, validation_size, ...) of the FIRST
        corpus; the others are loaded with their defaults.

    Returns:
      DatasetDict with train/validation/test; a mixture's train description
      names each corpus and how many of its rows it holds.

    Raises:
      ConfigError: a bad name or weights (see `parse_corpus_names`, `check_weights`).
    """
    pair = parse_pair(pair)
    entries = parse_corpus_names(spec)
    problems = check_weights(spec, weights)
    if problems:
        raise ConfigError(problems[0])
    if len(entries) == 1 and all(w == 1 for w in weights):
        # One corpus taken once is that corpus as read: its order and its origin.
        return load_one(entries[0], pair, **options)
    loaded = [load_one(entries[0], pair, **options)]
    loaded += [load_one(entry, pair) for entry in entries[1:]]
    weights = tuple(weights) or (1.0,) * len(entries)
    rng = np.random.default_rng(MIX_SEED)
    parts, origins = [], []
    for entry, corpus, weight in zip(entries, loaded, weights, strict=True):
        rows = weighted_rows(len(corpus["train"]), float(weight), rng)
        part = corpus["train"].select(rows)
        if GROUP_COLUMN in part.column_names:
            # A mixture (public: a DP run on one is refused) has no privacy units.
            part = part.remove_columns(GROUP_COLUMN)
        parts.append(part)
        origins.append(f"{len(rows)} rows of {entry.name} (weight {weight:g})")
    train = datasets.concatenate_datasets(parts)
    train = train.select(rng.permutation(len(train)))
    info = datasets.DatasetInfo(
        description="train: mixture, shuffled: " + "; ".join(origins), features=train.features
    )
    train = datasets.Dataset.from_dict(train.to_dict(), features=train.features, info=info)
    first = loaded[0]
    return datasets.DatasetDict(train=train, validation=first["validation"], test=first["test"])
