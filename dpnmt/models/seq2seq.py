"""Encoder-decoder plumbing shared by the T5 and mBART modules.

T5 and mBART differ in their norms, projections, feed-forward layers,
positions and output heads; they share the pre-norm residual layer, the
stack's masks, layer loop and key/value cache, and the `encode` / `decode` /
`init_cache` / `decode_step` interface that `dpnmt.models.decoding` drives.
The base classes below hold only that shared code: each model defines its
submodules in `setup` and a few hooks, so parameter names (and checkpoint
paths) are the model's own attribute names.
"""

from __future__ import annotations

from typing import ClassVar

import chex
import flax.linen as nn
import jax.numpy as jnp

from dpnmt.models import attention, dropout

Cache = dict[str, chex.Array]


class Attention(nn.Module):
    """Multi-head attention over keys and values projected beforehand.

    Subclasses define dense layers `q`, `k`, `v`, `o` and a `dropout` in
    `setup`, and the hook `_head_shape`; `_scale` multiplies the query-key
    dot product (1 unless overridden).
    """

    def _head_shape(self) -> tuple[int, int]:
        """(heads, head_dim)."""
        raise NotImplementedError

    def _scale(self) -> float:
        return 1.0

    def _heads(self, x: chex.Array) -> chex.Array:
        return x.reshape(x.shape[:2] + self._head_shape())

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
        bias: chex.Array | None,
        deterministic: bool,
        cache_layout: bool = False,
    ) -> chex.Array:
        """Attends `hidden` [batch, q_len, d_model] over projected keys/values.

        Args:
            hidden: Query states.
            key: [batch, k_len, heads, head_dim] keys ([batch, heads, head_dim,
                k_len] with `cache_layout`: from a decoding cache).
            value: Values, laid out as `key`.
            mask: Boolean, broadcastable to [batch, heads, q_len, k_len].
            bias: Additive score bias (T5 relative positions) or None.
            deterministic: Disables dropout on the attention weights when True.
            cache_layout: `key` and `value` come from a decoding cache.

        Returns:
            [batch, q_len, d_model].
        """
        out = attention.dot_product_attention(
            self._heads(self.q(hidden)),
            key,
            value,
            mask=mask,
            bias=bias,
            scale=self._scale(),
            dropout=lambda w: self.dropout(w, deterministic=deterministic),
            cache_layout=cache_layout,
        )
        return self.o(out)


