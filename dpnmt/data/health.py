"""Warnings about data choices that silently hurt a run, for the operator's log.

Nothing here writes a file: the warnings go to the log (stderr). A run's log
follows the publication rules (README, "Privacy rules the code keeps"), so
they use only what is public or already reported: the vocabulary's size (the
vocabulary itself is released), N (not under `dp.unit="group"`, where only
the number of groups is public), whether more than `TRUNCATED_SHARE_TO_WARN`
of the training examples are cut (never the exact count: it stays in
private/preprocessing.json), and length percentiles of a PUBLIC validation
split (none when validation was carved from train). Length statistics of the
private train split are themselves private: they are never computed here.
"""

import logging

import datasets
import numpy as np

from dpnmt.data.preprocess import PreprocessStats

# Warn when more than this share of training examples is cut; say "most" above
# the second (each a threshold, never the count: the log keeps the publication rules).
TRUNCATED_SHARE_TO_WARN = 0.1
TRUNCATED_SHARE_MOST = 0.5
SUGGESTED_PERCENTILE = 95


def vocabulary_warning(requested: int, learnt: int, kind: str) -> str | None:
    """A warning when the learnt vocabulary is smaller than asked, else None.

    Args:
      requested: tokenizer.vocab_size (pieces).
      learnt: pieces of the vocabulary actually learnt.
      kind: tokenizer.kind.
    """
    if learnt >= requested:
        return None
    fix = (
        "more training data, a lower tokenizer.dp_noise_stddev, or a smaller tokenizer.vocab_size"
        if kind == "dp_sentencepiece"
        else "more text or a smaller tokenizer.vocab_size"
    )
    return (
        f"The vocabulary has {learnt:,d} pieces, not the {requested:,d} asked "
        f"(tokenizer.vocab_size): the text holds too few distinct pieces. Words outside it "
        f"split into characters; for the asked size give {fix}."
    )


def truncation_warnings(
    stats: PreprocessStats,
    tokenized: datasets.DatasetDict,
    *,
    validation_is_private: bool,
    pairs_are_public: bool = True,
) -> list[str]:
    """Warnings when many training sources or targets are cut to the maximum length.

    They say only that more than `TRUNCATED_SHARE_TO_WARN` of N are cut (exact
    counts of the private train split are never logged). The suggested length
    is a percentile of the validation split's lengths, only when that split is
    public (never the private train split's).

    Args:
      stats: `preprocess`'s counts (train truncation counted up front).
      tokenized: `preprocess`'s splits, with `source_full_length` /
        `target_full_length` columns (`[n]` tokens before truncation).
      validation_is_private: the validation split was carved from train
        (`training.pieces.validation_is_carved_from_train`): no percentile of it.
      pairs_are_public: N, the number of training pairs, is public (False with
        `dp.unit="group"`: only the number of groups is; the warning then names no count).

    Returns:
      One warning per side (source, target) that is cut too often.
    """
    train = stats.splits.get("train")
    if train is None or not train.num_kept:
        return []
    warnings = []
    for side, truncated, limit in (
        ("source", train.num_source_truncated, stats.max_source_length),
        ("target", train.num_target_truncated, stats.max_target_length),
    ):
        if truncated is None or truncated <= TRUNCATED_SHARE_TO_WARN * train.num_kept:
            continue
        hint = " python -m dpnmt.data.inspect prints the lengths (for you, not for publishing)."
        if not validation_is_private and "validation" in tokenized and len(tokenized["validation"]):
            lengths = np.asarray(tokenized["validation"][f"{side}_full_length"])
            suggested = int(np.percentile(lengths, SUGGESTED_PERCENTILE))
            hint = (
                f" {SUGGESTED_PERCENTILE}% of validation {side}s fit in {suggested} tokens: "
                f"consider --config.data.max_{side}_length={suggested} (steps cost more with "
                "longer rows)."
            )
        most = truncated > TRUNCATED_SHARE_MOST * train.num_kept
        share = TRUNCATED_SHARE_MOST if most else TRUNCATED_SHARE_TO_WARN
        cause = (
            " Most sentences are cut: the model sees only their starts. A vocabulary too small "
            "for the text (see the vocabulary size) makes sentences many pieces long; a public "
            "or pretrained vocabulary, or a longer maximum, helps."
            if most
            else ""
        )
        count = f"the {train.num_kept:,d}" if pairs_are_public else "the"
        warnings.append(
            f"More than {share:.0%} of {count} training "
            f"{side}s are longer than data.max_{side}_length={limit} tokens and are cut "
            f"(exact count: private/preprocessing.json).{cause}{hint}"
        )
    return warnings


def log_warnings(warnings: list[str | None]) -> None:
    """Logs each warning (the operator's log only; never written to the workdir)."""
    for warning in warnings:
        if warning:
            logging.warning(warning)
