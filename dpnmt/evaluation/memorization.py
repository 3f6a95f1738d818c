"""Memorization metrics of generated continuations: exact match, token accuracy, edit distance.

The memorization test (Ponomareva et al. 2022, "Training Text-to-Text
Transformers with Privacy Guarantees", Table 3) prompts a trained model with
part of a text (a prefix, the span-corrupted text, or a translation's source)
and compares the model's greedy output with the rest (the continuation, the
masked spans, the target), token by token. For one text with target ids
t[0..m) (m ≥ 1, eos excluded) and generated ids g (cut before the first eos):

- exact match (EM): 1 if g == t, else 0;
- token accuracy (TA): #{i < m : i < len(g) and g[i] == t[i]} / m, the share of
  the target's positions the output reproduces in place;
- normalised edit distance (MED): Levenshtein(g, t) / m, insertions, deletions
  and substitutions of one token costing 1 (0 for a verbatim copy; it can
  exceed 1 when g is much longer than t).

A set's EM, TA and MED are their means over its texts (each text weighs the
same, however long). Pure functions of token-id lists: no model, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

METRICS = ("exact_match", "token_accuracy", "edit_distance")


def until_eos(tokens: Sequence[int], eos_id: int) -> list[int]:
    """The generated ids before the first `eos_id` (all of them when none is there)."""
    tokens = [int(t) for t in tokens]
    return tokens[: tokens.index(eos_id)] if eos_id in tokens else tokens


def edit_distance(a: Sequence[int], b: Sequence[int]) -> int:
    """Levenshtein distance between two id sequences (unit costs), in O(len(a)·len(b))."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    previous = np.arange(len(b) + 1)
    for i in range(1, len(a) + 1):
        current = np.empty_like(previous)
        current[0] = i
        substitution = previous[:-1] + (b != a[i - 1])
        deletion = previous[1:] + 1
        best = np.minimum(substitution, deletion)
        for j in range(1, len(b) + 1):  # Insertions chain along the row.
            current[j] = min(best[j - 1], current[j - 1] + 1)
        previous = current
    return int(previous[-1])


def text_scores(generated: Sequence[int], target: Sequence[int]) -> dict[str, float]:
    """EM, TA and MED of one text (see the module docstring).

    Args:
      generated: [k] ids the model produced, eos and what follows removed (`until_eos`).
      target: [m] ids it should reproduce, m ≥ 1, eos excluded.

    Raises:
      ValueError: an empty target (nothing to reproduce: leave such texts out).
    """
    generated, target = [int(t) for t in generated], [int(t) for t in target]
    if not target:
        raise ValueError("An empty target has nothing to reproduce; leave the text out.")
    in_place = sum(g == t for g, t in zip(generated, target, strict=False))
    return {
        "exact_match": float(generated == target),
        "token_accuracy": in_place / len(target),
        "edit_distance": edit_distance(generated, target) / len(target),
    }


def set_scores(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    """A set's EM, TA and MED: the means of its texts' `text_scores`.

    Raises:
      ValueError: no texts (a rate over nothing is undefined).
    """
    if not rows:
        raise ValueError("No texts to score; a set needs at least one text with a target.")
    return {name: float(np.mean([row[name] for row in rows])) for name in METRICS}
