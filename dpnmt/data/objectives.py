"""Pre-training objectives on monolingual text: T5 span corruption and prefix LM.

Each objective turns one text's token ids (no eos) into an (inputs, targets)
pair of id arrays, the seq2seq example a translation pair would give; the
tokenizer's eos is appended afterwards by the caller. Pure functions of their
arguments: the randomness is a `numpy.random.Generator` the caller passes, so
the same generator state gives the same pair (training derives one generator
per text from the public `data.objective_seed` and the text's ids, once per
run: `dpnmt.data.text_objective`).

Span corruption (Raffel et al. 2020, T5 section 3.1.4): for a text of n ≥ 2
tokens, `noise_tokens = clip(round(n * noise_density), 1, n - 1)` tokens are
masked, in `spans = clip(round(noise_tokens / mean_span_length), 1,
min(noise_tokens, n - noise_tokens))` spans; the noise tokens are cut into
`spans` non-empty runs at uniformly random cut points (as T5's
`random_spans_noise_mask`), and the runs are placed, in order, at `spans`
distinct gaps drawn uniformly from the n - noise_tokens + 1 gaps around the kept
tokens (so spans never touch, and one may start or end the text). Inputs: the
text with span i replaced by `sentinel_ids[i]`; targets: `sentinel_ids[i]` then
span i, for each span in order. Two deviations from T5, both for short
sentences: T5 interleaves kept and noise runs kept run first, so a text with
one span always loses its END (most sentences here have one span; seqio's
`random_roll` fixes the same); and T5 caps `spans` only below (at 1): the
upper cap keeps every run non-empty for any density. Texts of fewer than 2
tokens are left whole: inputs = ids, targets empty.

Sentinels are T5's `<extra_id_0>`, `<extra_id_1>`, ... in that order
(`sentinel_pieces`). T5/mT5 tokenizers have 100 of them; a dpnmt SentencePiece
vocabulary (public, DP or private) has them only when built with
`tokenizer.sentinels = K`: K control symbols reserved at training time, ids
3..K+2 (fixed, data-independent: no privacy cost); control symbols are never
produced from text, so a literal "<extra_id_0>" in a text stays characters. A
pretrained tokenizer without them gets K appended (`dpnmt.data.sentinels`):
Hugging Face added tokens, so there a literal "<extra_id_N>" in a text IS
tokenized as that sentinel's id (as in Hugging Face's own T5 tokenizers).
`find_sentinel_ids` looks them up and refuses, naming that field, when a
vocabulary lacks them; other tokenizers (mBART, Marian) are refused alike.

Prefix LM (T5's "prefix language modeling"): the text is split at a point s
into prefix ids[:s] (inputs) and continuation ids[s:] (targets); s is drawn
uniformly from the integers in [ceil(min_fraction * n), floor(max_fraction * n)]
clipped to [1, n - 1], so both parts are non-empty; min_fraction ==
max_fraction fixes the split (round(fraction * n), clipped) and draws nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

OBJECTIVES = ("translation", "span_corruption", "prefix_lm")
SENTINEL_PREFIX = "<extra_id_"


def sentinel_pieces(count: int) -> list[str]:
    """T5's sentinel pieces `<extra_id_0>` ... `<extra_id_{count-1}>`, in T5's order."""
    return [f"{SENTINEL_PREFIX}{i}>" for i in range(count)]


def noise_token_count(length: int, noise_density: float) -> int:
    """How many of a `length`-token text's tokens span corruption masks (0 when < 2)."""
    if length < 2:
        return 0
    return min(max(int(round(length * noise_density)), 1), length - 1)


def span_count(length: int, *, noise_density: float = 0.15, mean_span_length: float = 3.0) -> int:
    """The number of noise spans (= sentinels used) for a `length`-token text.

    Non-decreasing in `length` for fixed parameters, so the longest text a run
    allows bounds the sentinels it needs.
    """
    noise = noise_token_count(length, noise_density)
    if noise == 0:
        return 0
    spans = int(round(noise / mean_span_length))
    return min(max(spans, 1), noise, length - noise)


def _check_span_params(noise_density: float, mean_span_length: float) -> None:
    if not 0.0 < noise_density < 1.0:
        raise ValueError(f"noise_density={noise_density} must lie in (0, 1); T5 uses 0.15.")
    if not mean_span_length >= 1.0:
        raise ValueError(f"mean_span_length={mean_span_length} must be >= 1 token; T5 uses 3.")


def _random_run_lengths(total: int, runs: int, rng: np.random.Generator) -> np.ndarray:
    """Cuts `total` items into `runs` non-empty runs at uniform random cut points."""
    cuts = np.sort(rng.choice(total - 1, size=runs - 1, replace=False)) + 1
    return np.diff(np.concatenate([[0], cuts, [total]]))


