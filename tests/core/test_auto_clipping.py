"""Issue 64 item 2: `clipping="auto"`, the default, picks the method that fits.

Ghost clipping where it applies (flax installed and the loss has layers it
factorises), vmap otherwise (no flax, a pure-JAX loss): the same sum either
way, named in `PrivateGradSum.clipping`. A pure-JAX loss no longer warns; a
warning stays where the user can act (layers ghost clipping cannot reach).
"""

import inspect
import warnings

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dpnmt import core
from dpnmt.core import dp_step, ghost, ghost_nnx

RNG = np.random.default_rng(0)
BATCH = {
    "x": jnp.asarray(RNG.normal(size=(6, 5)), jnp.float32),
    "y": jnp.asarray(RNG.integers(0, 3, 6), jnp.int32),
}
MASK = jnp.array([1, 1, 0, 1, 1, 1])
MLP = nn.Sequential([nn.Dense(8), nn.tanh, nn.Dense(3)])
FLAX_PARAMS = MLP.init(jax.random.key(0), jnp.zeros((1, 5)))["params"]
PURE_PARAMS = {"w": jnp.asarray(RNG.normal(size=(5, 3)), jnp.float32), "b": jnp.zeros(3)}


def flax_loss(params, example):
    logits = MLP.apply({"params": params}, example["x"][None])[0]
    return optax.softmax_cross_entropy_with_integer_labels(logits, example["y"])


def pure_loss(params, example):  # No Flax module: nothing for ghost clipping to factorise.
    logits = example["x"] @ params["w"] + params["b"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, example["y"])


@pytest.fixture(autouse=True)
def fresh_warnings():
    ghost._warned.clear()
    ghost_nnx._warned.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ghost.GhostClippingWarning)
        yield


def _sum(loss_fn, params, clipping=None, **kwargs):
    args = {} if clipping is None else {"clipping": clipping}
    return core.private_grad_sum(loss_fn, params, BATCH, MASK, l2_clip=0.5, **args, **kwargs)


def test_auto_is_the_default_wherever_ghost_was():
    for function in (
        core.private_grad_sum,
        core.private_grad_sum_nnx,
        core.private_lot_gradient,
        core.dp_multi_steps,
        dp_step.add_microbatch,
        dp_step.add_group_microbatch,
    ):
        assert inspect.signature(function).parameters["clipping"].default == "auto", function
    # Group clipping keeps vmap as its default (ghost's compile time grows with k).
    assert inspect.signature(core.group_clipped_sum).parameters["clipping"].default == "vmap"


def test_a_pure_jax_loss_gets_vmap_without_a_warning_and_says_so():
    auto = _sum(pure_loss, PURE_PARAMS)  # GhostClippingWarning is an error here.
    assert auto.clipping == "vmap"
    chex.assert_trees_all_equal(tuple(auto), tuple(_sum(pure_loss, PURE_PARAMS, "vmap")))
    chunked = _sum(pure_loss, PURE_PARAMS, microbatch_size=2)
    assert chunked.clipping == "vmap"


def test_a_flax_loss_gets_ghost_and_says_so_also_under_jit():
    auto = _sum(flax_loss, FLAX_PARAMS)
    assert auto.clipping == "ghost"
    chex.assert_trees_all_equal(tuple(auto), tuple(_sum(flax_loss, FLAX_PARAMS, "ghost")))
    jitted = jax.jit(lambda p: _sum(flax_loss, p))(FLAX_PARAMS)
    assert jitted.clipping == "ghost"
    vmap = _sum(flax_loss, FLAX_PARAMS, "vmap")
    assert vmap.clipping == "vmap"
    chex.assert_trees_all_close(auto.grad_sum, vmap.grad_sum, rtol=1e-5, atol=1e-6)


def test_the_result_still_unpacks_and_indexes_as_three():
    result = _sum(flax_loss, FLAX_PARAMS)
    grad_sum, norms, mean_loss = result
    assert len(result) == 3
    assert result[0] is grad_sum and result[1] is norms and result[2] is mean_loss


def test_explicit_ghost_on_a_pure_jax_loss_still_warns():
    """Asked for ghost clipping, the user learns it saved nothing."""
    with pytest.warns(ghost.GhostClippingWarning, match="cannot factorise"):
        result = _sum(pure_loss, PURE_PARAMS, "ghost")
    assert result.clipping == "ghost"


class _Scanned(nn.Module):
    @nn.compact
    def __call__(self, x):
        cell = nn.scan(_Cell, variable_broadcast="params", split_rngs={"params": False})
        _, hs = cell()(jnp.zeros(4), x)
        return jnp.sum(hs)


