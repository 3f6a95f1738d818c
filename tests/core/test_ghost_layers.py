"""Ghost clipping of DenseGeneral (flax attention), Conv, Einsum and subclasses.

Each model's ghost clipped sum and norms equal the `vmap` ones, with no
parameter falling back to per-example gradients (a GhostClippingWarning is an
error here), some examples clipped and some not, and padding rows adding nothing.
"""

import functools
import math
import warnings
from unittest import mock

import chex
import flax.linen as nn
import hypothesis
import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

from dpnmt import core
from dpnmt.core import ghost, ghost_layers

ROWS = 5
MASK = jnp.array([1.0, 1.0, 0.0, 1.0, 1.0])  # Row 2 is padding.


class _Attention(nn.Module):
    """Flax's attention (DenseGeneral q/k/v/out), DenseGeneral with tuple features and
    a 2-axis contraction, Einsum layers, LayerNorm and RMSNorm."""

    @nn.compact
    def __call__(self, x):
        h = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=8, name="attention")(x)
        h = nn.DenseGeneral((2, 3), name="split")(nn.LayerNorm()(h))
        h = nn.DenseGeneral(4, axis=(-2, -1), name="merge")(jnp.tanh(h))
        h = nn.Einsum((4, 2, 3), "btd,dhk->bthk", name="einsum_split")(nn.RMSNorm()(h))
        return nn.Einsum((2, 3, 3), "...hk,hkf->...f", use_bias=False, name="einsum_merge")(h)


class _CNN(nn.Module):
    """Conv -> relu -> strided Conv -> Dense."""

    padding: str = "SAME"

    @nn.compact
    def __call__(self, x):
        h = nn.relu(nn.Conv(3, (3, 3), padding=self.padding)(x))
        h = nn.relu(nn.Conv(4, (2, 3), strides=2, padding=self.padding)(h))
        return nn.Dense(3)(h.reshape(h.shape[0], -1))


class _PlainDense(nn.Dense):
    """A subclass that keeps Dense's call: recognised."""


class _ScaledDense(nn.Dense):
    """A subclass with its own call: the ghost rule would miss the scale, so it falls back."""

    def __call__(self, x):
        return 2.0 * super().__call__(x)


class _Subclasses(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = jnp.tanh(_PlainDense(4, name="plain")(x))
        return _ScaledDense(3, name="scaled")(h)


class _OddEinsum(nn.Module):
    """Kernel axes not (contracted, features): falls back."""

    @nn.compact
    def __call__(self, x):
        return nn.Einsum((3, 4), "btd,fd->btf", name="odd")(x)


@functools.cache
def _loss_fn(module):
    # "scale" sets the gradient norms (they are linear in it) without a recompile.
    def loss_fn(params, example):
        out = module.apply({"params": params}, example["x"][None])
        return example["scale"] * jnp.sum(jnp.sin(out))

    return loss_fn


def _setup(module, shape, seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(ROWS, *shape)), jnp.float32)

    # Random values of init's shapes, not init's own (compiling its initialisers
    # costs seconds: CI time); non-zero biases, so every parameter carries signal.
    def fill(path, leaf):
        noise = rng.normal(size=leaf.shape)
        if len(leaf.shape) >= 2:  # Kernels, embeddings: unit-variance outputs.
            return jnp.asarray(noise / np.sqrt(math.prod(leaf.shape[:-1])), jnp.float32)
        offset = 1.0 if jax.tree_util.keystr(path).endswith("['scale']") else 0.0
        return jnp.asarray(offset + 0.1 * noise, jnp.float32)

    shapes = jax.eval_shape(module.init, jax.random.key(seed), x[:1])["params"]
    params = jax.tree_util.tree_map_with_path(fill, shapes)
    return params, {"x": x, "scale": jnp.ones(ROWS)}, _loss_fn(module)


