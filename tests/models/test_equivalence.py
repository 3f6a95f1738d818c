"""Converted Flax models reproduce transformers' PyTorch logits."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from dpnmt.models import convert
from tests.models import hf_models


@pytest.mark.parametrize("kind", hf_models.KINDS)
def test_logits_match_pytorch_on_padded_batch(kind):
    hf = hf_models.hf_model(kind)
    config, model, params = hf_models.convert_model(hf)
    assert config.tie_word_embeddings == (kind in ("t5_v1", "mbart"))
    ids, mask, dec, dec_mask = hf_models.padded_batch(seed=1, batch=4, src_len=30, tgt_len=25)
    expected = hf_models.hf_logits(hf, ids, mask, dec, dec_mask)
    logits = jax.jit(model.apply)(
        {"params": params},
        jnp.asarray(ids),
        jnp.asarray(mask),
        jnp.asarray(dec),
        jnp.asarray(dec_mask),
    )
    assert logits.shape == (4, 25, hf_models.VOCAB)
    np.testing.assert_allclose(np.asarray(logits), expected, atol=1e-4, rtol=0)


def test_t5_v1_output_scaling_is_what_distinguishes_it():
    # Guard against the equality above passing for a reason unrelated to scaling.
    hf = hf_models.hf_model("t5_v1")
    config, model, params = hf_models.convert_model(hf)
    unscaled = dataclasses.replace(config, scale_decoder_outputs=False)
    ids, mask, dec, dec_mask = hf_models.padded_batch(seed=2, batch=2, src_len=6, tgt_len=5)
    args = (jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(dec), jnp.asarray(dec_mask))
    scaled_logits = model.apply({"params": params}, *args)
    unscaled_logits = type(model)(unscaled).apply({"params": params}, *args)
    np.testing.assert_allclose(scaled_logits, unscaled_logits * 32**-0.5, rtol=1e-5, atol=1e-5)


def test_missing_and_unexpected_names_are_listed():
    hf = hf_models.hf_model("mt5")
    config, _, _ = hf_models.convert_model(hf)
    state_dict = dict(hf.state_dict())
    del state_dict["decoder.block.1.layer.1.EncDecAttention.k.weight"]
    state_dict["encoder.block.0.layer.0.SelfAttention.extra.weight"] = torch.zeros(3)
    with pytest.raises(convert.WeightNameError) as err:
        convert.convert_state_dict(state_dict, config)
    assert err.value.missing == ["decoder.block.1.layer.1.EncDecAttention.k.weight"]
    assert err.value.unexpected == ["encoder.block.0.layer.0.SelfAttention.extra.weight"]
    assert "EncDecAttention.k.weight" in str(err.value)


def test_untied_lm_head_is_unexpected_for_a_tied_config():
    hf = hf_models.hf_model("mt5")
    config, _, _ = hf_models.convert_model(hf)
    tied = dataclasses.replace(config, tie_word_embeddings=True)
    with pytest.raises(convert.WeightNameError, match="lm_head.weight"):
        convert.convert_state_dict(hf.state_dict(), tied)


def test_shape_mismatch_is_reported():
    hf = hf_models.hf_model("mbart")
    config, _, _ = hf_models.convert_model(hf)
    wrong = dataclasses.replace(config, decoder_ffn_dim=64)
    with pytest.raises(convert.WeightNameError, match="fc1.weight"):
        convert.convert_state_dict(hf.state_dict(), wrong)


@pytest.mark.parametrize("kind", ["mt5", "mbart"])
def test_dropout_uses_the_callers_key(kind):
    _, model, params = hf_models.convert_model(hf_models.hf_model(kind))
    ids, mask, dec, dec_mask = hf_models.padded_batch(seed=6, batch=2, src_len=6, tgt_len=5)

    @functools.partial(jax.jit, static_argnums=1)
    def apply(key, deterministic):
        return model.apply(
            {"params": params},
            ids,
            mask,
            dec,
            dec_mask,
            deterministic=deterministic,
            rngs={"dropout": key},
        )

    key_a, key_b = jax.random.key(1), jax.random.key(2)
    train_a = apply(key_a, False)
    np.testing.assert_array_equal(train_a, apply(key_a, False))
    assert not np.allclose(train_a, apply(key_b, False))
    np.testing.assert_array_equal(apply(key_a, True), apply(key_b, True))
    assert not np.allclose(train_a, apply(key_a, True))


def _pad_inside_batch(pad_id: int):
    """Ids with the pad token at attended positions (mask 1), so its lookup matters."""
    ids, _, dec, _ = hf_models.padded_batch(seed=3, batch=2, src_len=6, tgt_len=5)
    ids[:, 2], dec[:, 3] = pad_id, pad_id
    return ids, np.ones_like(ids), dec, np.ones_like(dec)


def test_mbart_embedding_gradient_matches_pytorch_padding_idx():
    # transformers' nn.Embedding(padding_idx=pad) gives the pad row's lookup no
    # gradient; only the tied output projection updates that row.
    hf = hf_models.hf_model("mbart")
    _, model, params = hf_models.convert_model(hf)
    ids, mask, dec, dec_mask = _pad_inside_batch(hf.config.pad_token_id)
    weights = np.random.default_rng(0).normal(size=(2, 5, hf_models.VOCAB)).astype(np.float32)
    hf.zero_grad()
    logits = hf(
        input_ids=torch.tensor(ids),
        attention_mask=torch.tensor(mask),
        decoder_input_ids=torch.tensor(dec),
        decoder_attention_mask=torch.tensor(dec_mask),
    ).logits
    (logits * torch.tensor(weights)).sum().backward()
    expected = hf.model.shared.weight.grad.numpy()

    def loss(p):
        out = model.apply({"params": p}, *map(jnp.asarray, (ids, mask, dec, dec_mask)))
        return jnp.sum(out * weights)

    grads = jax.grad(loss)(jax.tree.map(jnp.asarray, params))
    np.testing.assert_allclose(grads["shared"]["embedding"], expected, atol=1e-4, rtol=1e-4)


def test_mbart_pad_row_lookup_gets_exactly_zero_gradient():
    hf = hf_models.hf_model("mbart")
    config, _, params = hf_models.convert_model(hf)
    untied = dataclasses.replace(config, tie_word_embeddings=False)
    model = type(hf_models.convert_model(hf)[1])(untied)
    params = dict(params, lm_head={"kernel": np.asarray(params["shared"]["embedding"]).T})
    ids, mask, dec, dec_mask = _pad_inside_batch(config.pad_token_id)

    def loss(p):
        out = model.apply({"params": p}, *map(jnp.asarray, (ids, mask, dec, dec_mask)))
        return jnp.sum(out**2)

    grads = jax.grad(loss)(jax.tree.map(jnp.asarray, params))["shared"]["embedding"]
    assert np.all(np.asarray(grads[config.pad_token_id]) == 0.0)
    assert np.any(np.asarray(grads[ids[0, 0]]) != 0.0)  # Other rows do learn.