class _Cell(nn.Module):
    @nn.compact
    def __call__(self, h, x):
        h = jnp.tanh(nn.Dense(4)(h) + x)
        return h, h


def test_layers_ghost_cannot_reach_fall_back_with_a_warning_under_auto_too():
    """A user can act here (unroll the scan, or pass clipping='vmap'): warned."""
    batch = {"x": jnp.asarray(RNG.normal(size=(3, 5, 4)), jnp.float32)}
    params = _Scanned().init(jax.random.key(1), batch["x"][0])["params"]

    def loss_fn(p, example):
        return _Scanned().apply({"params": p}, example["x"])

    with pytest.warns(ghost.GhostClippingWarning, match="clipping='vmap'"):
        result = core.private_grad_sum(loss_fn, params, batch, jnp.ones(3), l2_clip=1.0)
    assert result.clipping == "vmap"


def test_dp_multi_steps_and_the_lot_step_take_a_pure_jax_loss_silently():
    tx = core.dp_multi_steps(
        optax.sgd(0.1), l2_clip=0.5, noise_multiplier=1.0, expected_lot_size=4.0, loss_fn=pure_loss
    )
    updates, _ = tx.update(
        BATCH,
        tx.init(PURE_PARAMS),
        PURE_PARAMS,
        noise_key=jax.random.key(2),
        mask=MASK,
        release=True,
    )
    assert bool(jnp.all(jnp.isfinite(updates["w"])))
    lot = core.to_microbatches(jnp.arange(6), MASK.astype(bool), 3, 2, num_examples=6)
    grad = core.private_lot_gradient(
        pure_loss, PURE_PARAMS, BATCH, lot, jax.random.key(3),
        l2_clip=0.5, noise_multiplier=1.0, expected_lot_size=4.0,
    )  # fmt: skip
    assert bool(jnp.all(jnp.isfinite(grad["w"])))
    rows = {k: v.reshape((3, 2) + v.shape[1:]) for k, v in BATCH.items()}
    lot_state, _ = dp_step.add_group_microbatch(
        dp_step.init(PURE_PARAMS), pure_loss, PURE_PARAMS, rows, MASK.reshape(3, 2), l2_clip=0.5
    )
    assert bool(jnp.all(jnp.isfinite(lot_state.grad_sum["w"])))


def test_group_clipping_auto_picks_ghost_for_flax_and_vmap_for_pure_jax():
    rows = {k: v.reshape((3, 2) + v.shape[1:]) for k, v in BATCH.items()}
    mask = MASK.reshape(3, 2)
    pure = core.group_clipped_sum(pure_loss, PURE_PARAMS, rows, mask, l2_clip=0.5, clipping="auto")
    assert pure.clipping == "vmap"
    flax = core.group_clipped_sum(flax_loss, FLAX_PARAMS, rows, mask, l2_clip=0.5, clipping="auto")
    assert flax.clipping == "ghost"
    by_vmap = core.group_clipped_sum(flax_loss, FLAX_PARAMS, rows, mask, l2_clip=0.5)
    assert by_vmap.clipping == "vmap"
    chex.assert_trees_all_close(flax.grad_sum, by_vmap.grad_sum, rtol=1e-5, atol=1e-6)


class _Linear(nnx.Module):
    def __init__(self, rngs):
        self.layer = nnx.Linear(5, 3, rngs=rngs)

    def __call__(self, x):
        return self.layer(x)


class _RawParams(nnx.Module):  # Parameters read directly: no layer to factorise.
    def __init__(self):
        self.w = nnx.Param(jnp.asarray(RNG.normal(size=(5, 3)), jnp.float32))

    def __call__(self, x):
        return x @ self.w[...]


def _nnx_loss(model, example):
    return optax.softmax_cross_entropy_with_integer_labels(model(example["x"]), example["y"])


def test_nnx_auto_picks_ghost_for_layers_and_vmap_for_raw_parameters_silently():
    layered = core.private_grad_sum_nnx(_nnx_loss, _Linear(nnx.Rngs(0)), BATCH, MASK, l2_clip=0.5)
    assert layered.clipping == "ghost"
    model = _RawParams()
    raw = core.private_grad_sum_nnx(_nnx_loss, model, BATCH, MASK, l2_clip=0.5)
    assert raw.clipping == "vmap"
    vmap = core.private_grad_sum_nnx(_nnx_loss, model, BATCH, MASK, l2_clip=0.5, clipping="vmap")
    chex.assert_trees_all_equal(raw.grad_sum, vmap.grad_sum)


def test_an_unknown_method_names_the_choices():
    with pytest.raises(ValueError, match=r"\('auto', 'ghost', 'vmap'\)"):
        _sum(pure_loss, PURE_PARAMS, "fast")