class PreNormLayer(nn.Module):
    """Pre-norm residual layer: self-attention, [cross-attention,] feed-forward.

    Subclasses have a field `is_decoder` and define the hooks `_norm` (a new
    norm module), `_attention` (a new `Attention`), `_ffn` (a new feed-forward
    module, called as `ffn(x, deterministic=...)`) and `_dropout_rate`.
    """

    def _norm(self) -> nn.Module:
        raise NotImplementedError

    def _attention(self) -> Attention:
        raise NotImplementedError

    def _ffn(self) -> nn.Module:
        raise NotImplementedError

    def _dropout_rate(self) -> float:
        raise NotImplementedError

    def setup(self):  # noqa: D102 (flax hook)
        self.self_attention_norm = self._norm()
        self.self_attention = self._attention()
        if self.is_decoder:
            self.cross_attention_norm = self._norm()
            self.cross_attention = self._attention()
        self.ffn_norm = self._norm()
        self.ffn = self._ffn()
        self.dropout = dropout.Dropout(self._dropout_rate())

    def init_cache(self, encoded: chex.Array, max_length: int) -> Cache:
        """Empty self-attention cache and precomputed cross-attention keys/values.

        Every entry is laid out [batch, heads, head_dim, len] (`attention.to_cache_layout`).
        """
        cross_k, cross_v = self.cross_attention.project_kv(encoded)
        cross_k, cross_v = attention.to_cache_layout(cross_k), attention.to_cache_layout(cross_v)
        empty = jnp.zeros(cross_k.shape[:3] + (max_length,), encoded.dtype)
        return {"self_k": empty, "self_v": empty, "cross_k": cross_k, "cross_v": cross_v}

    def __call__(
        self,
        x: chex.Array,
        *,
        self_mask: chex.Array,
        self_bias: chex.Array | None = None,
        encoded: chex.Array | None = None,
        cross_mask: chex.Array | None = None,
        deterministic: bool = True,
        cache: Cache | None = None,
        cache_index: chex.Array | None = None,
        history: chex.Array | None = None,
    ) -> tuple[chex.Array, Cache | None]:
        """Runs the layer on [batch, len, d_model]; with `cache`, len is 1.

        `history` (beam search, with `cache`): [batch, max_len] int32, the cache
        row holding each row's key/value at each position (`attention.follow_history`).

        Returns:
            The layer output and the updated cache (None without a cache).
        """
        normed = self.self_attention_norm(x)
        key, value = self.self_attention.project_kv(normed)
        if cache is not None:
            cache = dict(cache)
            cache["self_k"] = attention.write_cache(cache["self_k"], key, cache_index)
            cache["self_v"] = attention.write_cache(cache["self_v"], value, cache_index)
            key, value = cache["self_k"], cache["self_v"]
            if history is not None:
                key = attention.follow_history(key, history)
                value = attention.follow_history(value, history)
        out = self.self_attention(
            normed,
            key,
            value,
            mask=self_mask,
            bias=self_bias,
            deterministic=deterministic,
            cache_layout=cache is not None,
        )
        x = x + self.dropout(out, deterministic=deterministic)
        if self.is_decoder:
            normed = self.cross_attention_norm(x)
            if cache is not None:
                key, value = cache["cross_k"], cache["cross_v"]
            else:
                key, value = self.cross_attention.project_kv(encoded)
            out = self.cross_attention(
                normed,
                key,
                value,
                mask=cross_mask,
                bias=None,
                deterministic=deterministic,
                cache_layout=cache is not None,
            )
            x = x + self.dropout(out, deterministic=deterministic)
        out = self.ffn(self.ffn_norm(x), deterministic=deterministic)
        return x + self.dropout(out, deterministic=deterministic), cache


class Stack(nn.Module):
    """Encoder or decoder stack of `PreNormLayer`s over already-embedded tokens.

    Subclasses have a field `is_decoder`, build their layer list in `setup`
    (its attribute name prefixes the layers' parameter and cache names) and
    define the hooks `_layers`, `_embed`, `_final` and, for a position bias,
    `_self_bias`.
    """

    def _layers(self) -> list[PreNormLayer]:
        raise NotImplementedError

    def _embed(
        self, embedded: chex.Array, positions: chex.Array, deterministic: bool
    ) -> chex.Array:
        """The first layer's input from token embeddings at `positions` [len]."""
        raise NotImplementedError

    def _self_bias(
        self, query_positions: chex.Array, key_positions: chex.Array
    ) -> chex.Array | None:
        """Self-attention score bias broadcastable to [batch, heads, q_len, k_len]."""
        return None

    def _final(self, x: chex.Array, deterministic: bool) -> chex.Array:
        """The stack's output from the last layer's."""
        raise NotImplementedError

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
        bias = self._self_bias(positions, positions)
        mask = attention.padding_mask(attention_mask, batch, length)
        cross_mask = None
        if self.is_decoder:
            mask = mask & attention.causal_mask(length)
            cross_mask = attention.padding_mask(encoder_attention_mask, batch, encoded.shape[1])
        x = self._embed(embedded, positions, deterministic)
        for layer in self._layers():
            x, _ = layer(
                x,
                self_mask=mask,
                self_bias=bias,
                encoded=encoded,
                cross_mask=cross_mask,
                deterministic=deterministic,
            )
        return self._final(x, deterministic)

    def init_cache(self, encoded: chex.Array, max_length: int) -> dict[str, Cache]:
        """Per-layer decoding caches for `max_length` target positions, by layer name."""
        return {layer.name: layer.init_cache(encoded, max_length) for layer in self._layers()}

    def decode_step(
        self,
        embedded: chex.Array,
        index: chex.Array,
        cache: dict[str, Cache],
        encoder_attention_mask: chex.Array | None,
        history: chex.Array | None = None,
    ) -> tuple[chex.Array, dict[str, Cache]]:
        """One decoder position: [batch, 1, d_model] at `index` -> same shape, new cache.

        `history`: see `PreNormLayer.__call__` (None: row i's cache is its own).
        """
        layers = self._layers()
        first = cache[layers[0].name]
        key_positions = jnp.arange(first["self_k"].shape[-1])
        query_positions = jnp.reshape(index, (1,))
        bias = self._self_bias(query_positions, key_positions)
        mask = (key_positions <= index)[None, None, None, :]
        cross_mask = attention.padding_mask(
            encoder_attention_mask, embedded.shape[0], first["cross_k"].shape[-1]
        )
        x = self._embed(embedded, query_positions, deterministic=True)
        new_cache = {}
        for layer in layers:
            x, new_cache[layer.name] = layer(
                x,
                self_mask=mask,
                self_bias=bias,
                cross_mask=cross_mask,
                cache=cache[layer.name],
                cache_index=index,
                history=history,
            )
        return self._final(x, deterministic=True), new_cache


