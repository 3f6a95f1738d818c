"""Freezing splits, from-scratch init, load_pretrained and orbax round trips."""

import dataclasses

import chex
import flax.traverse_util as traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dpnmt import models
from dpnmt.models import factory, partition
from tests.models import hf_models


@pytest.fixture(scope="module")
def mt5():
    return hf_models.convert_model(hf_models.hf_model("mt5"))


def _paths(tree):
    return {partition.param_path(k) for k in traverse_util.flatten_dict(tree)}


def test_split_merge_round_trip_and_presets(mt5):
    _, _, params = mt5
    trainable, frozen = models.split_params(params, models.cross_attention_only)
    assert _paths(trainable) and all("/cross_attention" in p for p in _paths(trainable))
    assert not _paths(trainable) & _paths(frozen)
    assert _paths(trainable) | _paths(frozen) == _paths(params)
    chex.assert_trees_all_equal(models.merge_params(trainable, frozen), params)
    trainable, frozen = models.split_params(params, models.all_but_embeddings)
    assert _paths(frozen) == {"shared/embedding"}
    with pytest.raises(ValueError, match="both"):
        models.merge_params(trainable, trainable)
    with pytest.raises(ValueError, match="no parameter"):
        models.split_params(params, models.regex_trainable("typo_attention"))


def test_frozen_params_get_no_per_example_gradients(mt5):
    _, model, params = mt5
    trainable, frozen = models.split_params(params, models.cross_attention_only)
    ids, mask, dec, dec_mask = hf_models.padded_batch(seed=4, batch=3, src_len=7, tgt_len=5)

    def loss(trainable, ids, mask, dec, dec_mask, key):
        logits = model.apply(
            {"params": models.merge_params(trainable, frozen)},
            ids[None],
            mask[None],
            dec[None],
            dec_mask[None],
            deterministic=False,
            rngs={"dropout": key},
        )
        return optax.softmax_cross_entropy_with_integer_labels(logits[0], dec).mean()

    keys = jax.random.split(jax.random.key(0), 3)
    grads = jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0, 0, 0, 0)))(
        trainable, *map(jnp.asarray, (ids, mask, dec, dec_mask)), keys
    )
    assert _paths(grads) == _paths(trainable)
    leaves = jax.tree.leaves(grads)
    assert all(g.shape[0] == 3 for g in leaves)
    assert sum(g.size for g in leaves) < sum(p.size for p in jax.tree.leaves(params))
    # Each example's gradient is its own (dropout keys and data differ).
    q = grads["decoder"]["block_0"]["cross_attention"]["q"]["kernel"]
    assert not np.allclose(q[0], q[1])


def test_from_scratch_init_matches_converted_structure(mt5):
    config, model, params = mt5
    fresh = models.init_params(model, jax.random.key(1))
    chex.assert_trees_all_equal_shapes_and_dtypes(fresh, jax.tree.map(jnp.asarray, params))
    with pytest.raises(ValueError, match="not supported"):
        factory.create_model(dataclasses.replace(config, model_type="bart"))


def _save_word_tokenizer(directory):
    import tokenizers
    import transformers

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{f"w{i}": i + 3 for i in range(97)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(directory)


@pytest.mark.parametrize("with_tokenizer,sharded", [(False, False), (True, True)])
def test_load_pretrained_from_local_dir(tmp_path, with_tokenizer, sharded):
    hf = hf_models.hf_model("mt5")
    hf.save_pretrained(tmp_path, max_shard_size="40KB" if sharded else "5GB")
    assert (tmp_path / "model.safetensors.index.json").exists() == sharded
    if with_tokenizer:
        _save_word_tokenizer(tmp_path)
    model, params, tokenizer = models.load_pretrained(str(tmp_path))
    if with_tokenizer:
        assert tokenizer("w1 w5 zz")["input_ids"][:3] == [4, 8, 2]
    else:
        assert tokenizer is None  # save_pretrained wrote no tokenizer files
    assert not model.config.tie_word_embeddings
    ids, mask, dec, dec_mask = hf_models.padded_batch(seed=5, batch=2, src_len=6, tgt_len=4)
    expected = hf_models.hf_logits(hf, ids, mask, dec, dec_mask)
    logits = jax.jit(model.apply)({"params": params}, ids, mask, dec, dec_mask)
    np.testing.assert_allclose(np.asarray(logits), expected, atol=1e-4, rtol=0)


def test_load_pretrained_without_weights_says_what_it_looked_for(tmp_path):
    hf_models.hf_model("mt5").config.save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        models.load_pretrained(str(tmp_path))


def test_orbax_round_trip_is_exact(tmp_path, mt5):
    _, model, params = mt5
    models.save_params(tmp_path / "ckpt", params)
    restored = models.load_params(tmp_path / "ckpt", like=models.abstract_params(model))
    chex.assert_trees_all_equal(restored, jax.tree.map(jnp.asarray, params))
