"""T5 v1.0 / v1.1 / mT5 encoder-decoder in Flax linen.

Parameters are a plain pytree; dropout draws from the 'dropout' rng stream
(`rngs={'dropout': key}`), so callers may give each example its own key under
`vmap`. Besides the full forward pass (`__call__`), the module exposes the
pieces generation needs: `encode`, `init_cache` and `decode_step`.
"""

from __future__ import annotations

import math

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from dpnmt.models import attention, dropout, lora
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


class T5Attention(nn.Module):
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

    def _heads(self, x: chex.Array) -> chex.Array:
        return x.reshape(x.shape[:2] + (self.config.num_heads, self.config.d_kv))

    def project_kv(self, states: chex.Array) -> tuple[chex.Array, chex.Array]:
        """Keys and values [batch, len, heads, d_kv] of `states` [batch, len, d_model]."""
        return self._heads(self.k(states)), self._heads(self.v(states))

    def __call__(
        self,
        hidden: chex.Array,
        key: chex.Array,
        value: chex.Array,
        *,
        mask: chex.Array,
        bias: chex.Array | None,
        deterministic: bool,
    ) -> chex.Array:
        """Attends `hidden` [batch, q_len, d_model] over projected keys/values."""
        query = self._heads(self.q(hidden))
        out = attention.dot_product_attention(
            query,
            key,
            value,
            mask=mask,
            bias=bias,
            dropout=lambda w: self.dropout(w, deterministic=deterministic),
        )
        return self.o(out)


class T5Block(nn.Module):
    """Pre-norm block: self-attention, [cross-attention,] feed-forward."""

    config: T5Config
    is_decoder: bool

    def setup(self):  # noqa: D102 (flax hook)
        cfg = self.config
        self.self_attention_norm = RMSNorm(cfg.layer_norm_epsilon)
        self.self_attention = T5Attention(cfg)
        if self.is_decoder:
            self.cross_attention_norm = RMSNorm(cfg.layer_norm_epsilon)
            self.cross_attention = T5Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.layer_norm_epsilon)
        self.ffn = T5FeedForward(cfg)
        self.dropout = dropout.Dropout(cfg.dropout_rate)

    def init_cache(self, encoded: chex.Array, max_length: int) -> dict[str, chex.Array]:
        """Empty self-attention cache and precomputed cross-attention keys/values."""
        cfg = self.config
        batch = encoded.shape[0]
        empty = jnp.zeros((batch, max_length, cfg.num_heads, cfg.d_kv), encoded.dtype)
        cross_k, cross_v = self.cross_attention.project_kv(encoded)
        return {"self_k": empty, "self_v": empty, "cross_k": cross_k, "cross_v": cross_v}

    def __call__(
        self,
        x: chex.Array,
        *,
        self_mask: chex.Array,
        self_bias: chex.Array,
        encoded: chex.Array | None = None,
        cross_mask: chex.Array | None = None,
        deterministic: bool = True,
        cache: dict[str, chex.Array] | None = None,
        cache_index: chex.Array | None = None,
    ) -> tuple[chex.Array, dict[str, chex.Array] | None]:
        """Runs the block on [batch, len, d_model]; with `cache`, len is 1.

        Returns:
            The block output and the updated cache (None without a cache).
        """
        normed = self.self_attention_norm(x)
        key, value = self.self_attention.project_kv(normed)
        if cache is not None:
            cache = dict(cache)
            cache["self_k"] = attention.write_cache(cache["self_k"], key, cache_index)
            cache["self_v"] = attention.write_cache(cache["self_v"], value, cache_index)
            key, value = cache["self_k"], cache["self_v"]
        out = self.self_attention(
            normed, key, value, mask=self_mask, bias=self_bias, deterministic=deterministic
        )
        x = x + self.dropout(out, deterministic=deterministic)
        if self.is_decoder:
            normed = self.cross_attention_norm(x)
            if cache is not None:
                key, value = cache["cross_k"], cache["cross_v"]
            else:
                key, value = self.cross_attention.project_kv(encoded)
            out = self.cross_attention(
                normed, key, value, mask=cross_mask, bias=None, deterministic=deterministic
            )
            x = x + self.dropout(out, deterministic=deterministic)
        out = self.ffn(self.ffn_norm(x), deterministic=deterministic)
        return x + self.dropout(out, deterministic=deterministic), cache


