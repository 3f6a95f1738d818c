"""Grow a pretrained T5's vocabulary-sized parameters by new rows (added sentinels).

A pretrained model whose tokenizer lacks T5's `<extra_id_i>` pieces gets them
appended (`dpnmt.data.sentinels`); its shared embedding (and an untied
`lm_head`) then needs as many new rows. The old rows are kept exactly; each
new row is a PUBLIC, deterministic function of the old ones: their mean plus a
tiny spread along their covariance, Hugging Face's `resize_token_embeddings`
rule (mean resizing, N(mean, 1e-9 Σ)), drawn from a fixed public seed. Near the
mean, a new token's logit is about the average logit, so the grown model gives
the old tokens the probabilities the pretrained one gave (Hewitt, "Initializing
new word embeddings", 2021); the spread only makes the rows distinct. No
training data, and no secret, enters.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np

from dpnmt.models.config import T5Config

# Public constants: the seed of the spread and its scale (transformers' 1e-9 of Σ).
GROWTH_SEED = 20261126
COVARIANCE_SCALE = 1e-9


def new_rows(old: np.ndarray, count: int) -> np.ndarray:
    """`count` rows for a [V, d] table: mean + N(0, 1e-9 Σ) from a fixed public seed.

    The draw is w @ (old - mean) / sqrt(V) with w ~ N(0, I) of shape [count, V]:
    covariance exactly Σ = (old - mean)ᵀ(old - mean) / V, with no factorisation
    (deterministic on any machine up to float rounding).

    Args:
      old: [V, d] the existing rows.
      count: new rows to make (>= 1).

    Returns:
      [count, d] float32.
    """
    old = np.asarray(old, np.float64)
    mean = old.mean(axis=0)
    rng = np.random.default_rng(GROWTH_SEED)
    w = rng.standard_normal((count, old.shape[0]))
    spread = w @ (old - mean) / np.sqrt(old.shape[0])
    return (mean + np.sqrt(COVARIANCE_SCALE) * spread).astype(np.float32)


def grow_vocabulary(
    params: Any, config: Any, count: int, *, total: int | None = None
) -> tuple[Any, Any]:
    """The T5 params and config with `count` more vocabulary entries (ids V .. V+count-1).

    Args:
      params: the model's params: `shared/embedding` [V, d], and `lm_head/kernel`
        [d, V] when untied (T5 v1.1, mT5; v1.0 ties it to the embedding).
      config: its `T5Config` (vocab_size V).
      count: entries to add (0: both returned unchanged).
      total: the tokenizer's size with them, checked to be V + count (its new ids
        must be the new rows).

    Returns:
      (params with [V+count, d] embedding and [d, V+count] head, config with
      vocab_size V+count). Rows 0..V-1 are the old ones, unchanged.

    Raises:
      ValueError: not a T5-family model, its embedding is not [V, d], or the
        tokenizer's size is not V + count.
    """
    if count == 0:
        return params, config
    if total is not None and total != config.vocab_size + count:
        raise ValueError(
            f"the tokenizer has {total - count} ids before its {count} appended sentinels but "
            f"the model {config.vocab_size} embedding rows: the sentinels' ids would not be the "
            "new rows. Add sentinels only to a model whose vocab_size equals its tokenizer's, "
            "or use a tokenizer that has them (tokenizer.sentinels=0)."
        )
    if not isinstance(config, T5Config):
        raise ValueError(
            "adding sentinel rows is implemented for T5-family models, not "
            f"{type(config).__name__}."
        )
    embedding = np.asarray(params["shared"]["embedding"])
    if embedding.shape[0] != config.vocab_size:
        raise ValueError(
            f"the embedding has {embedding.shape[0]} rows, the config vocab_size "
            f"{config.vocab_size}: cannot add rows after them."
        )
    grown = dict(params)
    grown["shared"] = {**params["shared"], "embedding": _append(embedding, count)}
    if "lm_head" in params:
        kernel = np.asarray(params["lm_head"]["kernel"])  # [d, V]
        grown["lm_head"] = {**params["lm_head"], "kernel": _append(kernel.T, count).T}
    return grown, dataclasses.replace(config, vocab_size=config.vocab_size + count)


def _append(old: np.ndarray, count: int) -> jnp.ndarray:
    return jnp.asarray(np.concatenate([np.asarray(old, np.float32), new_rows(old, count)]))
