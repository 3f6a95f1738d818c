"""Greedy and beam search agree token for token with transformers' generate."""

import functools

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from dpnmt.models import decoding
from tests.models import hf_models

MAX_NEW = 10


def _until_eos(row, eos):
    row = list(int(t) for t in row)
    return row[: row.index(eos) + 1] if eos in row else row


@functools.cache
def _setup(kind):
    """HF model, its converted twin, a padded batch and HF greedy output."""
    hf = hf_models.hf_model(kind, diverse=True)
    config, model, params = hf_models.convert_model(hf)
    ids, mask, _, _ = hf_models.padded_batch(seed=3, batch=6, src_len=12, tgt_len=4)
    return hf, config, model, params, ids, mask


def _hf_generate(hf, ids, mask, **kwargs):
    with torch.no_grad():
        out = hf.generate(
            input_ids=torch.tensor(ids),
            attention_mask=torch.tensor(mask),
            max_new_tokens=MAX_NEW,
            do_sample=False,
            forced_eos_token_id=None,
            repetition_penalty=1.0,
            **{"no_repeat_ngram_size": 0, **kwargs},
        )
    return out.numpy()[:, 1:]


def _pick_eos(hf, ids, mask, **kwargs):
    """An EOS id with which HF ends several hypotheses early (not at step 0).

    Random tiny models rarely emit their real EOS; using as EOS a token the model
    does produce makes the comparison cover finished hypotheses, length
    penalties and early stopping. Returns (eos, HF output with that EOS).
    """
    greedy = _hf_generate(hf, ids, mask, **{**kwargs, "num_beams": 1})
    tokens, counts = np.unique(greedy, return_counts=True)
    best = None
    for eos in tokens[np.argsort(-counts, kind="stable")][:6]:  # the 6 most frequent
        out = _hf_generate(hf, ids, mask, eos_token_id=int(eos), **kwargs)
        lengths = [len(_until_eos(row, eos)) for row in out]
        early = sum(1 < n < MAX_NEW for n in lengths)
        if best is None or early > best[0]:
            best = (early, int(eos), out)
    return best[1], best[2]


CASES = [
    # kind, num_beams, length_penalty, early_stopping, forced bos, no_repeat_ngram_size
    ("t5_v1", 1, 1.0, False, None, 0),
    ("t5_v1", 4, 1.0, False, None, 0),
    ("mt5", 3, 2.0, True, None, 0),
    ("mt5", 4, 0.5, "never", None, 0),
    ("mbart", 1, 1.0, False, 7, 0),
    ("mbart", 4, -0.5, False, 7, 0),
    ("t5_v1", 1, 1.0, False, None, 2),
    ("t5_v1", 4, 1.0, False, None, 2),
    ("mt5", 3, 1.0, False, None, 1),
    ("mbart", 4, 1.0, False, 7, 3),
]


@pytest.mark.parametrize("kind,num_beams,length_penalty,early_stopping,forced_bos,ngram", CASES)
def test_matches_transformers_generate(
    kind, num_beams, length_penalty, early_stopping, forced_bos, ngram
):
    hf, config, model, params, ids, mask = _setup(kind)
    pad = config.pad_token_id
    settings = dict(
        num_beams=num_beams,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
        decoder_start_token_id=config.decoder_start_token_id,
        pad_token_id=pad,
        forced_bos_token_id=forced_bos,
    )
    eos, expected = _pick_eos(hf, ids, mask, no_repeat_ngram_size=ngram, **settings)
    if ngram:  # The ban changed HF's output: the comparison covers banned tokens.
        unbanned = _hf_generate(hf, ids, mask, eos_token_id=eos, **settings)
        assert not np.array_equal(unbanned, expected)
    gen = decoding.GenerationConfig(
        max_new_tokens=MAX_NEW,
        decoder_start_token_id=config.decoder_start_token_id,
        eos_token_id=eos,
        pad_token_id=pad,
        num_beams=num_beams,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
        forced_bos_token_id=forced_bos,
        no_repeat_ngram_size=ngram,
    )
    tokens, scores = decoding.generate(model, params, jnp.asarray(ids), jnp.asarray(mask), gen)
    tokens = np.asarray(tokens)
    assert tokens.shape == (ids.shape[0], MAX_NEW)
    assert np.all(np.isfinite(np.asarray(scores)))
    lengths = []
    for row, ref in zip(tokens, expected, strict=True):
        ours = _until_eos(row, eos)
        assert ours == _until_eos(ref, eos)
        assert np.all(row[len(ours) :] == pad)
        lengths.append(len(ours))
    # The comparison covered hypotheses that ended early (after the first step).
    assert any(1 < n < MAX_NEW for n in lengths)
    if forced_bos is not None:
        assert np.all(tokens[:, 0] == forced_bos)


