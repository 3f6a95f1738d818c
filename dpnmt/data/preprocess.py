"""Turn a loaded corpus into token ids for one model family, counting what it drops.

Per example (a row of {"translation": {source, target}}):
  * either side empty or whitespace-only: dropped, and counted per side;
  * source: optional task prefix (T5: "translate German to English: "), encoded;
    target: encoded as target (mBART: target language code);
  * longer than max_source_length / max_target_length (ids, specials included):
    truncated by the tokenizer itself (specials kept), and counted.

Output columns: input_ids, labels (int32 id lists), source_length/target_length
(ids after truncation), source_full_length/target_full_length (before), and
example_index (row in the corpus split, to join references back).

Deterministic. With `cache_dir`, each split is cached by datasets under a file
named by a key over the split's content fingerprint, the tokenizer's fingerprint
and every option here, so a changed tokenizer or option never reuses stale ids.
"""

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence

import datasets
import numpy as np

from dpnmt.data.corpora import corpus_pair
from dpnmt.data.languages import LanguagePair, mbart_codes, parse_pair, t5_prefix
from dpnmt.data.tokenizers import Tokenizer

FAMILIES = ("none", "t5", "mbart")
_CACHE_VERSION = 1
_FLAG_COLUMNS = ("keep", "source_empty", "target_empty")


@dataclasses.dataclass(frozen=True)
class SplitStats:
    """What preprocessing did to one split (counts of examples).

    Attributes:
      num_examples: rows in.
      num_kept: rows out.
      num_dropped: rows dropped because a side was empty or whitespace-only.
      num_empty_source: rows whose source was empty (dropped).
      num_empty_target: rows whose target was empty (dropped; a row empty on both
        sides counts in both, once in num_dropped).
      num_source_truncated: kept rows whose source was cut to max_source_length
        (None: not counted, the split was tokenized on demand).
      num_target_truncated: kept rows whose target was cut to max_target_length
        (None: not counted).
    """

    num_examples: int
    num_kept: int
    num_dropped: int
    num_empty_source: int
    num_empty_target: int
    num_source_truncated: int | None
    num_target_truncated: int | None


@dataclasses.dataclass(frozen=True)
class PreprocessStats:
    """Per-split SplitStats plus the options that produced them."""

    splits: dict[str, SplitStats]
    source_prefix: str
    max_source_length: int
    max_target_length: int
    tokenizer_fingerprint: str


def family_source_prefix(family: str, pair: LanguagePair, source_prefix: str | None) -> str:
    """Returns the text put before every source sentence for a model family."""
    if family not in FAMILIES:
        raise ValueError(f"Unknown model family {family!r}; use one of {FAMILIES}.")
    if source_prefix is not None:
        return source_prefix
    return t5_prefix(pair) if family == "t5" else ""


def _check_mbart_tokenizer(tokenizer: Tokenizer, pair: LanguagePair) -> None:
    """Raises unless the tokenizer carries the pair's mBART language codes."""
    expected = mbart_codes(pair)
    found = (getattr(tokenizer, "src_lang", None), getattr(tokenizer, "tgt_lang", None))
    if found != expected:
        raise ValueError(
            f"mBART preprocessing for {pair} needs tokenizer src_lang/tgt_lang = {expected}, "
            f"found {found}; load it with load_pretrained_tokenizer(path, "
            f"src_lang={expected[0]!r}, tgt_lang={expected[1]!r})."
        )


def _encode_with_truncation(
    tokenizer: Tokenizer, texts: list[str], max_length: int, *, target: bool
) -> tuple[list[list[int]], list[int]]:
    """Returns (ids truncated to max_length, full lengths before truncation)."""
    ids = tokenizer.encode(texts, target=target)
    full_lengths = [len(row) for row in ids]
    too_long = [i for i, n in enumerate(full_lengths) if n > max_length]
    if too_long:
        cut = tokenizer.encode([texts[i] for i in too_long], target=target, max_length=max_length)
        for i, row in zip(too_long, cut, strict=True):
            ids[i] = row
    return ids, full_lengths


def _sides(translations: Sequence[dict], pair: LanguagePair) -> tuple[list[str], list[str]]:
    """(source texts, target texts) of `{"translation": ...}` rows' translation dicts."""
    return [t[pair.source] for t in translations], [t[pair.target] for t in translations]


