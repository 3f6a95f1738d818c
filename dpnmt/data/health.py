"""Warnings about data choices that silently hurt a run, for the operator's log.

Nothing here writes a file: the warnings go to the log (stderr) of the person
running the job. They use only what is public or already reported: the
vocabulary's size (the vocabulary itself is released), the count of truncated
training examples (exact counts are private: results.json omits them and keeps
them in private/preprocessing.json; this log is the operator's, and a sweep
writes it to the run's private/train.log), and length percentiles of the
VALIDATION split. Length statistics of the private train
split are themselves private: they are never computed here.
"""

import logging

import datasets
import numpy as np

from dpnmt.data.preprocess import PreprocessStats

# Warn when more than this share of training examples is cut.
TRUNCATED_SHARE_TO_WARN = 0.1
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


def truncation_warnings(stats: PreprocessStats, tokenized: datasets.DatasetDict) -> list[str]:
    """Warnings when many training sources or targets are cut to the maximum length.

    The suggested length is a percentile of the validation split's lengths (not
    the private train split's).

    Args:
      stats: `preprocess`'s counts (train truncation counted up front).
      tokenized: `preprocess`'s splits, with `source_full_length` /
        `target_full_length` columns (`[n]` tokens before truncation).

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
        hint = ""
        if "validation" in tokenized and len(tokenized["validation"]):
            lengths = np.asarray(tokenized["validation"][f"{side}_full_length"])
            suggested = int(np.percentile(lengths, SUGGESTED_PERCENTILE))
            hint = (
                f" {SUGGESTED_PERCENTILE}% of validation {side}s fit in {suggested} tokens: "
                f"consider --config.data.max_{side}_length={suggested} (steps cost more with "
                "longer rows)."
            )
        warnings.append(
            f"{truncated:,d} of {train.num_kept:,d} training {side}s are longer than "
            f"data.max_{side}_length={limit} tokens and are cut.{hint}"
        )
    return warnings


def log_warnings(warnings: list[str | None]) -> None:
    """Logs each warning (the operator's log only; never written to the workdir)."""
    for warning in warnings:
        if warning:
            logging.warning(warning)
