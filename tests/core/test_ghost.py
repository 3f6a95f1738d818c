"""Book-keeping ("ghost") clipping: same sum as `vmap`, same sensitivity, same edge cases."""

import functools
import warnings
from unittest import mock

import chex
import flax.linen as nn
import hypothesis
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized
from hypothesis import strategies as st

from dpnmt import core
from dpnmt.core import ghost

VOCAB, LENGTH, WIDTH = 11, 5, 6


class _TiedLM(nn.Module):
    """Embedding used twice and as the output layer, Dense with bias, LayerNorm."""

    @nn.compact
    def __call__(self, ids, features):
        embed = nn.Embed(VOCAB, WIDTH)
        h = embed(ids) + nn.Dense(WIDTH)(features)
        h = jnp.tanh(nn.Dense(2 * WIDTH, name="up")(nn.LayerNorm()(h)))
        h = nn.Dense(WIDTH, use_bias=False, name="down")(h) + embed(ids[..., ::-1])
        return embed.attend(h)


class _Custom(nn.Module):
    """A matrix parameter read outside any Dense/Embed call (must fall back)."""

    @nn.compact
    def __call__(self, ids, features):
        dense = nn.Dense(WIDTH)
        matrix = self.param("matrix", nn.initializers.normal(1.0), (WIDTH, WIDTH))
        h = dense(features) @ matrix
        # The same kernel also read directly: it cannot be factorised either.
        h = h + features @ dense.variables["params"]["kernel"]
        return nn.Embed(VOCAB, WIDTH)(ids) + h


@functools.cache
def _loss_fn(module_type):
    module = module_type()

    def loss_fn(p, example):
        out = module.apply({"params": p}, example["ids"][None], example["features"][None])[0]
        if out.shape[-1] != VOCAB:
            return jnp.sum(jnp.sin(out))
        logp = jax.nn.log_softmax(out)
        return -jnp.mean(jnp.take_along_axis(logp, example["labels"][:, None], axis=1))

    return loss_fn


def _setup(module_type, seed=0, rows=6):
    rng = np.random.default_rng(seed)
    batch = {
        "ids": jnp.asarray(rng.integers(0, VOCAB, (rows, LENGTH)), jnp.int32),
        "features": jnp.asarray(rng.normal(size=(rows, LENGTH, 3)), jnp.float32),
        "labels": jnp.asarray(rng.integers(0, VOCAB, (rows, LENGTH)), jnp.int32),
    }
    init = module_type().init(jax.random.key(seed), batch["ids"][:1], batch["features"][:1])
    return init["params"], batch, _loss_fn(module_type)


@functools.cache
def _jitted(clipping, loss_fn, microbatch_size):
    # l2_clip static: a traced clipping norm is refused (it cannot be checked).
    return jax.jit(
        functools.partial(
            core.private_grad_sum, loss_fn, clipping=clipping, microbatch_size=microbatch_size
        ),
        static_argnames="l2_clip",
    )


def _run(clipping, loss_fn, params, batch, mask, l2_clip, microbatch_size=None):
    return _jitted(clipping, loss_fn, microbatch_size)(params, batch, mask, l2_clip=float(l2_clip))


