"""Ghost clipping for Flax NNX models (`dpnmt.core.ghost_nnx`) against per-example vmap."""

import importlib.util
import pathlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

nnx = pytest.importorskip("flax.nnx")

from dpnmt.core import ghost, ghost_nnx  # noqa: E402
from dpnmt.core.private_grad_nnx import private_grad_sum_nnx  # noqa: E402


class MLP(nnx.Module):
    def __init__(self, rngs):
        self.hidden = nnx.Linear(6, 8, rngs=rngs)
        self.out = nnx.Linear(8, 3, rngs=rngs)

    def __call__(self, x):
        return self.out(jax.nn.tanh(self.hidden(x)))


class TinyLM(nnx.Module):
    """Embed + a residual MLP block with LayerNorm + a tied `attend` head and an untied one."""

    def __init__(self, rngs, vocab=64, width=16):
        self.embed = nnx.Embed(vocab, width, rngs=rngs)
        self.norm = nnx.LayerNorm(width, rngs=rngs)
        self.up = nnx.Linear(width, 2 * width, rngs=rngs)
        self.down = nnx.Linear(2 * width, width, use_bias=False, rngs=rngs)
        self.head = nnx.Linear(width, vocab, rngs=rngs)

    def __call__(self, ids):
        h = self.embed(ids)
        h = h + self.down(jax.nn.gelu(self.up(self.norm(h))))
        return self.head(h) + self.embed.attend(h)


def mlp_loss(model, example):
    logits = model(example["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, example["y"])


def lm_loss(model, example):
    logits = model(example["ids"][:-1])
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, example["ids"][1:]))


def run(loss_fn, model, batch, mask, l2_clip, **kwargs):
    """`private_grad_sum_nnx` under `jax.jit`, the model passed as its `nnx.split`."""
    graphdef, state, rest = nnx.split(model, nnx.Param, ...)

    @jax.jit
    def step(state, batch, mask):
        return private_grad_sum_nnx(
            loss_fn, (graphdef, state, rest), batch, mask, l2_clip=l2_clip, **kwargs
        )

    return step(state, batch, mask)


def per_example(loss_fn, model, batch, keys=None):
    """Every example's gradient (`nnx.State` of `[B, ...]` leaves) and its norm, by vmap(grad)."""
    graphdef, state, rest = nnx.split(model, nnx.Param, ...)

    @jax.jit
    def grads_and_norms(state, batch, keys):
        def on_state(state, example, key):
            model = nnx.merge(graphdef, state, rest)
            return loss_fn(model, example) if key is None else loss_fn(model, example, key)

        axes = (None, 0, None if keys is None else 0)
        grads = jax.vmap(jax.grad(on_state), in_axes=axes)(state, batch, keys)
        squares = [
            jnp.sum(jnp.square(g.reshape(g.shape[0], -1)), 1) for g in jax.tree.leaves(grads)
        ]
        return grads, jnp.sqrt(sum(squares))

    return grads_and_norms(state, batch, keys)


def clipped_sum(grads, norms, mask, l2_clip):
    """The reference clipped sum: min(1, C/norm) per real row, by hand."""
    factor = jnp.where(mask != 0, jnp.minimum(1.0, l2_clip / norms), 0.0)
    return jax.tree.map(lambda g: jnp.tensordot(factor, g, axes=1), grads)


