"""T5 v1.0 / v1.1 / mT5 encoder-decoder in Flax linen.

Parameters are a plain pytree; dropout draws from the 'dropout' rng stream
(`rngs={'dropout': key}`), so callers may give each example its own key under
`vmap`. Besides the full forward pass (`__call__`), the module exposes the
pieces generation needs: `encode`, `init_cache` and `decode_step` (all from
`seq2seq.EncoderDecoder`; this module holds what is T5's own: RMS norm,
relative position bias, unscaled attention, ReLU / gated feed-forward).
"""

from __future__ import annotations

import math

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from dpnmt.models import dropout, lora, seq2seq
from dpnmt.models.config import T5Config

_ACTIVATIONS = {
    "relu": jax.nn.relu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "silu": jax.nn.silu,
}


def relative_position_bucket(
    relative_position: chex.Array, *, bidirectional: bool, num_buckets: int, max_distance: int
) -> chex.Array:
    """Maps key-minus-query distances to T5's log-spaced buckets.

    Args:
        relative_position: int32 array of (key position - query position).
        bidirectional: True for the encoder (sign gets its own half of the buckets).
        num_buckets: Total buckets.
        max_distance: Distance at which the log buckets saturate.

    Returns:
        int32 array, same shape, values in [0, num_buckets).
    """
    buckets = jnp.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).astype(jnp.int32) * num_buckets
        distance = jnp.abs(relative_position)
    else:
        distance = -jnp.minimum(relative_position, 0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    safe = jnp.maximum(distance, 1).astype(jnp.float32)
    large = max_exact + (
        jnp.log(safe / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).astype(jnp.int32)
    large = jnp.minimum(large, num_buckets - 1)
    return buckets + jnp.where(is_small, distance, large)


class RMSNorm(nn.Module):
    """T5 layer norm: scale only, no mean subtraction, no bias."""

    epsilon: float

    @nn.compact
    def __call__(self, x: chex.Array) -> chex.Array:
        """Normalises the last axis of `x` [..., d_model]."""
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],))
        x32 = x.astype(jnp.float32)
        variance = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
        return scale * (x32 * jax.lax.rsqrt(variance + self.epsilon))


class T5FeedForward(nn.Module):
    """ReLU (v1.0) or gated-GELU (v1.1, mT5) feed-forward layer."""

    config: T5Config

    @nn.compact
    def __call__(self, x: chex.Array, deterministic: bool) -> chex.Array:
        """Maps [batch, len, d_model] to [batch, len, d_model]."""
        cfg = self.config
        act = _ACTIVATIONS[cfg.dense_act_fn]
        init_in = nn.initializers.normal(cfg.d_model**-0.5)
        init_out = nn.initializers.normal(cfg.d_ff**-0.5)

        def dense(name, features, init):
            return lora.dense(cfg.lora, name, features, use_bias=False, kernel_init=init, name=name)

        if cfg.is_gated_act:
            gate = act(dense("wi_0", cfg.d_ff, init_in)(x))
            hidden = gate * dense("wi_1", cfg.d_ff, init_in)(x)
        else:
            hidden = act(dense("wi", cfg.d_ff, init_in)(x))
        hidden = dropout.Dropout(cfg.dropout_rate)(hidden, deterministic=deterministic)
        return dense("wo", cfg.d_model, init_out)(hidden)


class T5Attention(seq2seq.Attention):
    """Multi-head attention without biases or query scaling (T5 style)."""

    config: T5Config

    def setup(self):  # noqa: D102 (flax hook)
        cfg = self.config
        inner = cfg.num_heads * cfg.d_kv

        def dense(name, features, std):
            init = nn.initializers.normal(std)
            return lora.dense(cfg.lora, name, features, use_bias=False, kernel_init=init)

        self.q = dense("q", inner, (cfg.d_model * cfg.d_kv) ** -0.5)
        self.k = dense("k", inner, cfg.d_model**-0.5)
        self.v = dense("v", inner, cfg.d_model**-0.5)
        self.o = dense("o", cfg.d_model, inner**-0.5)
        self.dropout = dropout.Dropout(cfg.dropout_rate)

    def _head_shape(self) -> tuple[int, int]:
        return self.config.num_heads, self.config.d_kv