@functools.cache
def _jitted(clipping, loss_fn, l2_clip, variant=None):
    del variant  # A new jit (a new trace) per variant of the patched ghost rules.
    return jax.jit(
        lambda p, b, m: core.private_grad_sum(loss_fn, p, b, m, l2_clip=l2_clip, clipping=clipping)
    )


def _ghost_without_fallback(loss_fn, params, batch, mask, l2_clip, variant=None):
    ghost._warned.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ghost.GhostClippingWarning)
        return _jitted("ghost", loss_fn, l2_clip, variant)(params, batch, mask)


def _assert_same(expected, got):
    chex.assert_trees_all_close(got[0], expected[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-5)
    np.testing.assert_allclose(got[2], expected[2], rtol=1e-6)


MODELS = {
    "attention": (_Attention(), (4, 5)),
    "cnn_same": (_CNN("SAME"), (7, 6, 2)),
    "cnn_valid": (_CNN("VALID"), (7, 6, 2)),
}


@functools.cache
def _reference(model):
    """(params, batch, loss_fn, vmap's result): C = 1 clips some examples, not others."""
    params, batch, loss_fn = _setup(*MODELS[model])
    vmap = _jitted("vmap", loss_fn, 1.0)
    norms = np.asarray(vmap(params, batch, MASK)[1])
    batch["scale"] = batch["scale"] / np.median(norms[np.asarray(MASK) == 1])
    expected = vmap(params, batch, MASK)
    assert (expected[1] > 1.01).any() and (expected[1] < 0.99).any()
    return params, batch, loss_fn, expected


@pytest.mark.parametrize("prefer_ghost", [True, False])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_matches_vmap_with_no_fallback(model, prefer_ghost):
    # A static cost rule picks the gram or the materialised gradient per
    # parameter; force each in turn.
    def forced(uses, shape):
        del shape
        return prefer_ghost and all(use.kind != "direct" for use in uses)

    params, batch, loss_fn, expected = _reference(model)
    with mock.patch.object(ghost, "_prefer_ghost", forced):
        got = _ghost_without_fallback(loss_fn, params, batch, MASK, 1.0, prefer_ghost)
        # The padding row adds nothing: other contents change nothing.
        other = dict(batch, x=batch["x"].at[2].multiply(-100.0))
        other = _ghost_without_fallback(loss_fn, params, other, MASK, 1.0, prefer_ghost)
    _assert_same(expected, got)
    assert np.isfinite(np.asarray(got[1])).all()
    chex.assert_trees_all_equal(got[0], other[0])


def test_subclasses_keeping_the_call_are_recognised_and_others_fall_back():
    params, batch, loss_fn = _setup(_Subclasses(), (3, 5))
    expected = _jitted("vmap", loss_fn, 0.3)(params, batch, MASK)
    ghost._warned.clear()
    with pytest.warns(ghost.GhostClippingWarning) as caught:
        got = _jitted("ghost", loss_fn, 0.3)(params, batch, MASK)
    _assert_same(expected, got)
    (message,) = [str(w.message) for w in caught if w.category is ghost.GhostClippingWarning]
    assert "['scaled']['kernel']" in message
    assert "plain" not in message


def test_einsum_that_is_not_a_dense_general_falls_back():
    params, batch, loss_fn = _setup(_OddEinsum(), (3, 4))
    expected = _jitted("vmap", loss_fn, 0.3)(params, batch, MASK)
    ghost._warned.clear()
    with pytest.warns(ghost.GhostClippingWarning, match=r"\['odd'\]\['kernel'\]"):
        got = _jitted("ghost", loss_fn, 0.3)(params, batch, MASK)
    _assert_same(expected, got)


@hypothesis.settings(max_examples=20)  # One compile per example (~0.2 s).
@hypothesis.given(
    spatial=st.sampled_from([(7,), (6, 5)]),
    kernel=st.integers(1, 3),
    stride=st.integers(1, 3),
    input_dilation=st.integers(1, 2),
    kernel_dilation=st.integers(1, 2),
    padding=st.sampled_from(["SAME", "VALID", "CIRCULAR", "REFLECT", 1, ((2, 0),), "CAUSAL"]),
    batch_axes=st.integers(0, 2),
    seed=st.integers(0, 2**16),
)
def test_conv_patches_times_the_kernel_is_the_conv(
    spatial, kernel, stride, input_dilation, kernel_dilation, padding, batch_axes, seed
):
    """The unfold view: rows [T, window * C_in] @ kernel [window * C_in, C_out] is the
    conv output, in the kernel's own layout; `_forward` is flax's conv. The rows are
    bit for bit the identity-filter conv's patches at HIGHEST precision (exact on CPU)."""
    hypothesis.assume(padding != "CAUSAL" or len(spatial) == 1)
    # lax refuses string padding with input dilation (flax raises).
    hypothesis.assume(input_dilation == 1 or not isinstance(padding, str))
    hypothesis.assume(padding != "REFLECT" or (kernel - 1) * kernel_dilation < min(spatial))
    if isinstance(padding, tuple):
        padding = padding * len(spatial)
    window = (kernel,) * len(spatial)
    module = nn.Conv(
        4,
        window,
        strides=stride,
        padding=padding,
        input_dilation=input_dilation,
        kernel_dilation=kernel_dilation,
    )
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(2,) * batch_axes + spatial + (3,)), jnp.float32)
    params = {
        "kernel": jnp.asarray(rng.normal(size=(*window, 3, 4)), jnp.float32),
        "bias": jnp.asarray(rng.normal(size=4), jnp.float32),
    }

    @jax.jit  # One compile, not one per eager op (CI time).
    def run(x, params):
        padded, geometry = ghost_layers._conv_geometry(module, x)
        patches = jax.lax.conv_general_dilated_patches(
            padded, window, **geometry, precision=jax.lax.Precision.HIGHEST
        )
        patches = patches.reshape(-1, 3, math.prod(window))  # [T, C_in, window]
        return (
            module.apply({"params": params}, x),
            ghost._rows(ghost._CONV, module, x),
            jnp.swapaxes(patches, 1, 2).reshape(patches.shape[0], -1),
            ghost._forward(ghost._CONV, module, x, params),
        )

    expected, rows, conv_patches, forward = jax.device_get(run(x, params))
    np.testing.assert_array_equal(rows, conv_patches)
    flat_kernel = np.asarray(params["kernel"], np.float64).reshape(-1, 4)
    np.testing.assert_allclose(
        rows.astype(np.float64) @ flat_kernel + np.asarray(params["bias"]),
        expected.reshape(-1, 4),
        atol=1e-5,
    )
    np.testing.assert_allclose(forward, expected, rtol=1e-6, atol=1e-6)


def test_conv_patches_only_move_data():
    """On GPUs/TPUs a float32 conv or matmul may round its inputs to TF32 or bf16, and
    the per-example norms from rounded patches could come out too small (a privacy
    bug): the patches are built by padding, slicing and stacking, with no arithmetic."""
    moves = {"pad", "slice", "stack", "concatenate", "reshape", "broadcast_in_dim", "squeeze"}
    moves |= {"expand_dims", "transpose", "convert_element_type", "copy", "pjit", "jit"}
    for module in (
        nn.Conv(2, (7, 7), strides=2, kernel_dilation=2),
        nn.Conv(2, (3, 3), padding="CIRCULAR"),
        nn.Conv(2, (3,), padding=((1, 2),), input_dilation=2),
    ):
        x = jnp.ones((2, 9, 3) if len(module.kernel_size) == 1 else (2, 16, 16, 3))
        closed = jax.make_jaxpr(lambda x, module=module: ghost._rows(ghost._CONV, module, x))(x)
        used = {e.primitive.name for e in _all_eqns(closed.jaxpr)}
        assert used <= moves, used - moves


def _all_eqns(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from _all_eqns(sub)