def empty_sides(sources: Sequence[str], targets: Sequence[str]) -> tuple[list[bool], list[bool]]:
    """(source empty, target empty) per pair: empty or whitespace-only text (dropped)."""
    return [not s.strip() for s in sources], [not t.strip() for t in targets]


class PairEncoder:
    """Encodes kept pairs as `preprocess` does: prefix, specials, truncation.

    The one encoding used both for a whole split up front and for rows on
    demand (`OnDemandSplit`), so the two give the same ids.
    """

    def __init__(self, tokenizer, prefix, max_source, max_target, objective=None):
        """Keeps the tokenizer, prefix, max lengths and a `TextObjective` (or None)."""
        self._tokenizer, self._prefix = tokenizer, prefix
        self._max_source, self._max_target = max_source, max_target
        self._objective = objective

    def __call__(self, sources: Sequence[str], targets: Sequence[str]):
        """Returns (input_ids, labels, source full lengths, target full lengths).

        ids: one list of int per pair, truncated; full lengths: before truncation.
        """
        if self._objective is not None:  # Pre-training: an example from its text alone.
            texts = [self._prefix + s for s in sources]
            return self._objective.encode(
                self._tokenizer, texts, self._max_source, self._max_target
            )
        input_ids, source_full = _encode_with_truncation(
            self._tokenizer, [self._prefix + s for s in sources], self._max_source, target=False
        )
        labels, target_full = _encode_with_truncation(
            self._tokenizer, list(targets), self._max_target, target=True
        )
        return input_ids, labels, source_full, target_full


def _checked_prefix(
    corpus: datasets.DatasetDict | datasets.Dataset,
    tokenizer: Tokenizer,
    pair: LanguagePair,
    family: str,
    source_prefix: str | None,
    max_source_length: int,
    max_target_length: int,
) -> str:
    """The family's source prefix, after checking the options (see `preprocess`)."""
    if corpus_pair(corpus) != pair:
        raise ValueError(
            f"The corpus was loaded for {corpus_pair(corpus)}, not {pair}; load it with "
            f"pair={str(pair)!r} or preprocess with pair={str(corpus_pair(corpus))!r}."
        )
    prefix = family_source_prefix(family, pair, source_prefix)
    if family == "mbart":
        _check_mbart_tokenizer(tokenizer, pair)
    for name, value in (
        ("max_source_length", max_source_length),
        ("max_target_length", max_target_length),
    ):
        if value < 2:
            raise ValueError(f"{name} must be at least 2 (a token and eos), not {value}.")
    return prefix


def _output_features() -> datasets.Features:
    ids = datasets.Sequence(datasets.Value("int32"))
    count = datasets.Value("int32")
    flag = datasets.Value("bool")
    return datasets.Features(
        {
            "input_ids": ids,
            "labels": ids,
            "source_length": count,
            "target_length": count,
            "source_full_length": count,
            "target_full_length": count,
            "example_index": datasets.Value("int64"),
            "keep": flag,
            "source_empty": flag,
            "target_empty": flag,
        }
    )


