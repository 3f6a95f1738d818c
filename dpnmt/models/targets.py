"""Teacher-forcing decoder inputs from target labels (T5 and mBART conventions)."""

from __future__ import annotations

import chex
import jax.numpy as jnp

from dpnmt.models.config import MBartConfig, ModelConfig

IGNORE_ID = -100  # label value excluded from the loss (Hugging Face convention)


def shift_right(
    labels: chex.Array, *, decoder_start_token_id: int, pad_token_id: int
) -> chex.Array:
    """T5 decoder inputs: [start, labels[:-1]], with ignored labels replaced by pad.

    Args:
        labels: [batch, tgt_len] int32 target ids (IGNORE_ID allowed).
        decoder_start_token_id: First decoder input (T5/mT5: the pad id).
        pad_token_id: Replaces IGNORE_ID.

    Returns:
        [batch, tgt_len] int32 decoder input ids.
    """
    labels = jnp.asarray(labels)
    start = jnp.full(labels.shape[:1] + (1,), decoder_start_token_id, labels.dtype)
    shifted = jnp.concatenate([start, labels[:, :-1]], axis=1)
    return jnp.where(shifted == IGNORE_ID, pad_token_id, shifted)


def shift_right_wrapping_last(labels: chex.Array, *, pad_token_id: int) -> chex.Array:
    """Decoder inputs for mBART: the last non-pad label (the language id) moves to the front.

    mBART-cc25 targets end `... </s> <lang>` and decode from `<lang>`; mBART-50
    targets are `<lang> ... </s>` and decode from `</s> <lang> ...`. Both follow
    from wrapping the last non-pad token to position 0.

    Args:
        labels: [batch, tgt_len] int32 right-padded target ids (IGNORE_ID allowed).
        pad_token_id: Padding id; also replaces IGNORE_ID.

    Returns:
        [batch, tgt_len] int32 decoder input ids.
    """
    labels = jnp.asarray(labels)
    labels = jnp.where(labels == IGNORE_ID, pad_token_id, labels)
    last = jnp.sum(labels != pad_token_id, axis=1) - 1
    first = jnp.take_along_axis(labels, last[:, None], axis=1)
    return jnp.concatenate([first, labels[:, :-1]], axis=1)


def decoder_inputs(config: ModelConfig, labels: chex.Array) -> chex.Array:
    """Decoder inputs for `labels` following the model family's convention."""
    if isinstance(config, MBartConfig):
        return shift_right_wrapping_last(labels, pad_token_id=config.pad_token_id)
    return shift_right(
        labels,
        decoder_start_token_id=config.decoder_start_token_id,
        pad_token_id=config.pad_token_id,
    )