def test_forced_eos_ends_every_sentence():
    _, config, model, params, ids, mask = _setup("mbart")
    gen = decoding.from_model_config(
        config, MAX_NEW, num_beams=1, forced_eos_token_id=5, eos_token_id=5
    )
    tokens, _ = decoding.generate(model, params, jnp.asarray(ids), jnp.asarray(mask), gen)
    for row in np.asarray(tokens):
        assert 5 in row.tolist()


def test_invalid_settings_are_rejected():
    with pytest.raises(ValueError, match="early_stopping"):
        decoding.GenerationConfig(4, 0, 1, 0, num_beams=2, early_stopping="sometimes")
    with pytest.raises(ValueError, match="max_new_tokens"):
        decoding.GenerationConfig(0, 0, 1, 0)
    with pytest.raises(ValueError, match="no_repeat_ngram_size"):
        decoding.GenerationConfig(4, 0, 1, 0, no_repeat_ngram_size=-1)


@pytest.mark.parametrize("kind", ["t5_v1", "mbart"])
def test_history_reorders_beams_like_copying_the_cache(kind):
    """Beam search reorders rows through `history`: exactly as gathering the cache would."""
    _, config, model, params, ids, mask = _setup(kind)
    variables = {"params": params}
    encoded = model.apply(variables, jnp.asarray(ids), jnp.asarray(mask), method=model.encode)
    rows = ids.shape[0]
    own = jnp.broadcast_to(jnp.arange(rows, dtype=jnp.int32)[:, None], (rows, MAX_NEW))
    parents = [np.array([2, 2, 0, 5, 1, 1]), np.array([3, 0, 0, 4, 5, 2])]
    tokens = [np.array([4, 7, 9, 4, 3, 8]), np.array([6, 6, 2, 9, 4, 5]), np.array([5] * 6)]

    def step(token, index, cache, history=None):
        return model.apply(
            variables,
            jnp.asarray(token, jnp.int32),
            jnp.int32(index),
            cache,
            jnp.asarray(mask),
            history,
            method=model.decode_step,
        )

    copied = history_cache = model.apply(variables, encoded, MAX_NEW, method=model.init_cache)
    history = own
    for index, token in enumerate(tokens):
        history = history.at[:, index].set(own[:, index])
        expected, copied = step(token, index, copied)
        got, history_cache = step(token, index, history_cache, history)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
        if index < len(parents):  # reorder: copy the cache rows vs follow the history
            copied = {
                layer: {
                    name: value[parents[index]] if name.startswith("self") else value
                    for name, value in entries.items()
                }
                for layer, entries in copied.items()
            }
            history = history[parents[index]]
    # The steps saw reordered rows: without the history the logits differ.
    unfollowed, _ = step(tokens[-1], len(tokens) - 1, history_cache, own)
    assert not np.array_equal(np.asarray(unfollowed), np.asarray(got))


@pytest.mark.parametrize("n", [1, 2, 3, MAX_NEW + 1])
def test_the_ban_is_transformers_no_repeat_ngram_processor_at_every_step(n):
    """Direct comparison with NoRepeatNGramLogitsProcessor on rows that repeat tokens,
    the decoder start token (position 0 of HF's input ids) among them."""
    from transformers.generation.logits_process import NoRepeatNGramLogitsProcessor

    rng = np.random.default_rng(n)
    rows, vocab, start = 8, 5, 0
    generated = rng.integers(0, 3, size=(rows, MAX_NEW)).astype(np.int32)  # Many repeats.
    processor = NoRepeatNGramLogitsProcessor(n)
    banned_somewhere = False
    for step in range(MAX_NEW):
        scores = rng.normal(size=(rows, vocab)).astype(np.float32)
        ours = decoding._ban_repeated_ngrams(
            jnp.asarray(scores), jnp.asarray(generated), jnp.int32(step), n, start
        )
        prefix = np.concatenate([np.full((rows, 1), start), generated[:, :step]], axis=1)
        theirs = processor(torch.tensor(prefix), torch.tensor(scores)).numpy()
        np.testing.assert_array_equal(np.isinf(np.asarray(ours)), np.isinf(theirs))
        banned_somewhere |= bool(np.isinf(theirs).any())
    assert banned_somewhere == (n <= MAX_NEW)
