"""`dpnmt.core.dp_step`, the one lot step, and `dp_multi_steps`, its optax form.

The step's privacy properties (noise once per lot, padding zero, empty lot,
÷ L, noise not per device) are tested on the trainer's sharded use of it in
tests/train/test_step_semantics.py and tests/bridge/test_sharded_step.py;
`private_lot_gradient` and the optax forms in tests/core/test_aggregation.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl.testing import absltest

from dpnmt import bridge, core
from dpnmt.core import dp_step

NOISE_KEY = core.key_from_seed(2**90 + 5)
NOISE = {"l2_clip": 0.5, "noise_multiplier": 1.3, "expected_lot_size": 7.0}


def _grads(seed, rows=4):
    rng = np.random.default_rng(seed)
    return {
        "w": jnp.asarray(rng.normal(size=(rows, 3, 2)), jnp.float32),
        "b": jnp.asarray(rng.normal(size=(rows, 2)), jnp.float32),
    }


class DpStepTest(absltest.TestCase):
    def setUp(self):
        super().setUp()
        self.params = {"w": jnp.ones((3, 2)), "b": jnp.zeros((2,))}

    def test_train_state_is_a_pytree_without_keys(self):
        state = core.init_train_state(self.params, optax.adam(1e-2))
        leaves = jax.tree.leaves(state)
        self.assertEqual(int(state.step), 0)
        self.assertTrue(all(not jnp.issubdtype(x.dtype, jax.dtypes.prng_key) for x in leaves))
        again = jax.tree.unflatten(jax.tree.structure(state), leaves)
        self.assertIsInstance(again, core.TrainState)

    def test_apply_lot_noises_with_the_key_of_its_step_once(self):
        tx = optax.sgd(1.0)
        lot = dp_step.init(self.params)
        for k, mask in enumerate(([1, 1, 0, 1], [0, 0, 1, 0])):
            lot = dp_step.add_per_example_grads(lot, _grads(k), jnp.asarray(mask), l2_clip=0.5)
        state = core.TrainState(jnp.int32(4), self.params, tx.init(self.params))
        after = jax.jit(lambda s, lot, key: dp_step.apply_lot(s, lot, key, tx=tx, **NOISE))(
            state, lot, NOISE_KEY
        )
        released = core.noisy_average(
            lot,
            core.noise_key_for_step(NOISE_KEY, 4),
            noise_multiplier=1.3,
            l2_clip=0.5,
            expected_lot_size=7.0,
        )
        expected = jax.tree.map(jnp.subtract, self.params, released)
        self.assertEqual(int(after.step), 5)
        jax.tree.map(  # Jit fuses p - g/L: one float32 rounding apart at most.
            lambda a, b: np.testing.assert_allclose(a, b, rtol=3e-7, atol=0),
            after.params,
            expected,
        )

    def test_dropout_key_is_the_loops_fold_in_order(self):
        base = core.key_from_seed(2**70 + 3)
        got = core.dropout_key(base, 9, 2)
        want = jax.random.fold_in(jax.random.fold_in(base, 9), 2)
        np.testing.assert_array_equal(jax.random.key_data(got), jax.random.key_data(want))


class DpMultiStepsTest(absltest.TestCase):
    """Composes like `optax.MultiSteps`: the optimizer steps once per released lot."""

    def setUp(self):
        super().setUp()
        self.params = {"w": jnp.ones((3, 2)), "b": jnp.zeros((2,))}

    def test_optimizer_steps_only_on_release_on_the_released_gradient(self):
        inner = optax.adam(0.1)
        tx = core.dp_multi_steps(inner, **NOISE)
        state, params = tx.init(self.params), self.params
        update = jax.jit(tx.update)
        lots = ([[1, 1, 0, 1], [0, 1, 0, 0]], [[0, 0, 0, 0]], [[1, 0, 1, 1]])
        inner_state, expected = inner.init(self.params), self.params
        for lot_index, masks in enumerate(lots):
            lot = dp_step.init(self.params)
            for k, mask in enumerate(masks):
                grads, mask = _grads(10 * lot_index + k), jnp.asarray(mask)
                last = k == len(masks) - 1
                updates, state = update(
                    grads, state, params, noise_key=NOISE_KEY, mask=mask, release=last
                )
                params = optax.apply_updates(params, updates)
                lot = dp_step.add_per_example_grads(lot, grads, mask, l2_clip=0.5)
                if not last:  # Held: zero updates, the optimizer state untouched.
                    jax.tree.map(lambda u: self.assertFalse(jnp.any(u)), updates)
                    self.assertEqual(int(state.inner_state[0].count), lot_index)
            key = core.noise_key_for_step(NOISE_KEY, lot_index)
            gradient = dp_step.release(lot, key, **NOISE)
            step, inner_state = inner.update(gradient, inner_state, expected)
            expected = optax.apply_updates(expected, step)
            jax.tree.map(
                lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
                params,
                expected,
            )
        self.assertEqual(int(state.count), 3)
        self.assertEqual(int(state.inner_state[0].count), 3)  # Adam stepped once per lot.
        jax.tree.map(lambda a: self.assertFalse(jnp.any(a)), state.accumulator.grad_sum)

    def test_state_holds_no_key(self):
        tx = core.dp_multi_steps(optax.sgd(1.0), **NOISE)
        _, state = tx.update(
            _grads(0), tx.init(self.params), self.params, noise_key=NOISE_KEY, release=True
        )
        for leaf in jax.tree.leaves(state):
            self.assertFalse(jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key))
            self.assertFalse(jnp.issubdtype(leaf.dtype, jnp.unsignedinteger))


class OnePoissonRuleTest(absltest.TestCase):
    """The bridge's host sampler and the core's JAX sampler include an example by the
    same rule, a uniform 64-bit word below floor(q·2**64): the same Bernoulli(q).

    Two word sources stay: the bridge's host lots come from numpy's PCG64 seeded
    with every bit of the run's secret seed (or `os.urandom`), run a lot ahead
    in a thread and save the generator state for resume; drawing them from
    Threefry instead would change the lots of every run resumed after the change.
    """

    def test_same_words_give_the_same_members(self):
        for rate in (1e-6, 1.0001 * 2.0**-23, 0.3, 0.5, 1.0):
            key = jax.random.key(17)
            words = np.asarray(jax.random.bits(key, (4096, 2), jnp.uint32)).astype(np.uint64)
            as_uint64 = (words[:, 0] << np.uint64(32)) | words[:, 1]
            core_members = np.flatnonzero(np.asarray(core.poisson_mask(key, 4096, rate)))
            bridge_members = bridge.lots.bernoulli_members(as_uint64, rate)
            np.testing.assert_array_equal(core_members, bridge_members)
        # Words on both sides of the threshold (the rule, not luck, decides).
        rate = 0.3
        threshold = np.uint64(int(rate * 2.0**64))
        edge = np.array([threshold - np.uint64(1), threshold, threshold + np.uint64(1)])
        np.testing.assert_array_equal(bridge.lots.bernoulli_members(edge, rate), [0])


if __name__ == "__main__":
    absltest.main()
