"""Greedy and beam-search decoding with a static-shape KV cache, jit compiled.

Works with any module exposing `encode`, `init_cache` and `decode_step` (our T5
and mBART). The search follows `transformers`' `generate` (v5) step for step:
log-softmax scores, forced first/last tokens, beam candidates of size
2 * num_beams, length-penalised finished hypotheses and the same stopping
rules (`early_stopping` True / False / "never") and n-gram blocking
(`no_repeat_ngram_size`), so outputs agree token for token with Hugging Face
on the same weights.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

_NEG = -1.0e9  # transformers' "impossible" beam score


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """How to decode; hashable, so one compiled function serves each setting.

    Attributes:
        max_new_tokens: Generated tokens per sentence, EOS included (static length
            of the output).
        decoder_start_token_id: First decoder input.
        eos_token_id: End-of-sequence token; a hypothesis ends when it emits it.
        pad_token_id: Written after EOS.
        num_beams: 1 for greedy search, > 1 for beam search.
        length_penalty: Finished beam score = sum log p / (length ** length_penalty).
        early_stopping: True: stop a sentence once num_beams hypotheses finished;
            False: stop when the best running beam (at its current length) cannot
            beat the worst finished one; "never": same with the best reachable length.
        forced_bos_token_id: Token forced as the first generated one (mBART-50
            target language id), or None.
        forced_eos_token_id: Token forced at position max_new_tokens, or None.
        no_repeat_ngram_size: n > 0: a token that would repeat an n-gram already in
            the hypothesis (decoder start token included) is banned, as
            transformers' `no_repeat_ngram_size`; 0: no ban.
    """

    max_new_tokens: int
    decoder_start_token_id: int
    eos_token_id: int
    pad_token_id: int
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    forced_bos_token_id: int | None = None
    forced_eos_token_id: int | None = None
    no_repeat_ngram_size: int = 0

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be >= 1.")
        if self.num_beams < 1:
            raise ValueError(f"num_beams={self.num_beams} must be >= 1.")
        if self.no_repeat_ngram_size < 0:
            raise ValueError(
                f"no_repeat_ngram_size={self.no_repeat_ngram_size} must be >= 0 (0: no ban)."
            )
        if not (isinstance(self.early_stopping, bool) or self.early_stopping == "never"):
            raise ValueError(
                f"early_stopping={self.early_stopping!r} must be True, False or 'never'."
            )


def from_model_config(model_config: Any, max_new_tokens: int, **overrides) -> GenerationConfig:
    """A `GenerationConfig` with the token ids of a T5Config / MBartConfig.

    Args:
        model_config: Our model config.
        max_new_tokens: Output length.
        **overrides: Any other `GenerationConfig` field (num_beams, ...).
    """
    fields = dict(
        max_new_tokens=max_new_tokens,
        decoder_start_token_id=model_config.decoder_start_token_id,
        eos_token_id=model_config.eos_token_id,
        pad_token_id=model_config.pad_token_id,
        forced_bos_token_id=getattr(model_config, "forced_bos_token_id", None),
        forced_eos_token_id=getattr(model_config, "forced_eos_token_id", None),
    )
    fields.update(overrides)
    return GenerationConfig(**fields)


def _ban_repeated_ngrams(
    log_probs: chex.Array, generated: chex.Array, step: chex.Array, n: int, start: int
) -> chex.Array:
    """-inf for each token that would complete an n-gram already in a hypothesis.

    Args:
        log_probs: [rows, vocab] scores of output position `step`.
        generated: [rows, max_new_tokens] int32 tokens; positions >= `step` are unused.
        step: int32 scalar, the output position being chosen.
        n: the n-gram size (>= 1).
        start: the decoder start token, position 0 of every hypothesis (as HF counts it).
    """
    rows, length = generated.shape
    seq = jnp.concatenate([jnp.full((rows, 1), start, generated.dtype), generated], axis=1)
    count = step + 1  # Tokens in each hypothesis so far, the start token included.
    windows = length + 1 - n  # n-gram starts i <= count - n <= length - n; static.
    if windows < 1:
        return log_probs
    starts = jnp.arange(windows)
    match = starts <= count - n  # The n-gram lies wholly in the hypothesis so far.
    for k in range(n - 1):  # Its first n - 1 tokens equal the hypothesis' last n - 1.
        last = jax.lax.dynamic_index_in_dim(seq, count - n + 1 + k, axis=1)  # [rows, 1]
        match = match & (seq[:, k : k + windows] == last)
    banned = seq[:, n - 1 : n - 1 + windows]  # [rows, windows]: each n-gram's last token.
    hit = jnp.zeros(log_probs.shape, jnp.int8)
    hit = hit.at[jnp.arange(rows)[:, None], banned].max(match.astype(jnp.int8))
    return jnp.where(hit > 0, -jnp.inf, log_probs)


def _process(
    log_probs: chex.Array, step: chex.Array, gen: GenerationConfig, generated: chex.Array
) -> chex.Array:
    """Processors on [rows, vocab] scores at output position `step`: n-gram ban, forced tokens.

    `generated` [rows, max_new_tokens]: each row's tokens so far (positions < `step`).
    """
    if gen.no_repeat_ngram_size > 0:
        log_probs = _ban_repeated_ngrams(
            log_probs, generated, step, gen.no_repeat_ngram_size, gen.decoder_start_token_id
        )

    def force(scores, token):
        forced = jnp.full_like(scores, -jnp.inf).at[:, token].set(0.0)
        return forced

    if gen.forced_bos_token_id is not None:
        log_probs = jnp.where(step == 0, force(log_probs, gen.forced_bos_token_id), log_probs)
    if gen.forced_eos_token_id is not None:
        last = step == gen.max_new_tokens - 1
        log_probs = jnp.where(last, force(log_probs, gen.forced_eos_token_id), log_probs)
    return log_probs


def _greedy(
    model: nn.Module,
    gen: GenerationConfig,
    params: chex.ArrayTree,
    input_ids: chex.Array,
    attention_mask: chex.Array,
) -> tuple[chex.Array, chex.Array]:
    variables = {"params": params}
    batch = input_ids.shape[0]
    encoded = model.apply(variables, input_ids, attention_mask, method=model.encode)
    cache = model.apply(variables, encoded, gen.max_new_tokens, method=model.init_cache)
    out = jnp.full((batch, gen.max_new_tokens), gen.pad_token_id, jnp.int32)
    start = jnp.full((batch,), gen.decoder_start_token_id, jnp.int32)
    state = (
        jnp.zeros((), jnp.int32),
        start,
        jnp.zeros((batch,), bool),
        out,
        cache,
        jnp.zeros((batch,), jnp.float32),
    )

    def cond(state):
        step, _, finished, *_ = state
        return (step < gen.max_new_tokens) & ~jnp.all(finished)

    def body(state):
        step, prev, finished, out, cache, score = state
        logits, cache = model.apply(
            variables, prev, step, cache, attention_mask, method=model.decode_step
        )
        log_probs = _process(jax.nn.log_softmax(logits.astype(jnp.float32)), step, gen, out)
        token = jnp.argmax(log_probs, axis=-1).astype(jnp.int32)
        score = score + jnp.where(
            finished, 0.0, jnp.take_along_axis(log_probs, token[:, None], 1)[:, 0]
        )
        token = jnp.where(finished, gen.pad_token_id, token)
        out = out.at[:, step].set(token)
        finished = finished | (token == gen.eos_token_id)
        return step + 1, token, finished, out, cache, score

    _, _, _, out, _, score = jax.lax.while_loop(cond, body, state)
    return out, score


def _gather(x: chex.Array, idx: chex.Array) -> chex.Array:
    """x[b, idx[b, j]] for x [batch, n, ...] and idx [batch, m]."""
    return jax.vmap(lambda row, i: row[i])(x, idx)


def _beam(
    model: nn.Module,
    gen: GenerationConfig,
    params: chex.ArrayTree,
    input_ids: chex.Array,
    attention_mask: chex.Array,
) -> tuple[chex.Array, chex.Array]:
    variables = {"params": params}
    batch, beams, length = input_ids.shape[0], gen.num_beams, gen.max_new_tokens
    keep = 2 * beams  # candidates per step: (1 + number of EOS ids) * num_beams
    encoded = model.apply(variables, input_ids, attention_mask, method=model.encode)
    encoded = jnp.repeat(encoded, beams, axis=0)
    mask = jnp.repeat(attention_mask, beams, axis=0)
    cache = model.apply(variables, encoded, length, method=model.init_cache)
    top_beam_mask = jnp.arange(keep) < beams
    lp = gen.length_penalty
    rows = jnp.arange(batch * beams, dtype=jnp.int32)

    running = jnp.full((batch, beams, length), gen.pad_token_id, jnp.int32)
    state = dict(
        step=jnp.zeros((), jnp.int32),
        prev=jnp.full((batch * beams,), gen.decoder_start_token_id, jnp.int32),
        running=running,
        running_scores=jnp.zeros((batch, beams)).at[:, 1:].set(_NEG),
        finished=running,
        finished_scores=jnp.full((batch, beams), _NEG),
        is_finished=jnp.zeros((batch, beams), bool),
        improvable=jnp.ones((batch, 1), bool),
        go_on=jnp.ones((), bool),
        cache=cache,
        # Cache row holding each beam's keys/values per position: beams are
        # reordered by gathering this small table, never the cache itself.
        history=jnp.broadcast_to(rows[:, None], (batch * beams, length)),
    )

    def body(s):
        step = s["step"]
        history = s["history"].at[:, step].set(rows)
        logits, cache = model.apply(
            variables, s["prev"], step, s["cache"], mask, history, method=model.decode_step
        )
        log_probs = _process(
            jax.nn.log_softmax(logits.astype(jnp.float32)),
            step,
            gen,
            s["running"].reshape(batch * beams, length),
        )
        vocab = log_probs.shape[-1]
        log_probs = log_probs.reshape(batch, beams, vocab) + s["running_scores"][:, :, None]
        topk_scores, topk_idx = jax.lax.top_k(log_probs.reshape(batch, beams * vocab), keep)
        parent = topk_idx // vocab
        token = (topk_idx % vocab).astype(jnp.int32)
        topk_seqs = _gather(s["running"], parent).at[:, :, step].set(token)
        hits = (token == gen.eos_token_id) | (step + 1 >= length)

        # Best num_beams candidates that did not finish keep running.
        running_candidates = topk_scores + hits.astype(jnp.float32) * _NEG
        next_idx = jax.lax.top_k(running_candidates, beams)[1]
        running = _gather(topk_seqs, next_idx)
        running_scores = _gather(running_candidates, next_idx)
        parent_of_running = _gather(parent, next_idx)

        # Finished candidates among the top num_beams join the finished pool.
        just_finished = hits & top_beam_mask[None, :]
        cur_len = (step + 1).astype(jnp.float32)
        fin = topk_scores / (cur_len**lp)
        full = jnp.all(s["is_finished"], axis=-1, keepdims=True) & (gen.early_stopping is True)
        fin = fin + full.astype(jnp.float32) * _NEG
        fin = fin + (~s["improvable"]).astype(jnp.float32) * _NEG
        fin = fin + (~just_finished).astype(jnp.float32) * _NEG
        merged_scores = jnp.concatenate([s["finished_scores"], fin], axis=1)
        merged_idx = jax.lax.top_k(merged_scores, beams)[1]
        finished = _gather(jnp.concatenate([s["finished"], topk_seqs], axis=1), merged_idx)
        finished_scores = _gather(merged_scores, merged_idx)
        is_finished = _gather(jnp.concatenate([s["is_finished"], just_finished], 1), merged_idx)

        flat_parent = (parent_of_running + jnp.arange(batch)[:, None] * beams).reshape(-1)
        history = history[flat_parent]

        # Can a running beam still beat the worst finished hypothesis?
        if gen.early_stopping == "never" and lp > 0.0:
            best_len = jnp.float32(length)
        else:
            best_len = cur_len
        best_running = running_scores[:, :1] / (best_len**lp)
        worst = jnp.where(is_finished, jnp.min(finished_scores, axis=1, keepdims=True), _NEG)
        improvable = s["improvable"] & jnp.any(best_running > worst, axis=-1, keepdims=True)
        go_on = (
            jnp.any(improvable)
            & ~(jnp.all(is_finished) & (gen.early_stopping is True))
            & ~jnp.all(hits)
        )
        return dict(
            step=step + 1,
            prev=running[:, :, step].reshape(-1),
            running=running,
            running_scores=running_scores,
            finished=finished,
            finished_scores=finished_scores,
            is_finished=is_finished,
            improvable=improvable,
            go_on=go_on,
            cache=cache,
            history=history,
        )

    s = jax.lax.while_loop(lambda s: s["go_on"], body, state)
    return s["finished"][:, 0], s["finished_scores"][:, 0]


@functools.lru_cache(maxsize=32)
def make_generate_fn(
    model: nn.Module, gen: GenerationConfig
) -> Callable[[chex.ArrayTree, chex.Array, chex.Array], tuple[chex.Array, chex.Array]]:
    """A jit-compiled `fn(params, input_ids, attention_mask) -> (tokens, scores)`.

    Args:
        model: T5ForConditionalGeneration or MBartForConditionalGeneration.
        gen: Decoding settings (greedy when num_beams == 1).

    Returns:
        A function mapping params, [batch, src_len] int32 `input_ids` and
        [batch, src_len] 0/1 `attention_mask` to int32 tokens
        [batch, max_new_tokens] (decoder start token excluded, pad after EOS)
        and float32 scores [batch] (greedy: sum of log-probabilities; beam:
        length-penalised score of the best hypothesis).
    """
    search = _greedy if gen.num_beams == 1 else _beam
    return jax.jit(functools.partial(search, model, gen))


def generate(
    model: nn.Module,
    params: chex.ArrayTree,
    input_ids: chex.Array,
    attention_mask: chex.Array,
    gen: GenerationConfig,
) -> tuple[chex.Array, chex.Array]:
    """Decodes a batch; compiles once per (model, gen, input shape).

    Args:
        model: T5ForConditionalGeneration or MBartForConditionalGeneration.
        params: Its parameters.
        input_ids: [batch, src_len] int32 source tokens.
        attention_mask: [batch, src_len] 1 for real tokens, 0 for padding.
        gen: Decoding settings.

    Returns:
        (tokens [batch, max_new_tokens] int32, scores [batch] float32); see
        `make_generate_fn`.
    """
    return make_generate_fn(model, gen)(params, input_ids, attention_mask)