def assert_matches(loss_fn, model, batch, mask, l2_clip, **kwargs):
    """Ghost clipping (no fallback warning) gives the reference's norms and clipped sum."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", ghost.GhostClippingWarning)
        result = run(loss_fn, model, batch, mask, l2_clip, **kwargs)
    keys = (
        None
        if "dropout_key" not in kwargs
        else jax.random.split(kwargs["dropout_key"], mask.shape[0])
    )
    grads, norms = per_example(loss_fn, model, batch, keys)
    assert_close(result.grad_sum, result.norms, clipped_sum(grads, norms, mask, l2_clip), norms)
    return result


def assert_close(got_sum, got_norms, want_sum, want_norms):
    np.testing.assert_allclose(got_norms, want_norms, rtol=2e-5)
    assert isinstance(got_sum, nnx.State)
    assert jax.tree.structure(got_sum) == jax.tree.structure(want_sum)
    for got, want in zip(jax.tree.leaves(got_sum), jax.tree.leaves(want_sum), strict=True):
        assert got.dtype == jnp.float32
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def some_clipped(loss_fn, model, batch, mask):
    """A clipping norm that clips some real rows and not others."""
    norms = per_example(loss_fn, model, batch)[1]
    real = np.asarray(norms)[np.asarray(mask) != 0]
    l2_clip = float(np.median(real))
    assert 0 < np.sum(real > l2_clip) < len(real)
    return l2_clip


def mlp_batch(size=6):
    return {"x": 3 * jax.random.normal(jax.random.key(1), (size, 6)), "y": jnp.arange(size) % 3}


def test_mlp_ghost_sum_equals_the_per_example_clipped_sum():
    model, batch, mask = MLP(nnx.Rngs(0)), mlp_batch(), jnp.array([1, 1, 1, 1, 1, 0])
    l2_clip = some_clipped(mlp_loss, model, batch, mask)
    ghost_result = assert_matches(mlp_loss, model, batch, mask, l2_clip)
    vmap_result = run(mlp_loss, model, batch, mask, l2_clip, clipping="vmap")
    assert_close(vmap_result.grad_sum, vmap_result.norms, ghost_result.grad_sum, ghost_result.norms)


def test_lm_ghost_sum_equals_the_per_example_clipped_sum():
    """Embed lookup and tied attend (cross terms), Linear with and without bias, LayerNorm."""
    model = TinyLM(nnx.Rngs(0))
    # Short sequences, wide layers: every kernel and the table take the ghost norm
    # (the table's with the lookup-attend cross terms), not the materialised one.
    batch = {"ids": jax.random.randint(jax.random.key(2), (5, 6), 0, 64)}
    mask = jnp.array([1, 1, 1, 1, 0])
    l2_clip = some_clipped(lm_loss, model, batch, mask)
    assert_matches(lm_loss, model, batch, mask, l2_clip)


def test_materialised_norms_give_the_same_sum(monkeypatch):
    monkeypatch.setattr(ghost_nnx, "prefer_ghost", lambda uses, shape: False)
    model, batch, mask = MLP(nnx.Rngs(0)), mlp_batch(), jnp.array([1, 0, 1, 1, 1, 1])
    l2_clip = some_clipped(mlp_loss, model, batch, mask)
    assert_matches(mlp_loss, model, batch, mask, l2_clip)


def test_per_example_keys_reach_the_loss_as_in_private_grad_sum():
    def noisy_loss(model, example, key):  # dropout-like: each example its own key
        keep = jax.random.bernoulli(key, 0.7, (6,))
        return mlp_loss(model, {"x": jnp.where(keep, example["x"], 0.0), "y": example["y"]})

    model, batch, mask = MLP(nnx.Rngs(0)), mlp_batch(), jnp.ones(6)
    assert_matches(noisy_loss, model, batch, mask, 0.5, dropout_key=jax.random.key(3))


def test_parameters_read_outside_a_linear_fall_back_with_one_warning():
    class Scaled(nnx.Linear):  # a subclass: not recognised
        pass

    class Odd(MLP):
        def __init__(self, rngs):
            super().__init__(rngs)
            self.out = Scaled(8, 3, rngs=rngs)

    def loss(model, example):  # hidden.kernel also read directly: falls back
        return mlp_loss(model, example) + 0.1 * jnp.sum(model.hidden.kernel[...] ** 2)

    model, batch, mask = Odd(nnx.Rngs(0)), mlp_batch(), jnp.array([1, 1, 1, 0, 1, 1])
    l2_clip = some_clipped(loss, model, batch, mask)
    ghost_nnx._warned.clear()
    with pytest.warns(ghost.GhostClippingWarning, match="2 parameter") as caught:
        result = run(loss, model, batch, mask, l2_clip)
    (message,) = [str(w.message) for w in caught]
    assert "hidden" in message and "out" in message and "bias" not in message
    grads, norms = per_example(loss, model, batch)
    assert_close(result.grad_sum, result.norms, clipped_sum(grads, norms, mask, l2_clip), norms)


def test_layers_inside_jax_checkpoint_fall_back_to_vmap_with_a_warning():
    def loss(model, example):  # the captured input would leak out of the checkpoint
        hidden = jax.checkpoint(lambda x: model.hidden(x))(example["x"])
        logits = model.out(jax.nn.tanh(hidden))
        return optax.softmax_cross_entropy_with_integer_labels(logits, example["y"])

    model, batch, mask = MLP(nnx.Rngs(0)), mlp_batch(), jnp.array([1, 1, 1, 1, 0, 1])
    l2_clip = some_clipped(loss, model, batch, mask)
    with pytest.warns(ghost.GhostClippingWarning, match="cannot capture.*jax.checkpoint"):
        result = run(loss, model, batch, mask, l2_clip)
    grads, norms = per_example(loss, model, batch)
    assert_close(result.grad_sum, result.norms, clipped_sum(grads, norms, mask, l2_clip), norms)


def test_layers_lifted_by_nnx_scan_fall_back_per_parameter():
    class Stack(nnx.Module):  # three Linear layers stacked by nnx.vmap, run by nnx.scan
        def __init__(self, rngs):
            @nnx.split_rngs(splits=3)
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def make(rngs):
                return nnx.Linear(6, 6, rngs=rngs)

            self.layers, self.out = make(rngs), nnx.Linear(6, 3, rngs=rngs)

        def __call__(self, x):
            @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
            def body(x, layer):
                return jax.nn.tanh(layer(x))

            return self.out(body(x, self.layers))

    model, batch, mask = Stack(nnx.Rngs(0)), mlp_batch(), jnp.array([1, 1, 0, 1, 1, 1])
    l2_clip = some_clipped(mlp_loss, model, batch, mask)
    ghost_nnx._warned.clear()
    with pytest.warns(ghost.GhostClippingWarning, match="2 parameter.*layers") as caught:
        result = run(mlp_loss, model, batch, mask, l2_clip)
    assert "out" not in str(caught[0].message)  # the unlifted head is still factorised
    grads, norms = per_example(mlp_loss, model, batch)
    assert_close(result.grad_sum, result.norms, clipped_sum(grads, norms, mask, l2_clip), norms)


def test_padding_rows_contribute_exactly_zero_even_when_non_finite():
    model, batch, mask = MLP(nnx.Rngs(0)), mlp_batch(4), jnp.array([1, 1, 0, 0])
    poisoned = {"x": batch["x"].at[2].set(1e30).at[3].set(jnp.nan), "y": batch["y"]}
    clean = run(mlp_loss, model, batch, mask, 0.5)
    dirty = run(mlp_loss, model, poisoned, mask, 0.5)
    for a, b in zip(jax.tree.leaves(clean.grad_sum), jax.tree.leaves(dirty.grad_sum), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(clean.mean_loss, dirty.mean_loss)
    padded = run(mlp_loss, model, poisoned, jnp.zeros(4), 0.5)
    assert all(not np.any(leaf) for leaf in jax.tree.leaves(padded.grad_sum))


def test_bad_inputs_are_named():
    model, batch = MLP(nnx.Rngs(0)), mlp_batch()
    with pytest.raises(TypeError, match="model must be an nnx.Module"):
        private_grad_sum_nnx(mlp_loss, {"w": jnp.ones(3)}, batch, jnp.ones(6), l2_clip=1.0)
    with pytest.raises(ValueError, match="scalar loss for ONE example"):
        private_grad_sum_nnx(lambda m, e: m(e["x"]), model, batch, jnp.ones(6), l2_clip=1.0)


@pytest.mark.slow
def test_the_nnx_example_trains_with_ghost_clipping_and_noise():
    """examples/dp_nnx_lm.py: Poisson lots, ghost clipping (no fallback), noise; loss falls."""
    path = pathlib.Path(__file__).resolve().parents[2] / "examples" / "dp_nnx_lm.py"
    spec = importlib.util.spec_from_file_location("dp_nnx_lm", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ghost.GhostClippingWarning)
        before, after, spent = example.train(steps=6, epsilon=2.0)
    assert after < 0.5 * before, (before, after)
    assert 1.9 < spent <= 2.0
