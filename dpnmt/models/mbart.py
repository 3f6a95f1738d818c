"""mBART (cc25 / mBART-50) encoder-decoder in Flax linen.

Pre-norm transformer with learned positions (offset by 2, as in fairseq),
an embedding layer norm, optional sqrt(d_model) embedding scaling and a tied
output projection plus `final_logits_bias`. The interface (`__call__`,
`encode`, `decode`, `init_cache`, `decode_step`), the layer and the stack
plumbing are `dpnmt.models.seq2seq`'s, shared with T5.
"""

from __future__ import annotations

import math

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from dpnmt.models import dropout, lora, seq2seq
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


class MBartAttention(seq2seq.Attention):
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

    def _head_shape(self) -> tuple[int, int]:
        return self.num_heads, self.d_model // self.num_heads

    def _scale(self) -> float:
        return (self.d_model // self.num_heads) ** -0.5


class MBartLayer(seq2seq.PreNormLayer):
    """Pre-norm layer: self-attention, [cross-attention,] feed-forward."""

    config: MBartConfig
    is_decoder: bool

    def _norm(self) -> nn.LayerNorm:
        return _layer_norm(self.config)

    def _attention(self) -> MBartAttention:
        cfg = self.config
        heads = cfg.decoder_attention_heads if self.is_decoder else cfg.encoder_attention_heads
        return MBartAttention(cfg.d_model, heads, cfg.attention_dropout, cfg.lora)

    def _ffn(self) -> MBartFeedForward:
        cfg = self.config
        return MBartFeedForward(
            cfg, cfg.decoder_ffn_dim if self.is_decoder else cfg.encoder_ffn_dim
        )

    def _dropout_rate(self) -> float:
        return self.config.dropout


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


class MBartStack(seq2seq.Stack):
    """Encoder or decoder stack of `MBartLayer`s (parameters `layers_0`, ...).

    Learned positions (offset by 2) and a layer norm on the embedded tokens
    come before the layers, a final layer norm after them.
    """

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

    def _layers(self) -> list[MBartLayer]:
        return self.layers

    def _embed(self, embedded: chex.Array, positions: chex.Array, deterministic: bool):
        x = embedded + self.embed_positions(positions[None] + POSITION_OFFSET)
        return self.dropout(self.layernorm_embedding(x), deterministic=deterministic)

    def _final(self, x: chex.Array, deterministic: bool) -> chex.Array:
        del deterministic  # no dropout after the final norm
        return self.layer_norm(x)


class MBartForConditionalGeneration(seq2seq.EncoderDecoder):
    """mBART encoder-decoder; logits: tied (or `lm_head`) projection plus `final_logits_bias`.

    Attributes:
        config: Architecture.
    """

    config: MBartConfig

    stack_class = MBartStack

    def _init_std(self, name: str) -> float:
        del name  # one std for every weight, as transformers' `init_std`
        return _INIT_STD

    def setup(self):  # noqa: D102 (flax hook)
        super().setup()
        self.final_logits_bias = self.param(
            "final_logits_bias", nn.initializers.zeros, (self.config.vocab_size,)
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

    def _logits(self, hidden: chex.Array) -> chex.Array:
        if self.config.tie_word_embeddings:
            logits = self.shared.attend(hidden)
        else:
            logits = self.lm_head(hidden)
        return logits + self.final_logits_bias