class T5Stack(nn.Module):
    """Encoder or decoder stack over already-embedded tokens."""

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

    def position_bias(self, query_positions: chex.Array, key_positions: chex.Array) -> chex.Array:
        """Relative position bias [1, heads, q_len, k_len]."""
        cfg = self.config
        buckets = relative_position_bucket(
            key_positions[None, :] - query_positions[:, None],
            bidirectional=not self.is_decoder,
            num_buckets=cfg.relative_attention_num_buckets,
            max_distance=cfg.relative_attention_max_distance,
        )
        return jnp.transpose(self.relative_attention_bias(buckets), (2, 0, 1))[None]

    def __call__(
        self,
        embedded: chex.Array,
        attention_mask: chex.Array | None,
        *,
        encoded: chex.Array | None = None,
        encoder_attention_mask: chex.Array | None = None,
        deterministic: bool = True,
    ) -> chex.Array:
        """Full-sequence pass: [batch, len, d_model] -> [batch, len, d_model].

        Args:
            embedded: Token embeddings.
            attention_mask: [batch, len] 0/1 padding mask of this stack's tokens.
            encoded: Encoder output (decoder only).
            encoder_attention_mask: [batch, src_len] encoder padding mask.
            deterministic: Disables dropout when True.
        """
        batch, length = embedded.shape[:2]
        positions = jnp.arange(length)
        bias = self.position_bias(positions, positions)
        mask = attention.padding_mask(attention_mask, batch, length)
        cross_mask = None
        if self.is_decoder:
            mask = mask & attention.causal_mask(length)
            cross_mask = attention.padding_mask(encoder_attention_mask, batch, encoded.shape[1])
        x = self.dropout(embedded, deterministic=deterministic)
        for block in self.block:
            x, _ = block(
                x,
                self_mask=mask,
                self_bias=bias,
                encoded=encoded,
                cross_mask=cross_mask,
                deterministic=deterministic,
            )
        return self.dropout(self.final_norm(x), deterministic=deterministic)

    def init_cache(self, encoded: chex.Array, max_length: int) -> dict[str, dict[str, chex.Array]]:
        """Per-block decoding caches for `max_length` target positions."""
        return {f"block_{i}": b.init_cache(encoded, max_length) for i, b in enumerate(self.block)}

    def decode_step(
        self,
        embedded: chex.Array,
        index: chex.Array,
        cache: dict[str, dict[str, chex.Array]],
        encoder_attention_mask: chex.Array | None,
    ) -> tuple[chex.Array, dict[str, dict[str, chex.Array]]]:
        """One decoder position: [batch, 1, d_model] at `index` -> same shape, new cache."""
        batch = embedded.shape[0]
        max_length = cache["block_0"]["self_k"].shape[1]
        key_positions = jnp.arange(max_length)
        bias = self.position_bias(jnp.reshape(index, (1,)), key_positions)
        mask = (key_positions <= index)[None, None, None, :]
        src_len = cache["block_0"]["cross_k"].shape[1]
        cross_mask = attention.padding_mask(encoder_attention_mask, batch, src_len)
        x = embedded
        new_cache = {}
        for i, block in enumerate(self.block):
            x, new_cache[f"block_{i}"] = block(
                x,
                self_mask=mask,
                self_bias=bias,
                cross_mask=cross_mask,
                cache=cache[f"block_{i}"],
                cache_index=index,
            )
        return self.final_norm(x), new_cache