class T5Block(seq2seq.PreNormLayer):
    """Pre-norm block: self-attention, [cross-attention,] feed-forward."""

    config: T5Config
    is_decoder: bool

    def _norm(self) -> RMSNorm:
        return RMSNorm(self.config.layer_norm_epsilon)

    def _attention(self) -> T5Attention:
        return T5Attention(self.config)

    def _ffn(self) -> T5FeedForward:
        return T5FeedForward(self.config)

    def _dropout_rate(self) -> float:
        return self.config.dropout_rate


class T5Stack(seq2seq.Stack):
    """Encoder or decoder stack of `T5Block`s (parameters `block_0`, `block_1`, ...).

    Positions enter only as a relative position bias on the self-attention
    scores, one table shared by all blocks; the output is RMS-normed.
    """

    config: T5Config
    is_decoder: bool

    def setup(self):  # noqa: D102 (flax hook)
        cfg = self.config
        num_blocks = cfg.num_decoder_layers if self.is_decoder else cfg.num_layers
        self.relative_attention_bias = nn.Embed(
            cfg.relative_attention_num_buckets,
            cfg.num_heads,
            embedding_init=nn.initializers.normal(cfg.d_model**-0.5),
        )
        self.block = [T5Block(cfg, self.is_decoder) for _ in range(num_blocks)]
        self.final_norm = RMSNorm(cfg.layer_norm_epsilon)
        self.dropout = dropout.Dropout(cfg.dropout_rate)

    def _layers(self) -> list[T5Block]:
        return self.block

    def _self_bias(self, query_positions: chex.Array, key_positions: chex.Array) -> chex.Array:
        """Relative position bias [1, heads, q_len, k_len]."""
        cfg = self.config
        buckets = relative_position_bucket(
            key_positions[None, :] - query_positions[:, None],
            bidirectional=not self.is_decoder,
            num_buckets=cfg.relative_attention_num_buckets,
            max_distance=cfg.relative_attention_max_distance,
        )
        return jnp.transpose(self.relative_attention_bias(buckets), (2, 0, 1))[None]

    def _embed(self, embedded: chex.Array, positions: chex.Array, deterministic: bool):
        del positions  # T5's positions enter through the attention bias.
        return self.dropout(embedded, deterministic=deterministic)

    def _final(self, x: chex.Array, deterministic: bool) -> chex.Array:
        return self.dropout(self.final_norm(x), deterministic=deterministic)


class T5ForConditionalGeneration(seq2seq.EncoderDecoder):
    """T5 / mT5 encoder-decoder with a language-model head.

    v1.0 projects onto the shared embedding after scaling the decoder output
    by d_model**-0.5; v1.1 and mT5 use an untied `lm_head`, unscaled.

    Attributes:
        config: Architecture.
    """

    config: T5Config

    stack_class = T5Stack

    def _init_std(self, name: str) -> float:
        # lm_head: std d_model^-0.5 (fan-in, as t5x's logits layer): the final
        # RMS-normed states have unit scale, so std 1 would give logits of std
        # sqrt(d_model) and an initial loss of ~d_model/2 nats.
        return 1.0 if name == "shared" else self.config.d_model**-0.5

    def _embed_tokens(self, ids: chex.Array) -> chex.Array:
        return self.shared(ids)

    def _logits(self, hidden: chex.Array) -> chex.Array:
        if self.config.scale_decoder_outputs:
            hidden = hidden * (self.config.d_model**-0.5)
        if self.config.tie_word_embeddings:
            return self.shared.attend(hidden)
        return self.lm_head(hidden)
