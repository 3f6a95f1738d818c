"""Attention arithmetic shared by the T5 and mBART modules (no parameters)."""

from __future__ import annotations

from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp


def dot_product_attention(
    query: chex.Array,
    key: chex.Array,
    value: chex.Array,
    *,
    mask: chex.Array,
    bias: chex.Array | None = None,
    scale: float = 1.0,
    dropout: Callable[[chex.Array], chex.Array] | None = None,
    cache_layout: bool = False,
) -> chex.Array:
    """Softmax attention of queries over keys, masked and optionally biased.

    Args:
        query: [batch, q_len, heads, head_dim].
        key: [batch, k_len, heads, head_dim] ([batch, heads, head_dim, k_len]
            with `cache_layout`).
        value: [batch, k_len, heads, head_dim] (likewise).
        mask: Boolean, broadcastable to [batch, heads, q_len, k_len]; True where
            a query may attend to a key.
        bias: Optional additive bias broadcastable to [batch, heads, q_len, k_len]
            (T5 relative positions).
        scale: Multiplier of the query-key dot product (T5: 1, mBART: head_dim**-0.5).
        dropout: Optional function applied to the attention weights.
        cache_layout: Keys and values come from a decoding cache, laid out
            [batch, heads, head_dim, k_len]: the layout XLA's CPU dot wants,
            so no step transposes the whole cache (the same arithmetic).

    Returns:
        [batch, q_len, heads * head_dim] attended values.
    """
    kv = "bhdk" if cache_layout else "bkhd"
    scores = jnp.einsum(f"bqhd,{kv}->bhqk", query, key) * scale
    if bias is not None:
        scores = scores + bias
    scores = scores.astype(jnp.float32)
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(value.dtype)
    if dropout is not None:
        weights = dropout(weights)
    out = jnp.einsum(f"bhqk,{kv}->bqhd", weights, value)
    return out.reshape(out.shape[:2] + (-1,))


def write_cache(cache: chex.Array, new: chex.Array, index: chex.Array) -> chex.Array:
    """Writes one step of keys or values into a static-shape cache.

    Args:
        cache: [batch, heads, head_dim, max_len] (`to_cache_layout`).
        new: [batch, 1, heads, head_dim], the current step.
        index: Scalar int32 position to write.

    Returns:
        The cache with `new` at position `index`.
    """
    zero = jnp.zeros((), jnp.int32)
    new = to_cache_layout(new).astype(cache.dtype)
    return jax.lax.dynamic_update_slice(cache, new, (zero, zero, zero, index))


def to_cache_layout(states: chex.Array) -> chex.Array:
    """[batch, len, heads, head_dim] keys or values -> [batch, heads, head_dim, len]."""
    return jnp.transpose(states, (0, 2, 3, 1))


def follow_history(cache: chex.Array, history: chex.Array) -> chex.Array:
    """Keys or values along each row's history: out[i, ..., t] = cache[history[i, t], ..., t].

    Beam search writes every step's keys into the row of the beam that computed
    them and reorders beams through `history` alone: one gather per use instead
    of copying the whole cache every step.

    Args:
        cache: [batch, heads, head_dim, max_len].
        history: [batch, max_len] int32 rows of `cache`.

    Returns:
        [batch, heads, head_dim, max_len].
    """
    by_position = jnp.moveaxis(cache, -1, 1)  # [batch, max_len, heads, head_dim]
    followed = by_position[history, jnp.arange(cache.shape[-1])[None, :]]
    return jnp.moveaxis(followed, 1, -1)


def padding_mask(attention_mask: chex.Array | None, batch: int, length: int) -> chex.Array:
    """Key mask [batch, 1, 1, length] from a [batch, length] 0/1 mask (None: all ones)."""
    if attention_mask is None:
        return jnp.ones((batch, 1, 1, length), bool)
    return attention_mask.astype(bool)[:, None, None, :]


def causal_mask(length: int) -> chex.Array:
    """[1, 1, length, length] lower-triangular boolean mask."""
    return jnp.tril(jnp.ones((length, length), bool))[None, None]
