"""mBART (cc25 / mBART-50) encoder-decoder in Flax linen.

Pre-norm transformer with learned positions (offset by 2, as in fairseq),
an embedding layer norm, optional sqrt(d_model) embedding scaling and a tied
output projection plus `final_logits_bias`. Same interface as the T5 module:
`__call__`, `encode`, `decode`, `init_cache`, `decode_step`.
"""

from __future__ import annotations

import math

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from dpnmt.models import attention, dropout, lora
from dpnmt.models.config import LoRASpec, MBartConfig

POSITION_OFFSET = 2
_INIT_STD = 0.02

_ACTIVATIONS = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "tanh": jnp.tanh,
}


def _layer_norm(config: MBartConfig, name: str | None = None) -> nn.LayerNorm:
    return nn.LayerNorm(epsilon=config.layer_norm_eps, use_fast_variance=False, name=name)


def _dense(spec: LoRASpec, target: str, features: int, name: str | None = None) -> nn.Module:
    """A biased dense layer (`target` names it for the adapters; `name` only in compact)."""
    init = nn.initializers.normal(_INIT_STD)
    if name is not None:
        return lora.dense(spec, target, features, kernel_init=init, name=name)
    return lora.dense(spec, target, features, kernel_init=init)


class MBartAttention(nn.Module):
    """Multi-head attention with biases and head_dim**-0.5 query scaling."""

    d_model: int
    num_heads: int
    dropout_rate: float
    adapters: LoRASpec = LoRASpec()

    def setup(self):  # noqa: D102 (flax hook)
        if self.d_model % self.num_heads:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}."
            )
        self.q = _dense(self.adapters, "q", self.d_model)
        self.k = _dense(self.adapters, "k", self.d_model)
        self.v = _dense(self.adapters, "v", self.d_model)
        self.o = _dense(self.adapters, "o", self.d_model)
        self.dropout = dropout.Dropout(self.dropout_rate)

    def _heads(self, x: chex.Array) -> chex.Array:
        return x.reshape(x.shape[:2] + (self.num_heads, self.d_model // self.num_heads))

    def project_kv(self, states: chex.Array) -> tuple[chex.Array, chex.Array]:
        """Keys and values [batch, len, heads, head_dim] of `states` [batch, len, d_model]."""
        return self._heads(self.k(states)), self._heads(self.v(states))

    def __call__(
        self,
        hidden: chex.Array,
        key: chex.Array,
        value: chex.Array,
        *,
        mask: chex.Array,
        deterministic: bool,
    ) -> chex.Array:
        """Attends `hidden` [batch, q_len, d_model] over projected keys/values."""
        out = attention.dot_product_attention(
            self._heads(self.q(hidden)),
            key,
            value,
            mask=mask,
            scale=(self.d_model // self.num_heads) ** -0.5,
            dropout=lambda w: self.dropout(w, deterministic=deterministic),
        )
        return self.o(out)


class MBartLayer(nn.Module):
    """Pre-norm layer: self-attention, [cross-attention,] feed-forward."""

    config: MBartConfig
    is_decoder: bool

    def setup(self):  # noqa: D102 (flax hook)
        cfg = self.config
        heads = cfg.decoder_attention_heads if self.is_decoder else cfg.encoder_attention_heads
        ffn_dim = cfg.decoder_ffn_dim if self.is_decoder else cfg.encoder_ffn_dim
        self.self_attention_norm = _layer_norm(cfg)
        self.self_attention = MBartAttention(cfg.d_model, heads, cfg.attention_dropout, cfg.lora)
        if self.is_decoder:
            self.cross_attention_norm = _layer_norm(cfg)
            self.cross_attention = MBartAttention(
                cfg.d_model, heads, cfg.attention_dropout, cfg.lora
            )
        self.ffn_norm = _layer_norm(cfg)
        self.ffn = MBartFeedForward(cfg, ffn_dim)
        self.dropout = dropout.Dropout(cfg.dropout)

    def init_cache(self, encoded: chex.Array, max_length: int) -> dict[str, chex.Array]:
        """Empty self-attention cache and precomputed cross-attention keys/values."""
        cfg = self.config
        heads = cfg.decoder_attention_heads
        shape = (encoded.shape[0], max_length, heads, cfg.d_model // heads)
        empty = jnp.zeros(shape, encoded.dtype)
        cross_k, cross_v = self.cross_attention.project_kv(encoded)
        return {"self_k": empty, "self_v": empty, "cross_k": cross_k, "cross_v": cross_v}

    def __call__(
        self,
        x: chex.Array,
        *,
        self_mask: chex.Array,
        encoded: chex.Array | None = None,
        cross_mask: chex.Array | None = None,
        deterministic: bool = True,
        cache: dict[str, chex.Array] | None = None,
        cache_index: chex.Array | None = None,
    ) -> tuple[chex.Array, dict[str, chex.Array] | None]:
        """Runs the layer on [batch, len, d_model]; with `cache`, len is 1."""
        normed = self.self_attention_norm(x)
        key, value = self.self_attention.project_kv(normed)
        if cache is not None:
            cache = dict(cache)
            cache["self_k"] = attention.write_cache(cache["self_k"], key, cache_index)
            cache["self_v"] = attention.write_cache(cache["self_v"], value, cache_index)
            key, value = cache["self_k"], cache["self_v"]
        out = self.self_attention(normed, key, value, mask=self_mask, deterministic=deterministic)
        x = x + self.dropout(out, deterministic=deterministic)
        if self.is_decoder:
            normed = self.cross_attention_norm(x)
            if cache is not None:
                key, value = cache["cross_k"], cache["cross_v"]
            else:
                key, value = self.cross_attention.project_kv(encoded)
            out = self.cross_attention(
                normed, key, value, mask=cross_mask, deterministic=deterministic
            )
            x = x + self.dropout(out, deterministic=deterministic)
        out = self.ffn(self.ffn_norm(x), deterministic=deterministic)
        return x + self.dropout(out, deterministic=deterministic), cache


class MBartFeedForward(nn.Module):
    """fc1 -> activation -> dropout -> fc2."""

    config: MBartConfig
    hidden_dim: int

    @nn.compact
    def __call__(self, x: chex.Array, deterministic: bool) -> chex.Array:
        """Maps [batch, len, d_model] to [batch, len, d_model]."""
        cfg = self.config
        hidden = _ACTIVATIONS[cfg.activation_function](
            _dense(cfg.lora, "fc1", self.hidden_dim, "fc1")(x)
        )
        hidden = dropout.Dropout(cfg.activation_dropout)(hidden, deterministic=deterministic)
        return _dense(cfg.lora, "fc2", cfg.d_model, "fc2")(hidden)


class MBartStack(nn.Module):
    """Encoder or decoder stack over already-embedded (and scaled) tokens."""

    config: MBartConfig
    is_decoder: bool

    def setup(self):  # noqa: D102 (flax hook)
        cfg = self.config
        num_layers = cfg.decoder_layers if self.is_decoder else cfg.encoder_layers
        self.embed_positions = nn.Embed(
            cfg.max_position_embeddings + POSITION_OFFSET,
            cfg.d_model,
            embedding_init=nn.initializers.normal(_INIT_STD),
        )
        self.layernorm_embedding = _layer_norm(cfg)
        self.layers = [MBartLayer(cfg, self.is_decoder) for _ in range(num_layers)]
        self.layer_norm = _layer_norm(cfg)
        self.dropout = dropout.Dropout(cfg.dropout)

    def _embed(self, embedded: chex.Array, positions: chex.Array, deterministic: bool):
        x = embedded + self.embed_positions(positions + POSITION_OFFSET)
        return self.dropout(self.layernorm_embedding(x), deterministic=deterministic)

    def __call__(
        self,
        embedded: chex.Array,
        attention_mask: chex.Array | None,
        *,
        encoded: chex.Array | None = None,
        encoder_attention_mask: chex.Array | None = None,
        deterministic: bool = True,
    ) -> chex.Array:
        """Full-sequence pass: [batch, len, d_model] -> [batch, len, d_model]."""
        batch, length = embedded.shape[:2]
        mask = attention.padding_mask(attention_mask, batch, length)
        cross_mask = None
        if self.is_decoder:
            mask = mask & attention.causal_mask(length)
            cross_mask = attention.padding_mask(encoder_attention_mask, batch, encoded.shape[1])
        x = self._embed(embedded, jnp.arange(length)[None], deterministic)
        for layer in self.layers:
            x, _ = layer(
                x,
                self_mask=mask,
                encoded=encoded,
                cross_mask=cross_mask,
                deterministic=deterministic,
            )
        return self.layer_norm(x)

    def init_cache(self, encoded: chex.Array, max_length: int) -> dict[str, dict[str, chex.Array]]:
        """Per-layer decoding caches for `max_length` target positions."""
        return {
            f"layers_{i}": la.init_cache(encoded, max_length) for i, la in enumerate(self.layers)
        }

    def decode_step(
        self,
        embedded: chex.Array,
        index: chex.Array,
        cache: dict[str, dict[str, chex.Array]],
        encoder_attention_mask: chex.Array | None,
    ) -> tuple[chex.Array, dict[str, dict[str, chex.Array]]]:
        """One decoder position: [batch, 1, d_model] at `index` -> same shape, new cache."""
        batch = embedded.shape[0]
        max_length = cache["layers_0"]["self_k"].shape[1]
        mask = (jnp.arange(max_length) <= index)[None, None, None, :]
        src_len = cache["layers_0"]["cross_k"].shape[1]
        cross_mask = attention.padding_mask(encoder_attention_mask, batch, src_len)
        x = self._embed(embedded, jnp.reshape(index, (1, 1)), deterministic=True)
        new_cache = {}
        for i, layer in enumerate(self.layers):
            x, new_cache[f"layers_{i}"] = layer(
                x,
                self_mask=mask,
                cross_mask=cross_mask,
                cache=cache[f"layers_{i}"],
                cache_index=index,
            )
        return self.layer_norm(x), new_cache


class MBartForConditionalGeneration(nn.Module):
    """mBART encoder-decoder with a language-model head.

    Attributes:
        config: Architecture.
    """

    config: MBartConfig

    def setup(self):  # noqa: D102 (flax hook)
        cfg = self.config
        self.shared = nn.Embed(
            cfg.vocab_size, cfg.d_model, embedding_init=nn.initializers.normal(_INIT_STD)
        )
        self.encoder = MBartStack(cfg, is_decoder=False)
        self.decoder = MBartStack(cfg, is_decoder=True)
        self.final_logits_bias = self.param(
            "final_logits_bias", nn.initializers.zeros, (cfg.vocab_size,)
        )
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Dense(
                cfg.vocab_size, use_bias=False, kernel_init=nn.initializers.normal(_INIT_STD)
            )

    def _embed_tokens(self, ids: chex.Array) -> chex.Array:
        """[batch, len, d_model] scaled token embeddings; the pad row's lookup gets no gradient.

        As transformers' `nn.Embedding(padding_idx=pad)`: the values are kept, but
        looking up the pad token never updates its row (the tied output projection
        still does). The stop-gradient acts on the `nn.Embed` output, so ghost
        clipping, which reads that output's gradient, stays exact.
        """
        scale = math.sqrt(self.config.d_model) if self.config.scale_embedding else 1.0
        embedded = self.shared(ids)
        is_pad = (ids == self.config.pad_token_id)[..., None]
        embedded = jnp.where(is_pad, jax.lax.stop_gradient(embedded), embedded)
        return embedded * scale

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
            input_ids: [batch, src_len] int32 source tokens (mBART-50: lang id first).
            attention_mask: [batch, src_len] 1 for real tokens, 0 for padding.
            decoder_input_ids: [batch, tgt_len] int32 decoder inputs, starting with
                `decoder_start_token_id` (and the target language id).
            decoder_attention_mask: [batch, tgt_len] target padding mask, or None.
            deterministic: Disables dropout when True; otherwise needs a 'dropout' rng.

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
        return self.encoder(
            self._embed_tokens(input_ids), attention_mask, deterministic=deterministic
        )

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
            self._embed_tokens(decoder_input_ids),
            decoder_attention_mask,
            encoded=encoded,
            encoder_attention_mask=attention_mask,
            deterministic=deterministic,
        )
        return self._logits(hidden)

    def _logits(self, hidden: chex.Array) -> chex.Array:
        if self.config.tie_word_embeddings:
            logits = self.shared.attend(hidden)
        else:
            logits = self.lm_head(hidden)
        return logits + self.final_logits_bias

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
        """Logits [batch, vocab] for one target position; see the T5 module."""
        hidden, cache = self.decoder.decode_step(
            self._embed_tokens(token_ids[:, None]), index, cache, attention_mask
        )
        return self._logits(hidden)[:, 0], cache
