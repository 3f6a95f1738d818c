"""`dp_multi_steps` composes like `optax.MultiSteps`, with per-example gradients or a loss (ghost).

Properties: the inner optimizer's state is bit for bit unchanged and the
updates are zero between releases; the release is `tx` applied once to
(clipped sum + ONE noise draw with the lot's key) / L; adding one example moves
the released sum by at most C; a padding or non-finite row adds exactly zero.
"""

import warnings

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl.testing import absltest, parameterized

from dpnmt import core
from dpnmt.core import ghost

NOISE_KEY = core.key_from_seed(2**100 + 11)
C, SIGMA, L = 0.5, 1.3, 6.0


class _Net(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(3)(jnp.tanh(nn.Dense(4)(x)))


def _loss_fn(params, example):
    out = _Net().apply(params, example["x"])
    return jnp.sum((out - example["y"]) ** 2)


def _batch(seed, rows=4):
    rng = np.random.default_rng(seed)
    return {
        "x": jnp.asarray(rng.normal(size=(rows, 5)) * 3, jnp.float32),
        "y": jnp.asarray(rng.normal(size=(rows, 3)), jnp.float32),
    }


def _per_example(params, batch):
    return jax.vmap(jax.grad(_loss_fn), in_axes=(None, 0))(params, batch)


def _params():
    return _Net().init(jax.random.key(0), jnp.zeros((5,)))


# Lots of micro-batches (masks of 4 rows), an empty lot among them.
LOTS = ([[1, 1, 0, 1], [0, 1, 1, 0], [1, 0, 0, 0]], [[0, 0, 0, 0]], [[1, 1, 1, 1], [1, 0, 1, 0]])


def _run(tx, params, lots, with_loss, apply=True, update=None):
    """Runs the lots through `tx`; returns per-lot (updates, state) after each call."""
    update = update or jax.jit(tx.update)
    state, trace = tx.init(params), []
    for lot_index, masks in enumerate(lots):
        calls = []
        for k, mask in enumerate(masks):
            batch, mask = _batch(10 * lot_index + k), jnp.asarray(mask)
            updates_in = batch if with_loss else _per_example(params, batch)
            updates, state = update(
                updates_in,
                state,
                params,
                noise_key=NOISE_KEY,
                mask=mask,
                release=k == len(masks) - 1,
            )
            calls.append((updates, state))
            if apply:
                params = optax.apply_updates(params, updates)
        trace.append(calls)
    return trace, params


def _lot_sum(params, lot_index, masks):
    """Reference: clip_and_sum of the lot's per-example gradients, all micro-batches at once."""
    grads = [_per_example(params, _batch(10 * lot_index + k)) for k in range(len(masks))]
    stacked = jax.tree.map(lambda *g: jnp.concatenate(g), *grads)
    mask = jnp.asarray(np.concatenate(masks))
    return core.clip_and_sum(stacked, l2_clip=C, mask=mask, params=params)[0], int(mask.sum())


def _tx(inner, **kwargs):
    args = {"l2_clip": C, "noise_multiplier": SIGMA, "expected_lot_size": L}
    return core.dp_multi_steps(inner, **(args | kwargs))


class MultiStepsTest(parameterized.TestCase):
    def setUp(self):
        super().setUp()
        warnings.simplefilter("ignore", ghost.GhostClippingWarning)
        self.params = _params()

    @parameterized.named_parameters(
        ("per_example_grads", False, {}),
        ("ghost", True, {"loss_fn": _loss_fn}),
        ("vmap", True, {"loss_fn": _loss_fn, "clipping": "vmap"}),
    )
    def test_inner_state_frozen_between_releases_then_one_step_on_the_release(
        self, with_loss, kwargs
    ):
        inner = optax.adam(0.05)
        trace, params = _run(_tx(inner, **kwargs), self.params, LOTS, with_loss)
        expected, inner_state = self.params, inner.init(self.params)
        released = inner.init(self.params)  # tx's inner state after the last release.
        for lot_index, (masks, calls) in enumerate(zip(LOTS, trace, strict=True)):
            for updates, state in calls[:-1]:  # Held: zeros, inner state bit for bit.
                jax.tree.map(lambda u: self.assertFalse(jnp.any(u)), updates)
                chex.assert_trees_all_equal(state.inner_state, released)
            lot_sum, real = _lot_sum(expected, lot_index, masks)
            lot = core.AccumulatorState(lot_sum, jnp.int32(real))
            key = core.noise_key_for_step(NOISE_KEY, lot_index)
            gradient = core.noisy_average(
                lot, key, noise_multiplier=SIGMA, l2_clip=C, expected_lot_size=L
            )
            step, inner_state = inner.update(gradient, inner_state, expected)
            expected = optax.apply_updates(expected, step)
            chex.assert_trees_all_close(calls[-1][0], step, rtol=1e-4, atol=1e-6)
            state = calls[-1][1]
            released = state.inner_state
            self.assertEqual(int(state.count), lot_index + 1)
            self.assertEqual(int(state.inner_state[0].count), lot_index + 1)
            jax.tree.map(lambda a: self.assertFalse(jnp.any(a)), state.accumulator.grad_sum)
            for leaf in jax.tree.leaves(state):
                self.assertFalse(jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key))
                self.assertFalse(jnp.issubdtype(leaf.dtype, jnp.unsignedinteger))
        chex.assert_trees_all_close(params, expected, rtol=1e-4, atol=1e-6)

    @parameterized.parameters(False, True)
    def test_release_holds_one_noise_draw_with_the_lots_key(self, with_loss):
        # sgd(1): updates = -release. L·(-updates) - clipped sum must be exactly the one
        # draw of noise_key_for_step(key, lot); noising each micro-batch, or with another
        # key, gives something else.
        tx = _tx(optax.sgd(1.0), **({"loss_fn": _loss_fn} if with_loss else {}))
        trace, _ = _run(tx, self.params, LOTS, with_loss, apply=False)
        zeros = jax.tree.map(jnp.zeros_like, self.params)
        for lot_index, (masks, calls) in enumerate(zip(LOTS, trace, strict=True)):
            lot_sum, _ = _lot_sum(self.params, lot_index, masks)
            key = core.noise_key_for_step(NOISE_KEY, lot_index)
            draw = core.add_gaussian_noise(zeros, SIGMA * C, key, l2_sensitivity=C)
            noise = jax.tree.map(lambda u, s: -u * L - s, calls[-1][0], lot_sum)
            chex.assert_trees_all_close(noise, draw, atol=2e-5)

    @parameterized.parameters(False, True)
    def test_adding_one_example_moves_the_release_by_at_most_c(self, with_loss):
        tx = _tx(optax.sgd(1.0), noise_multiplier=0.0, expected_lot_size=1.0)
        if with_loss:
            tx = _tx(optax.sgd(1.0), noise_multiplier=0.0, expected_lot_size=1.0, loss_fn=_loss_fn)
        lot = [[1, 1, 0, 1], [0, 1, 1, 0]]
        neighbour = [[1, 1, 1, 1], [0, 1, 1, 0]]  # Row 2 of micro-batch 0 added.
        update = jax.jit(tx.update)
        (calls,), _ = _run(tx, self.params, [lot], with_loss, apply=False, update=update)
        (calls_n,), _ = _run(tx, self.params, [neighbour], with_loss, apply=False, update=update)
        moved = np.sqrt(
            sum(
                np.sum((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2)
                for a, b in zip(*(jax.tree.leaves(c[-1][0]) for c in (calls, calls_n)), strict=True)
            )
        )
        self.assertLessEqual(moved, C * (1 + 1e-5))
        self.assertGreater(moved, 0.0)

    def test_padding_and_nonfinite_rows_add_exactly_zero_with_a_loss(self):
        tx = _tx(optax.sgd(1.0), noise_multiplier=0.0, expected_lot_size=1.0, loss_fn=_loss_fn)
        update = jax.jit(tx.update)
        state = tx.init(self.params)

        def release(batch, mask):
            return update(
                batch, state, self.params, noise_key=NOISE_KEY, mask=jnp.asarray(mask), release=True
            )[0]

        batch = _batch(3)
        clean = release(batch, [1, 0, 1, 1])
        for value in (np.nan, np.inf, 1e30):
            garbage = jax.tree.map(lambda v, value=value: v.at[1].set(value), batch)
            chex.assert_trees_all_equal(release(garbage, [1, 0, 1, 1]), clean)  # Padding.
        nan_row = jax.tree.map(lambda v: v.at[1].set(np.nan), batch)
        got = release(nan_row, [1, 1, 1, 1])  # A real row whose loss is NaN: dropped.
        chex.assert_tree_all_finite(got)
        chex.assert_trees_all_close(got, clean, rtol=1e-6, atol=1e-7)

    def test_bad_arguments_are_named(self):
        tx = _tx(optax.sgd(1.0), loss_fn=_loss_fn)
        state = tx.init(self.params)
        with self.assertRaisesRegex(ValueError, "needs params"):
            tx.update(_batch(0), state, noise_key=NOISE_KEY, release=True)
        with self.assertRaisesRegex(ValueError, "only with loss_fn"):
            _tx(optax.sgd(1.0), clipping="vmap")
        with self.assertRaisesRegex(ValueError, "clipping="):
            _tx(optax.sgd(1.0), loss_fn=_loss_fn, clipping="exact")


def test_dp_accumulate_aggregate_is_deprecated_for_dp_multi_steps():
    with pytest.warns(DeprecationWarning, match="dp_multi_steps"):
        core.dp_accumulate_aggregate(l2_clip=1.0, noise_multiplier=1.0, expected_lot_size=4.0)


if __name__ == "__main__":
    absltest.main()