def _cache_key(split_fingerprint: str, options: dict) -> str:
    payload = json.dumps({"split": split_fingerprint, **options}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def preprocess(
    corpus: datasets.DatasetDict,
    tokenizer: Tokenizer,
    *,
    pair: str | LanguagePair,
    family: str = "none",
    max_source_length: int,
    max_target_length: int,
    source_prefix: str | None = None,
    cache_dir: str | None = None,
    batch_size: int = 1000,
    objective=None,
) -> tuple[datasets.DatasetDict, PreprocessStats]:
    """Tokenizes every split of a corpus for one model family.

    Args:
      corpus: DatasetDict from `corpora.load_corpus`, built for `pair`.
      tokenizer: any `tokenizers.Tokenizer`; for family "mbart" an HFTokenizer with
        the pair's language codes.
      pair: direction, e.g. "de-en"; must match the corpus.
      family: "t5" (task prefix), "mbart" (language codes) or "none".
      max_source_length: most source ids per example, specials included.
      max_target_length: most target ids per example, specials included.
      source_prefix: overrides the family's prefix (e.g. "" for a T5 without one).
      cache_dir: folder for datasets' cache files; None keeps results in memory.
      batch_size: rows tokenized per call.
      objective: a `TextObjective` (pre-training: examples from source texts), or None.

    Returns:
      (DatasetDict of the output columns, PreprocessStats with per-split counts).

    Raises:
      ValueError: wrong pair, unknown family, mBART codes missing, bad lengths.
    """
    pair = parse_pair(pair)
    prefix = _checked_prefix(
        corpus, tokenizer, pair, family, source_prefix, max_source_length, max_target_length
    )
    options = {
        "version": _CACHE_VERSION,
        "tokenizer": tokenizer.fingerprint,
        "pair": str(pair),
        "family": family,
        "prefix": prefix,
        "max_source_length": max_source_length,
        "max_target_length": max_target_length,
    }
    # All of the objective's parameters: datasets caches an Arrow-backed corpus by `key`.
    options |= {"objective": objective.options()} if objective is not None else {}

    encode = PairEncoder(tokenizer, prefix, max_source_length, max_target_length, objective)

    def tokenize(batch, indices):
        sources, targets = _sides(batch["translation"], pair)
        source_empty, target_empty = empty_sides(sources, targets)
        keep = [not (a or b) for a, b in zip(source_empty, target_empty, strict=True)]
        kept = [i for i, k in enumerate(keep) if k]
        input_ids, labels, source_full, target_full = encode(
            [sources[i] for i in kept], [targets[i] for i in kept]
        )
        num_rows = len(keep)
        out = {
            "input_ids": [[] for _ in range(num_rows)],
            "labels": [[] for _ in range(num_rows)],
            "source_length": [0] * num_rows,
            "target_length": [0] * num_rows,
            "source_full_length": [0] * num_rows,
            "target_full_length": [0] * num_rows,
        }
        for row, i in enumerate(kept):
            out["input_ids"][i] = input_ids[row]
            out["labels"][i] = labels[row]
            out["source_length"][i] = len(input_ids[row])
            out["target_length"][i] = len(labels[row])
            out["source_full_length"][i] = source_full[row]
            out["target_full_length"][i] = target_full[row]
        out.update(
            example_index=list(indices),
            keep=keep,
            source_empty=source_empty,
            target_empty=target_empty,
        )
        return out

    processed, split_stats = {}, {}
    for split, dataset in corpus.items():
        key = _cache_key(dataset._fingerprint, options)
        # An objective's splits stay in memory: no datasets cache file read or written.
        cache_kwargs = {"load_from_cache_file": False, "keep_in_memory": True} if objective else {}
        if cache_dir is not None:
            os.makedirs(cache_dir, exist_ok=True)
            cache_kwargs = {
                "cache_file_name": os.path.join(cache_dir, f"{split}-{key}.arrow"),
                "load_from_cache_file": True,
            }
        mapped = dataset.map(
            tokenize,
            with_indices=True,
            batched=True,
            batch_size=batch_size,
            remove_columns=dataset.column_names,
            features=_output_features(),
            new_fingerprint=key,
            desc=f"tokenize {split}",
            **cache_kwargs,
        )
        split_stats[split] = _split_stats(mapped, max_source_length, max_target_length)
        filter_kwargs = dict(cache_kwargs) if objective is not None else {}
        if cache_dir is not None:
            filter_kwargs = {
                "cache_file_name": os.path.join(cache_dir, f"{split}-{key}-kept.arrow"),
                "load_from_cache_file": True,
            }
        kept = mapped.filter(
            lambda flags: flags,
            input_columns="keep",
            batched=True,
            batch_size=batch_size,
            new_fingerprint=key + "-kept",
            desc=f"drop empty {split}",
            **filter_kwargs,
        )
        processed[split] = kept.remove_columns(list(_FLAG_COLUMNS))
    stats = PreprocessStats(
        splits=split_stats,
        source_prefix=prefix,
        max_source_length=max_source_length,
        max_target_length=max_target_length,
        tokenizer_fingerprint=tokenizer.fingerprint,
    )
    return datasets.DatasetDict(processed), stats


def _split_stats(mapped: datasets.Dataset, max_source: int, max_target: int) -> SplitStats:
    """Counts drops and truncations from the mapped columns (also right after a cache hit)."""
    table = mapped.with_format("arrow")[:]

    def column(name: str) -> np.ndarray:
        return table.column(name).to_numpy(zero_copy_only=False)

    keep = column("keep").astype(bool)
    source_full, target_full = column("source_full_length"), column("target_full_length")
    return _counts(
        column("source_empty").astype(bool),
        column("target_empty").astype(bool),
        int((keep & (source_full > max_source)).sum()),
        int((keep & (target_full > max_target)).sum()),
    )


def _counts(
    source_empty: np.ndarray,
    target_empty: np.ndarray,
    source_truncated: int | None,
    target_truncated: int | None,
) -> SplitStats:
    """SplitStats from `[n]` bool empty-side flags (a row is kept when neither is set)."""
    keep = ~(source_empty | target_empty)
    return SplitStats(
        num_examples=len(keep),
        num_kept=int(keep.sum()),
        num_dropped=int((~keep).sum()),
        num_empty_source=int(source_empty.sum()),
        num_empty_target=int(target_empty.sum()),
        num_source_truncated=source_truncated,
        num_target_truncated=target_truncated,
    )


class OnDemandSplit:
    """A split whose kept pairs are tokenized only when fetched (per lot).

    Which rows are kept is decided up front from the text alone (the same
    empty-side rule as `preprocess`), so N, and with it q = L/N, is known
    without tokenizing anything; `encode` then tokenizes just the rows asked for,
    with the same `PairEncoder`. Kept row i here is row i of `preprocess`'s
    output for the same split.
    """

    def __init__(self, rows: datasets.Dataset, kept: np.ndarray, encode: PairEncoder, pair):
        """`rows`: the raw split; `kept`: `[N]` int64 positions of its kept rows."""
        self._rows, self._kept, self._encode, self._pair = rows, kept, encode, pair

    def __len__(self) -> int:
        """N, the number of kept pairs."""
        return int(self._kept.shape[0])

    def encode(self, indices: Sequence[int]) -> tuple[list[list[int]], list[list[int]]]:
        """(input_ids, labels) of kept pairs `indices` (each in [0, N)), in that order."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        if indices.size and (indices.min() < 0 or indices.max() >= len(self)):
            raise IndexError(f"kept-pair indices must lie in [0, {len(self)}).")
        positions = self._kept[indices]
        if positions.size == 0:
            return [], []
        translations = self._rows[positions.tolist()]["translation"]
        sources, targets = _sides(translations, self._pair)
        input_ids, labels, _, _ = self._encode(sources, targets)
        return input_ids, labels


def preprocess_on_demand(
    split: datasets.Dataset,
    tokenizer: Tokenizer,
    *,
    pair: str | LanguagePair,
    family: str = "none",
    max_source_length: int,
    max_target_length: int,
    source_prefix: str | None = None,
    batch_size: int = 10_000,
    objective=None,
) -> tuple[OnDemandSplit, SplitStats]:
    """Like `preprocess` for one split, but tokenizing rows only when they are fetched.

    One pass over the text finds the empty pairs (dropped and counted as
    `preprocess` does); nothing is tokenized here. Truncation is not counted
    (it would need every row tokenized): those two counts are None.

    Args:
      split: one split of a corpus from `corpora.load_corpus`, built for `pair`.
      tokenizer: as for `preprocess`.
      pair: as for `preprocess`.
      family: as for `preprocess`.
      max_source_length: as for `preprocess`.
      max_target_length: as for `preprocess`.
      source_prefix: as for `preprocess`.
      batch_size: rows read per pass step.
      objective: as for `preprocess`.

    Returns:
      (OnDemandSplit over the kept pairs, SplitStats with truncation counts None).
    """
    pair = parse_pair(pair)
    prefix = _checked_prefix(
        split, tokenizer, pair, family, source_prefix, max_source_length, max_target_length
    )
    source_empty, target_empty = [], []
    for batch in split.iter(batch_size=batch_size):
        sources, targets = _sides(batch["translation"], pair)
        batch_source_empty, batch_target_empty = empty_sides(sources, targets)
        source_empty += batch_source_empty
        target_empty += batch_target_empty
    source_empty, target_empty = np.asarray(source_empty, bool), np.asarray(target_empty, bool)
    kept = np.flatnonzero(~(source_empty | target_empty)).astype(np.int64)
    encode = PairEncoder(tokenizer, prefix, max_source_length, max_target_length, objective)
    stats = _counts(source_empty, target_empty, None, None)
    return OnDemandSplit(split, kept, encode, pair), stats