def _assert_same(expected, got):
    chex.assert_trees_all_close(got[0], expected[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-5)
    np.testing.assert_allclose(got[2], expected[2], rtol=1e-6)


class GhostClippingTest(parameterized.TestCase):
    @parameterized.parameters("all", "some", "none")
    def test_matches_vmap_with_tied_embedding_and_masked_rows(self, clipped):
        params, batch, loss_fn = _setup(_TiedLM)
        mask = jnp.array([1, 0, 1, 1, 1, 1])
        norms = np.asarray(_run("vmap", loss_fn, params, batch, mask, 1.0)[1])
        l2_clip = {"all": norms.min() / 2, "some": np.median(norms), "none": norms.max() * 2}
        l2_clip = float(l2_clip[clipped])
        self.assertEqual(clipped == "some", (norms > l2_clip).any() and (norms < l2_clip).any())
        expected = _run("vmap", loss_fn, params, batch, mask, l2_clip)
        _assert_same(expected, _run("ghost", loss_fn, params, batch, mask, l2_clip))

    def test_unfactorisable_parameters_fall_back_exactly_and_are_named_once(self):
        params, batch, loss_fn = _setup(_Custom)
        mask = jnp.array([1, 1, 1, 0, 1, 1])
        expected = _run("vmap", loss_fn, params, batch, mask, 0.5)
        ghost._warned.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = _run("ghost", loss_fn, params, batch, mask, 0.5)
            # A second trace of the same parameters does not warn again.
            _run("ghost", loss_fn, params, batch, mask, 0.5, microbatch_size=3)
        _assert_same(expected, got)
        messages = [str(w.message) for w in caught if w.category is ghost.GhostClippingWarning]
        self.assertLen(messages, 1)
        self.assertIn("['matrix']", messages[0])
        self.assertIn("['Dense_0']['kernel']", messages[0])
        self.assertNotIn("Embed_0", messages[0])

    def test_nonfinite_example_is_dropped_as_in_vmap(self):
        params, batch, loss_fn = _setup(_TiedLM)
        batch["features"] = batch["features"].at[2, 1, 0].set(jnp.nan)
        mask = jnp.ones(6)
        expected = _run("vmap", loss_fn, params, batch, mask, 1.0)
        got = _run("ghost", loss_fn, params, batch, mask, 1.0)
        self.assertEqual(int(core.count_nonfinite(got[1], mask)), 1)
        self.assertFalse(np.isfinite(got[1][2]))
        self.assertTrue(all(np.isfinite(v).all() for v in jax.tree_util.tree_leaves(got[0])))
        _assert_same(expected, got)

    @parameterized.parameters((jnp.inf, 1), (-jnp.inf, 0), (jnp.nan, 1), (jnp.nan, 0))
    def test_nonfinite_or_padding_row_adds_nothing_to_the_ghost_sums(self, value, masked_in):
        # Forced ghost norms (the small test widths would materialise): a row
        # whose inputs or output gradients hold inf or NaN (masked in or padding)
        # adds exactly nothing to the factorised sums, as in vmap (0 * inf is NaN).
        def forced(uses, shape):
            del shape
            return all(use.kind != "direct" for use in uses)

        params, batch, loss_fn = _setup(_TiedLM)
        batch["features"] = batch["features"].at[4, 2, 1].set(value)
        mask = jnp.ones(6).at[4].set(masked_in)
        expected = _run("vmap", loss_fn, params, batch, mask, 0.7)
        with mock.patch.object(ghost, "_prefer_ghost", forced):
            got = jax.jit(
                lambda p, b, m: core.private_grad_sum(
                    loss_fn, p, b, m, l2_clip=0.7, clipping="ghost"
                )
            )(params, batch, mask)
        self.assertTrue(all(np.isfinite(v).all() for v in jax.tree_util.tree_leaves(got[0])))
        _assert_same(expected, got)

    @parameterized.parameters("ghost", "vmap")
    def test_microbatching_changes_nothing(self, clipping):
        params, batch, loss_fn = _setup(_TiedLM)
        mask = jnp.array([1, 1, 0, 1, 1, 1])
        whole = _run(clipping, loss_fn, params, batch, mask, 0.5)
        chunked = _run(clipping, loss_fn, params, batch, mask, 0.5, microbatch_size=2)
        _assert_same(whole, chunked)

    @parameterized.parameters(True, False)
    def test_both_norm_methods_are_exact(self, prefer_ghost):
        # A static cost rule picks one method per parameter; force each in turn.
        def forced(uses, shape):
            del shape
            return prefer_ghost and all(use.kind != "direct" for use in uses)

        params, batch, loss_fn = _setup(_TiedLM)
        mask = jnp.array([1, 1, 1, 1, 0, 1])
        expected = _run("vmap", loss_fn, params, batch, mask, 0.8)
        with mock.patch.object(ghost, "_prefer_ghost", forced):
            got = jax.jit(
                lambda p, b, m: core.private_grad_sum(
                    loss_fn, p, b, m, l2_clip=0.8, clipping="ghost"
                )
            )(params, batch, mask)
        _assert_same(expected, got)

    def test_bad_arguments_are_named(self):
        params, batch, loss_fn = _setup(_TiedLM)
        with self.assertRaisesRegex(ValueError, "clipping='fast'"):
            core.private_grad_sum(loss_fn, params, batch, jnp.ones(6), l2_clip=1.0, clipping="fast")
        with self.assertRaisesRegex(ValueError, "microbatch_size=4"):
            core.private_grad_sum(
                loss_fn, params, batch, jnp.ones(6), l2_clip=1.0, microbatch_size=4
            )


@hypothesis.settings(max_examples=12)  # Each example costs a few (cached) compiled runs.
@hypothesis.given(
    seed=st.integers(0, 2**16),
    rows=st.integers(2, 4),
    removed=st.integers(0, 3),
    log_scale=st.floats(-3.0, 3.0),
    # A few C values (C is static under jit, one compile each); the gradient
    # scale varies continuously instead.
    l2_clip=st.sampled_from([1e-3, 0.1, 10.0, 1e3]),
)
def test_ghost_sensitivity_of_removing_one_example_is_at_most_c(
    seed, rows, removed, log_scale, l2_clip
):
    """For D and D' = D minus one example, the ghost clipped sums differ by <= C in L2."""
    params, batch, loss_fn = _setup(_TiedLM, seed=seed, rows=rows)
    batch["features"] = batch["features"] * 10.0**log_scale
    removed = removed % rows
    neighbour = jax.tree_util.tree_map(lambda v: jnp.delete(v, removed, axis=0), batch)
    full, _, _ = _run("ghost", loss_fn, params, batch, jnp.ones(rows), l2_clip)
    less, _, _ = _run("ghost", loss_fn, params, neighbour, jnp.ones(rows - 1), l2_clip)
    diff = np.concatenate(
        [
            np.ravel(np.asarray(a, np.float64) - np.asarray(b, np.float64))
            for a, b in zip(*map(jax.tree_util.tree_leaves, (full, less)), strict=True)
        ]
    )
    # Float32 rounding of a sum of B terms each of norm <= C.
    assert np.linalg.norm(diff) <= l2_clip * (1 + 1e-5) + 1e-6 * l2_clip * rows


if __name__ == "__main__":
    absltest.main()


class _EmbedDense(nn.Module):
    """An embedding lookup (ids may be negative) feeding a Dense layer."""

    @nn.compact
    def __call__(self, ids):
        return nn.Dense(3, name="out")(nn.Embed(VOCAB, WIDTH, name="embed")(ids))


class _Projection(nn.Module):
    """One bias-free Dense layer: y_t = x_t W."""

    @nn.compact
    def __call__(self, x):
        return nn.Dense(16, use_bias=False)(x)


def _embed_loss(p, example):
    return jnp.sum(jnp.sin(_EmbedDense().apply({"params": p}, example["ids"])))


def _projection_loss(p, example):
    # The output gradient of token t is the example's own vector v_t.
    return jnp.sum(_Projection().apply({"params": p}, example["x"]) * example["v"])


@functools.cache
def _clipped_sum(loss_fn, l2_clip, clipping="ghost"):
    return jax.jit(
        lambda p, b, m: core.private_grad_sum(loss_fn, p, b, m, l2_clip=l2_clip, clipping=clipping)
    )


def _contribution_norms(loss_fn, params, batch, l2_clip):
    """Float64 norm of each example's contribution: the clipped sum with it alone unmasked."""
    rows = jax.tree_util.tree_leaves(batch)[0].shape[0]
    norms = []
    for i in range(rows):
        grad_sum, _, _ = _clipped_sum(loss_fn, l2_clip)(params, batch, jnp.eye(rows)[i])
        flat = np.concatenate(
            [np.ravel(np.asarray(v, np.float64)) for v in jax.tree.leaves(grad_sum)]
        )
        norms.append(np.linalg.norm(flat))
    return np.array(norms)


def test_negative_embedding_ids_hit_the_rows_the_lookup_reads():
    """Regression: -1 is read (and its gradient scattered) as row V-1, but the gram
    compared raw ids: the ghost norm missed the cross term and undershot."""
    params = _EmbedDense().init(jax.random.key(0), jnp.zeros((LENGTH,), jnp.int32))["params"]
    ids = jnp.array(
        [[-1, VOCAB - 1, -1, VOCAB - 1, 2], [3, -VOCAB, 0, -2, VOCAB - 2], [1, 2, 3, 4, 5]],
        jnp.int32,
    )
    batch = {"ids": ids}
    mask = jnp.ones(3)
    _, exact, _ = _clipped_sum(_embed_loss, 1.0, "vmap")(params, batch, mask)
    _, norms, _ = _clipped_sum(_embed_loss, 1.0)(params, batch, mask)
    np.testing.assert_allclose(norms, exact, rtol=1e-5)
    l2_clip = float(np.min(exact)) / 2  # Every example is clipped.
    assert (_contribution_norms(_embed_loss, params, batch, l2_clip) <= l2_clip * (1 + 1e-5)).all()


def test_out_of_range_ids_are_dropped_as_non_finite_like_vmap():
    params = _EmbedDense().init(jax.random.key(0), jnp.zeros((LENGTH,), jnp.int32))["params"]
    batch = {"ids": jnp.array([[VOCAB, 1, 2, 3, 4], [-VOCAB - 1, 1, 2, 3, 4], [1, 2, 3, 4, 5]])}
    expected = _clipped_sum(_embed_loss, 0.5, "vmap")(params, batch, jnp.ones(3))
    got = _clipped_sum(_embed_loss, 0.5)(params, batch, jnp.ones(3))
    assert not np.isfinite(np.asarray(got[1][:2])).any()
    _assert_same(expected, got)


def _cancelling_batch(log_scale, log_gap, seed):
    """Row 0: two tokens share a large input and get nearly opposite output gradients."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2, LENGTH, 16))
    v = rng.normal(size=(2, LENGTH, 16))
    x[0, 1] = x[0, 0] = x[0, 0] * 10.0**log_scale
    v[0, 1] = -v[0, 0] + 10.0**log_gap * rng.normal(size=16)
    x[0, 2:], v[0, 2:] = 0.0, 0.0
    return {"x": jnp.asarray(x, jnp.float32), "v": jnp.asarray(v, jnp.float32)}


def test_cancelling_gram_does_not_hide_a_large_gradient():
    """Regression: the gram sum Σ(x_t·x_s)(g_t·g_s) cancelled to 0 in float32 for
    a gradient of norm ~1e5: nothing was clipped and the example added 1e5 with C = 1."""
    batch = _cancelling_batch(log_scale=4.0, log_gap=-3.0, seed=0)
    params = _Projection().init(jax.random.key(0), batch["x"][0])["params"]
    _, norms, _ = _clipped_sum(_projection_loss, 1.0)(params, batch, jnp.ones(2))
    x, v = np.asarray(batch["x"][0], np.float64), np.asarray(batch["v"][0], np.float64)
    exact = np.linalg.norm(x.T @ v)
    assert exact > 10.0
    assert norms[0] >= exact * (1 - 1e-5)
    assert (_contribution_norms(_projection_loss, params, batch, 1.0) <= 1.0 + 1e-5).all()


@hypothesis.settings(max_examples=10)
@hypothesis.given(
    log_scale=st.floats(3.0, 7.0),
    log_gap=st.floats(-3.5, -1.5),
    seed=st.integers(0, 2**16),
    log_clip=st.sampled_from([-2.0, 0.0, 2.0]),
)
def test_every_contribution_is_at_most_c_under_cancellation(log_scale, log_gap, seed, log_clip):
    """The ghost norm bounds what is summed: each example adds at most C(1 + 1e-5)."""
    batch = _cancelling_batch(log_scale, log_gap, seed)
    params = _Projection().init(jax.random.key(seed), batch["x"][0])["params"]
    l2_clip = 10.0**log_clip
    contributions = _contribution_norms(_projection_loss, params, batch, l2_clip)
    assert (contributions <= l2_clip * (1 + 1e-5)).all(), contributions


class _ScanCell(nn.Module):
    @nn.compact
    def __call__(self, h, x):
        h = jnp.tanh(nn.Dense(WIDTH)(h) + x)
        return h, h


class _Scanned(nn.Module):
    """A recurrent layer under `nn.scan`: its Dense calls cannot be intercepted."""

    @nn.compact
    def __call__(self, ids):
        cell = nn.scan(_ScanCell, variable_broadcast="params", split_rngs={"params": False})
        _, hs = cell()(jnp.zeros(WIDTH), nn.Embed(VOCAB, WIDTH)(ids))
        return nn.Dense(3)(hs)


def _scanned_loss(p, example):
    return jnp.sum(jnp.sin(_Scanned().apply({"params": p}, example["ids"])))


@pytest.mark.parametrize("microbatch_size", [None, 2])
def test_loss_with_nn_scan_falls_back_to_vmap_with_a_warning(microbatch_size):
    """Regression: ghost clipping died with a bare UnexpectedTracerError on nn.scan."""
    rng = np.random.default_rng(3)
    batch = {"ids": jnp.asarray(rng.integers(0, VOCAB, (4, LENGTH)), jnp.int32)}
    params = _Scanned().init(jax.random.key(0), batch["ids"][0])["params"]
    mask = jnp.array([1, 1, 0, 1])
    expected = _run("vmap", _scanned_loss, params, batch, mask, 0.5, microbatch_size)
    with pytest.warns(ghost.GhostClippingWarning, match="nn.scan.*clipping='vmap'"):
        got = _run("ghost", _scanned_loss, params, batch, mask, 0.5, microbatch_size)
    _assert_same(expected, got)


def _dot_precisions(jaxpr) -> list:
    """The `precision` of every dot_general in a (closed) jaxpr, sub-jaxprs included."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append(eqn.params["precision"])
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found += _dot_precisions(sub)
    return found


def test_norms_and_clipped_sum_use_full_float32_matmuls():
    """On GPUs float32 matmuls may default to TF32; the norms and the sum must not."""
    rng = np.random.default_rng(0)
    x, y = (jnp.asarray(rng.normal(size=(3, 4, n)), jnp.float32) for n in (5, 2))
    ids = jnp.asarray(rng.integers(0, 7, (3, 4)), jnp.int32)
    dense, lookup = ghost._Use("factor", x, y), ghost._Use("ids", ids, y)
    traced = [
        jax.make_jaxpr(lambda: ghost._ghost_squared_norm([dense, lookup, dense], 3))(),
        jax.make_jaxpr(lambda: ghost._materialise(dense, (5, 2)))(),
        jax.make_jaxpr(lambda w: ghost._weighted_sum(dense, w, (5, 2)))(jnp.ones(3)),
    ]
    precisions = [p for closed in traced for p in _dot_precisions(closed.jaxpr)]
    assert len(precisions) >= 4
    highest = jax.lax.Precision.HIGHEST
    assert all(p is not None and tuple(p) == (highest, highest) for p in precisions), precisions


def test_a_ghost_clipped_row_never_exceeds_c_as_computed():
    """Rows whose norms sit within float32 rounding of C, one parameter materialised.

    A norm summed in float32 can come out a few ulps low; without the rounding
    allowance some of these rows were clipped to C * (1 + 8e-8).
    """

    class Direct(nn.Module):
        @nn.compact
        def __call__(self, x):
            w = self.param("w", nn.initializers.ones, (x.shape[-1],))
            return jnp.sum(w * x)

    model, width, rows, clip = Direct(), 3000, 512, 1.0
    params = model.init(jax.random.PRNGKey(0), jnp.ones((width,)))
    rng = np.random.default_rng(1)
    grads = rng.normal(size=(rows, width))
    grads *= (clip * (1 + rng.uniform(-1e-5, 1e-5, rows)) / np.linalg.norm(grads, axis=1))[:, None]

    def one_row(x):
        return core.private_grad_sum(
            model.apply, params, x[None], jnp.ones(1), l2_clip=clip, clipping="ghost"
        ).grad_sum

    out = jax.jit(jax.vmap(one_row))(jnp.asarray(grads, jnp.float32))
    leaf = np.asarray(jax.tree_util.tree_leaves(out)[0], np.float64).reshape(rows, -1)
    assert np.sqrt((leaf**2).sum(axis=1)).max() <= clip