def span_corruption(
    ids: Sequence[int] | np.ndarray,
    rng: np.random.Generator,
    *,
    noise_density: float = 0.15,
    mean_span_length: float = 3.0,
    sentinel_ids: Sequence[int],
) -> tuple[np.ndarray, np.ndarray]:
    """T5 span corruption of one text.

    Args:
      ids: [n] int token ids of one text, without eos.
      rng: the randomness (a `numpy.random.Generator`; consumed only when n ≥ 2).
      noise_density: fraction of tokens masked, in (0, 1).
      mean_span_length: mean noise span length in tokens, ≥ 1.
      sentinel_ids: the tokenizer's sentinel ids, `<extra_id_0>` first
        (`find_sentinel_ids`); at least `span_count(n, ...)` of them.

    Returns:
      (inputs, targets), int64 arrays: inputs [n - noise + spans], the text with
      span i replaced by sentinel i; targets [noise + spans], sentinel i then
      span i for each span. For n < 2: (ids, empty).

    Raises:
      ValueError: bad parameters, or fewer sentinels than spans.
    """
    _check_span_params(noise_density, mean_span_length)
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    n = ids.shape[0]
    spans = span_count(n, noise_density=noise_density, mean_span_length=mean_span_length)
    if spans == 0:
        return ids.copy(), np.zeros((0,), np.int64)
    if len(sentinel_ids) < spans:
        raise ValueError(
            f"span corruption of a {n}-token text needs {spans} sentinel ids, got "
            f"{len(sentinel_ids)}; reserve more (tokenizer.sentinels) or shorten "
            "texts (data.max_length)."
        )
    noise = noise_token_count(n, noise_density)
    noise_runs = _random_run_lengths(noise, spans, rng)
    # Span i goes before kept token gaps[i] (distinct gaps: spans never touch).
    gaps = np.sort(rng.choice(n - noise + 1, size=spans, replace=False))
    inputs, targets, start = [], [], 0
    for i in range(spans):
        span_start = gaps[i] + int(noise_runs[:i].sum())
        span_end = span_start + noise_runs[i]
        inputs += [ids[start:span_start], [sentinel_ids[i]]]
        targets += [[sentinel_ids[i]], ids[span_start:span_end]]
        start = span_end
    inputs.append(ids[start:])
    return (
        np.concatenate(inputs).astype(np.int64),
        np.concatenate(targets).astype(np.int64),
    )


def prefix_lm(
    ids: Sequence[int] | np.ndarray,
    rng: np.random.Generator,
    *,
    min_fraction: float = 0.0,
    max_fraction: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Prefix LM: splits one text into a prefix (inputs) and its continuation (targets).

    Args:
      ids: [n] int token ids of one text, without eos.
      rng: the randomness (a `numpy.random.Generator`; unused when
        min_fraction == max_fraction or n < 2).
      min_fraction: the split point s is uniform over the integers in
        [ceil(min_fraction * n), floor(max_fraction * n)], clipped to [1, n - 1];
        0 ≤ min_fraction ≤ max_fraction ≤ 1.
      max_fraction: the range's upper end; equal to min_fraction, it fixes
        s = round(min_fraction * n), clipped to [1, n - 1].

    Returns:
      (inputs, targets) = (ids[:s], ids[s:]), int64; both non-empty when n ≥ 2.
      For n < 2: (ids, empty).
    """
    if not 0.0 <= min_fraction <= max_fraction <= 1.0:
        raise ValueError(
            f"prefix_lm fractions min={min_fraction}, max={max_fraction} need "
            "0 <= min_fraction <= max_fraction <= 1."
        )
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    n = ids.shape[0]
    if n < 2:
        return ids.copy(), np.zeros((0,), np.int64)
    if min_fraction == max_fraction:
        split = int(round(min_fraction * n))
    else:
        low = min(max(math.ceil(min_fraction * n), 1), n - 1)
        high = max(min(math.floor(max_fraction * n), n - 1), low)
        split = int(rng.integers(low, high, endpoint=True))
    split = min(max(split, 1), n - 1)
    return ids[:split].copy(), ids[split:].copy()


def find_sentinel_ids(
    piece_to_id: Callable[[str], int | None], count: int, *, vocabulary: str = "the vocabulary"
) -> list[int]:
    """The ids of `<extra_id_0>` ... `<extra_id_{count-1}>` in a vocabulary.

    Args:
      piece_to_id: maps a piece to its id, or to None (or a negative id, or the
        unknown id's caller-chosen stand-in) when absent.
      count: sentinels needed.
      vocabulary: its name, for the error.

    Raises:
      ValueError: a sentinel is missing or two pieces share an id, naming the fix.
    """
    found = [piece_to_id(piece) for piece in sentinel_pieces(count)]
    missing = [i for i, found_id in enumerate(found) if found_id is None or found_id < 0]
    if missing:
        raise ValueError(
            f"{vocabulary} lacks the sentinel <extra_id_{missing[0]}> ({len(missing)} of the "
            f"{count} sentinels span corruption needs are missing); set "
            f"tokenizer.sentinels >= {count} (reserved in a dpnmt SentencePiece vocabulary, "
            "appended to a pretrained tokenizer that has none), or use a T5/mT5 tokenizer "
            "(100 sentinels)."
        )
    if len(set(found)) != count:
        raise ValueError(f"{vocabulary}'s sentinel pieces do not have distinct ids: {found}.")
    return [int(i) for i in found]