class T5ForConditionalGeneration(nn.Module):
    """T5 / mT5 encoder-decoder with a language-model head.

    Attributes:
        config: Architecture.
    """

    config: T5Config

    def setup(self):  # noqa: D102 (flax hook)
        cfg = self.config
        self.shared = nn.Embed(
            cfg.vocab_size, cfg.d_model, embedding_init=nn.initializers.normal(1.0)
        )
        self.encoder = T5Stack(cfg, is_decoder=False)
        self.decoder = T5Stack(cfg, is_decoder=True)
        if not cfg.tie_word_embeddings:
            # std d_model^-0.5 (fan-in, as t5x's logits layer): the final
            # RMS-normed states have unit scale, so std 1 would give logits
            # of std sqrt(d_model) and an initial loss of ~d_model/2 nats.
            self.lm_head = nn.Dense(
                cfg.vocab_size,
                use_bias=False,
                kernel_init=nn.initializers.normal(cfg.d_model**-0.5),
            )

    def __call__(
        self,
        input_ids: chex.Array,
        attention_mask: chex.Array,
        decoder_input_ids: chex.Array,
        decoder_attention_mask: chex.Array | None = None,
        deterministic: bool = True,
    ) -> chex.Array:
        """Teacher-forced logits.

        Args:
            input_ids: [batch, src_len] int32 source tokens.
            attention_mask: [batch, src_len] 1 for real tokens, 0 for padding.
            decoder_input_ids: [batch, tgt_len] int32 shifted-right targets.
            decoder_attention_mask: [batch, tgt_len] target padding mask, or None.
            deterministic: Disables dropout when True; otherwise needs a
                'dropout' rng.

        Returns:
            [batch, tgt_len, vocab_size] float32 logits.
        """
        encoded = self.encode(input_ids, attention_mask, deterministic=deterministic)
        return self.decode(
            decoder_input_ids,
            encoded,
            attention_mask,
            decoder_attention_mask=decoder_attention_mask,
            deterministic=deterministic,
        )

    def encode(
        self, input_ids: chex.Array, attention_mask: chex.Array, deterministic: bool = True
    ) -> chex.Array:
        """Encoder states [batch, src_len, d_model]."""
        return self.encoder(self.shared(input_ids), attention_mask, deterministic=deterministic)

    def decode(
        self,
        decoder_input_ids: chex.Array,
        encoded: chex.Array,
        attention_mask: chex.Array,
        decoder_attention_mask: chex.Array | None = None,
        deterministic: bool = True,
    ) -> chex.Array:
        """Teacher-forced logits [batch, tgt_len, vocab] from encoder states."""
        hidden = self.decoder(
            self.shared(decoder_input_ids),
            decoder_attention_mask,
            encoded=encoded,
            encoder_attention_mask=attention_mask,
            deterministic=deterministic,
        )
        return self._logits(hidden)

    def _logits(self, hidden: chex.Array) -> chex.Array:
        if self.config.scale_decoder_outputs:
            hidden = hidden * (self.config.d_model**-0.5)
        if self.config.tie_word_embeddings:
            return self.shared.attend(hidden)
        return self.lm_head(hidden)

    def init_cache(self, encoded: chex.Array, max_length: int) -> dict:
        """Decoding cache for `max_length` target positions (cross keys precomputed)."""
        return self.decoder.init_cache(encoded, max_length)

    def decode_step(
        self,
        token_ids: chex.Array,
        index: chex.Array,
        cache: dict,
        attention_mask: chex.Array,
    ) -> tuple[chex.Array, dict]:
        """Logits for one target position.

        Args:
            token_ids: [batch] int32 tokens at position `index`.
            index: Scalar int32 target position.
            cache: From `init_cache` or the previous step.
            attention_mask: [batch, src_len] source padding mask.

        Returns:
            ([batch, vocab] float32 logits of the next token, updated cache).
        """
        hidden, cache = self.decoder.decode_step(
            self.shared(token_ids[:, None]), index, cache, attention_mask
        )
        return self._logits(hidden)[:, 0], cache