class EncoderDecoder(nn.Module):
    """Encoder-decoder language model over shared token embeddings.

    Subclasses have a field `config` (with `vocab_size`, `d_model` and
    `tie_word_embeddings`), set `stack_class` (a `Stack` built as
    `stack_class(config, is_decoder)`) and define the hooks `_init_std` (of
    the embedding and the untied `lm_head`), `_embed_tokens` (ids ->
    [..., d_model]) and `_logits` ([..., d_model] -> [..., vocab]).
    """

    stack_class: ClassVar[type[Stack]]

    def _init_std(self, name: str) -> float:
        """Standard deviation of the initial `shared` or `lm_head` weights."""
        raise NotImplementedError

    def setup(self):  # noqa: D102 (flax hook)
        cfg = self.config
        self.shared = nn.Embed(
            cfg.vocab_size,
            cfg.d_model,
            embedding_init=nn.initializers.normal(self._init_std("shared")),
        )
        self.encoder = self.stack_class(cfg, is_decoder=False)
        self.decoder = self.stack_class(cfg, is_decoder=True)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Dense(
                cfg.vocab_size,
                use_bias=False,
                kernel_init=nn.initializers.normal(self._init_std("lm_head")),
            )

    def _embed_tokens(self, ids: chex.Array) -> chex.Array:
        raise NotImplementedError

    def _logits(self, hidden: chex.Array) -> chex.Array:
        raise NotImplementedError

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
            decoder_input_ids: [batch, tgt_len] int32 decoder inputs: the targets
                shifted right, starting with `decoder_start_token_id` (mBART:
                then the target language id).
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

    def init_cache(self, encoded: chex.Array, max_length: int) -> dict:
        """Decoding cache for `max_length` target positions (cross keys precomputed)."""
        return self.decoder.init_cache(encoded, max_length)

    def decode_step(
        self,
        token_ids: chex.Array,
        index: chex.Array,
        cache: dict,
        attention_mask: chex.Array,
        history: chex.Array | None = None,
    ) -> tuple[chex.Array, dict]:
        """Logits for one target position.

        Args:
            token_ids: [batch] int32 tokens at position `index`.
            index: Scalar int32 target position.
            cache: From `init_cache` or the previous step.
            attention_mask: [batch, src_len] source padding mask.
            history: Beam search: [batch, max_len] int32, row `history[i, t]` of
                the self-attention cache holds row i's key/value at position t
                (so beams are reordered by updating `history`, not by copying the
                cache); None: each row's cache is its own.

        Returns:
            ([batch, vocab] float32 logits of the next token, updated cache).
        """
        hidden, cache = self.decoder.decode_step(
            self._embed_tokens(token_ids[:, None]), index, cache, attention_mask, history
        )
        return self._logits(hidden)[:, 0], cache
