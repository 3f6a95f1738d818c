"""LoRA adapters and bias-only fine-tuning: exact ghost norms, zero-B init, merged export.

Small random T5 (gated, untied) and mBART models with adapters on attention and
feed-forward kernels; the trainer's per-example loss, padded and masked rows,
dropout, and a clip that clips some examples but not others.
"""

import dataclasses
import functools
import warnings

import flax.traverse_util as traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

from dpnmt import core, models, training
from dpnmt.core import ghost
from dpnmt.models import export, lora
from tests.models import hf_models
from tests.models.test_ghost_clipping import _assert_same, _batch

SPEC = models.LoRASpec(rank=3, alpha=6.0, targets=("q", "v", "wi_0", "wo", "fc2"))


def _targets(config):
    return tuple(t for t in SPEC.targets if t in lora.targets_of(config))


def _with_adapters(config, params, seed=5, b_scale=0.3):
    """(config, model, params) with adapters on `params`; B random when `b_scale` > 0."""
    config = dataclasses.replace(config, lora=dataclasses.replace(SPEC, targets=_targets(config)))
    model = models.create_model(config)
    params = models.add_adapters(model, params, jax.random.key(seed))
    if b_scale:
        flat = traverse_util.flatten_dict(params)
        keys = iter(jax.random.split(jax.random.key(seed + 1), len(flat)))
        flat = {
            k: b_scale * jax.random.normal(next(keys), v.shape) if "lora_b" in k else v
            for k, v in flat.items()
        }
        params = traverse_util.unflatten_dict(flat)
    return config, model, params


def _adapter_paths(params):
    return sorted("/".join(k) for k in traverse_util.flatten_dict(params) if "lora_" in "/".join(k))


@functools.cache
def _base(kind):
    from tests.models.test_ghost_clipping import _model

    return _model(kind)


@pytest.mark.parametrize("kind", ["mt5", "mbart"])
def test_zero_b_leaves_logits_unchanged_and_merging_keeps_them(kind):
    config, model, params = _base(kind)
    ids = jnp.asarray(np.random.default_rng(0).integers(2, 40, (2, 6)), jnp.int32)
    mask = jnp.ones_like(ids)
    logits = model.apply({"params": params}, ids, mask, ids)

    adapted_config, adapted, zero_b = _with_adapters(config, params, b_scale=0.0)
    paths = _adapter_paths(zero_b)
    base_leaves = traverse_util.flatten_dict(params)
    # Every targeted kernel of every block has its A and B, and nothing else changed.
    targeted = [k for k in base_leaves if k[-1] == "kernel" and k[-2] in _targets(config)]
    assert len(targeted) > len(_targets(config)) and len(paths) == 2 * len(targeted)
    assert {p.rsplit("/", 3)[1] for p in paths} == set(_targets(config))
    for key, value in traverse_util.flatten_dict(zero_b).items():
        if key in base_leaves:
            np.testing.assert_array_equal(value, base_leaves[key])
    np.testing.assert_array_equal(adapted.apply({"params": zero_b}, ids, mask, ids), logits)

    # Non-zero B changes the function; merging into W + (alpha/r) A B keeps it.
    _, _, trained = _with_adapters(config, params)
    adapted_logits = adapted.apply({"params": trained}, ids, mask, ids)
    assert np.abs(np.asarray(adapted_logits - logits)).max() > 1e-2
    merged, merged_config = models.merge_adapters(trained, adapted_config)
    assert merged_config == config and not _adapter_paths(merged)
    np.testing.assert_allclose(
        model.apply({"params": merged}, ids, mask, ids), adapted_logits, atol=2e-5, rtol=1e-5
    )


def _adapters_and_biases(path, leaf):
    return models.is_adapter(path) or models.bias_only(path, leaf)


def _private_sum(kind, clipping, trainable_fn):
    """Jitted `private_grad_sum` of the trainer's loss over the trainable part only."""
    config, model, params = _with_adapters(*_base(kind)[::2])
    trainable, frozen = models.split_params(params, trainable_fn)

    def loss_fn(p, example, key):
        full = models.merge_params(p, frozen)
        return training.example_loss(model, config, full, example, key)

    def run(batch, mask, l2_clip, key):
        return core.private_grad_sum(
            loss_fn, trainable, batch, mask, l2_clip=l2_clip, dropout_key=key, clipping=clipping
        )

    return jax.jit(run, static_argnums=2), trainable


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mt5", "mbart"])
def test_ghost_matches_vmap_on_adapters_and_biases(kind):
    """T5: the adapters train; mBART: the adapters and every bias (the bias-only
    mode's parameters, in the same compile)."""
    trainable_fn = models.is_adapter if kind == "mt5" else _adapters_and_biases
    batch, mask = _batch(len(kind)), jnp.array([1, 1, 0, 1, 1, 1])
    key = jax.random.key(11, impl="rbg")
    vmap_step, trainable = _private_sum(kind, "vmap", trainable_fn)
    ghost_step, _ = _private_sum(kind, "ghost", trainable_fn)
    paths = ["/".join(k) for k in traverse_util.flatten_dict(trainable)]
    assert any("lora_a" in p for p in paths) and any("lora_b" in p for p in paths)
    assert all(trainable_fn(p, None) for p in paths)
    if kind == "mbart":
        biases = [p for p in paths if models.bias_only(p, None)]
        assert "final_logits_bias" in biases and any("/fc2/bias" in p for p in biases)
    norms = np.asarray(vmap_step(batch, mask, 1.0, key)[1])[np.asarray(mask) == 1]
    l2_clip = float(np.median(norms))
    assert (norms < l2_clip).any() and (norms > l2_clip).any()
    expected = vmap_step(batch, mask, l2_clip, key)
    # No adapter falls back to per-example gradients: ghost clipping factorises them.
    with warnings.catch_warnings():
        warnings.simplefilter("error", ghost.GhostClippingWarning)
        got = ghost_step(batch, mask, l2_clip, key)
    _assert_same(expected, got)


@pytest.mark.parametrize("kind", ["t5_v11", "mbart"])
def test_export_merges_adapters_and_transformers_gives_the_same_logits(kind, tmp_path):
    config, _, base = hf_models.convert_model(hf_models.hf_model(kind))
    base = jax.tree.map(jnp.asarray, base)
    config, model, params = _with_adapters(config, base, b_scale=0.5)
    export.save_pretrained(params, config, str(tmp_path))
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(tmp_path)).eval()
    ids, mask, dec, dec_mask = hf_models.padded_batch(seed=5, batch=4, src_len=12, tgt_len=6)
    expected = hf_models.hf_logits(hf, ids, mask, dec, dec_mask)
    logits = model.apply({"params": params}, *map(jnp.asarray, (ids, mask, dec, dec_mask)))
    np.testing.assert_allclose(np.asarray(logits), expected, atol=1e-4, rtol=0)
    # The adapters are in the export: a model without them gives other logits.
    plain = models.create_model(dataclasses.replace(config, lora=models.LoRASpec()))
    without = plain.apply({"params": base}, *map(jnp.asarray, (ids, mask, dec, dec_mask)))
    assert np.abs(np.asarray(without) - expected).max() > 1e-2
