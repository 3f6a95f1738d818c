"""Book-keeping ("ghost") clipping gives the `vmap` clipped sum on T5, mT5 and mBART.

Small random models, the trainer's own per-example loss (token mean, per-example
dropout keys), padded examples, masked rows, frozen partitions, and clip values
that clip some examples but not others.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpnmt import core, models, training
from dpnmt.bridge.dataset import INPUT_IDS, INPUT_LENGTH, LABEL_LENGTH, LABELS

ROWS, SOURCE, TARGET, VOCAB = 6, 7, 5, 40
_T5 = dict(vocab_size=VOCAB, d_model=16, d_kv=4, d_ff=24, num_layers=1, num_decoder_layers=1)
_T5.update(num_heads=2, relative_attention_num_buckets=8, relative_attention_max_distance=16)
CONFIGS = {
    "t5_v1": models.T5Config(**_T5, dropout_rate=0.2, pad_token_id=0, eos_token_id=1),
    "mt5": models.T5Config(
        **_T5,
        model_type="mt5",
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
        dropout_rate=0.2,
        pad_token_id=0,
        eos_token_id=1,
    ),
    "mbart": models.MBartConfig(
        vocab_size=VOCAB,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=24,
        decoder_ffn_dim=24,
        max_position_embeddings=16,
        dropout=0.2,
        attention_dropout=0.1,
        activation_dropout=0.1,
    ),
}


@functools.cache
def _model(kind):
    config = CONFIGS[kind]
    model = models.create_model(config)
    params = models.init_params(model, jax.random.key(3))
    # Non-zero biases and positions, so every parameter carries gradient signal.
    leaves, treedef = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.key(4), len(leaves))
    leaves = [v + 0.05 * jax.random.normal(k, v.shape) for v, k in zip(leaves, keys, strict=True)]
    return config, model, jax.tree_util.tree_unflatten(treedef, leaves)


def _batch(seed):
    rng = np.random.default_rng(seed)
    source_lengths = rng.integers(2, SOURCE + 1, ROWS)
    target_lengths = rng.integers(1, TARGET + 1, ROWS)
    return {
        INPUT_IDS: jnp.asarray(rng.integers(2, VOCAB, (ROWS, SOURCE)), jnp.int32),
        INPUT_LENGTH: jnp.asarray(source_lengths, jnp.int32),
        LABELS: jnp.asarray(rng.integers(2, VOCAB, (ROWS, TARGET)), jnp.int32),
        LABEL_LENGTH: jnp.asarray(target_lengths, jnp.int32),
    }


# One partition per model: most parameters trainable (incl. the shared/tied
# embedding and T5's relative attention bias), some frozen.
FROZEN = {
    "t5_v1": "decoder/block_0/ffn/wo",
    "mt5": "encoder/block_0/ffn",
    "mbart": "fc1|layer_norm/",
}


def _step(kind, clipping):
    """The jitted `private_grad_sum` of the trainer's loss, l2_clip a static argument."""
    config, model, params = _model(kind)
    frozen_pattern = re.compile(FROZEN[kind])
    trainable, frozen = models.split_params(
        params, lambda path, _: frozen_pattern.search(path) is None
    )
    assert jax.tree_util.tree_leaves(frozen)

    def loss_fn(p, example, key):
        full = models.merge_params(p, frozen)
        return training.example_loss(model, config, full, example, key)

    def run(batch, mask, l2_clip, key):
        return core.private_grad_sum(
            loss_fn,
            trainable,
            batch,
            mask,
            l2_clip=l2_clip,
            dropout_key=key,
            clipping=clipping,
            microbatch_size=3 if kind == "mbart" else None,
        )

    return jax.jit(run, static_argnums=2)


def _assert_same(expected, got):
    (sum_v, norms_v, loss_v), (sum_g, norms_g, loss_g) = expected, got
    assert np.isfinite(np.asarray(norms_v)).all()
    np.testing.assert_allclose(norms_g, norms_v, rtol=1e-5)
    np.testing.assert_allclose(loss_g, loss_v, rtol=1e-6)
    flat_v = np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(sum_v)])
    flat_g = np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(sum_g)])
    assert flat_v.shape == flat_g.shape and np.abs(flat_v).max() > 0
    # Relative to the norm of the whole clipped sum (float32 rounding).
    assert np.linalg.norm(flat_g - flat_v) <= 1e-5 * np.linalg.norm(flat_v)
    jax.tree_util.tree_map(
        lambda v, g: np.testing.assert_allclose(g, v, rtol=1e-4, atol=1e-6 * np.abs(flat_v).max()),
        sum_v,
        sum_g,
    )


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_ghost_matches_vmap_with_dropout_padding_frozen_and_partial_clipping(kind):
    batch, mask = _batch(len(kind)), jnp.array([1, 1, 0, 1, 1, 1])
    # rbg keys compile faster than threefry; both paths get the same per-example keys.
    key = jax.random.key(11, impl="rbg")
    vmap_step, ghost_step = _step(kind, "vmap"), _step(kind, "ghost")
    norms = np.asarray(vmap_step(batch, mask, 1.0, key)[1])[np.asarray(mask) == 1]
    # C = the median norm: some examples are clipped and some are not.
    l2_clip = float(np.median(norms))
    assert (norms < l2_clip).any() and (norms > l2_clip).any()
    expected = vmap_step(batch, mask, l2_clip, key)
    _assert_same(expected, ghost_step(batch, mask, l2_clip, key))
    # Dropout is on: another key changes the gradient (each example's mask matters).
    other = vmap_step(batch, mask, l2_clip, jax.random.key(12, impl="rbg"))
    assert not np.allclose(np.asarray(other[1]), np.asarray(expected[1]))
