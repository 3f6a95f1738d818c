"""dp_aggregate: the optax GradientTransformation form of one DP-SGD release."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl.testing import absltest

from dpnmt import core


class DpAggregateTest(absltest.TestCase):
    def setUp(self):
        super().setUp()
        rng = np.random.default_rng(0)
        self.params = {"w": jnp.zeros((3, 2)), "b": jnp.zeros((2,))}
        self.per_example = {
            "w": jnp.asarray(rng.normal(size=(5, 3, 2)), jnp.float32),
            "b": jnp.asarray(rng.normal(size=(5, 2)), jnp.float32),
        }
        self.mask = jnp.array([1, 1, 0, 1, 1])

    def test_equals_explicit_clip_accumulate_noise(self):
        tx = core.dp_aggregate(l2_clip=0.5, noise_multiplier=1.2, expected_lot_size=6.0, seed=11)
        state = tx.init(self.params)
        update = jax.jit(tx.update)
        for step in range(3):
            noisy, state = update(self.per_example, state, self.params, mask=self.mask)
            grad_sum, _ = core.clip_and_sum(self.per_example, 0.5, self.mask)
            acc = core.accumulate(core.init_accumulator(self.params), grad_sum, 4)
            key = core.noise_key_for_step(core.key_from_seed(11), step)
            expected = core.noisy_average(acc, key, 1.2, 0.5, 6.0)
            chex.assert_trees_all_close(noisy, expected, rtol=1e-6, atol=1e-7)
        self.assertEqual(int(state.count), 3)

    def test_each_release_gets_new_noise(self):
        tx = core.dp_aggregate(l2_clip=1.0, noise_multiplier=1.0, expected_lot_size=5.0, seed=0)
        state = tx.init(self.params)
        first, state = tx.update(self.per_example, state)
        second, _ = tx.update(self.per_example, state)
        self.assertFalse(np.allclose(first["w"], second["w"]))

    def test_chains_with_an_optimizer(self):
        tx = optax.chain(
            core.dp_aggregate(l2_clip=1.0, noise_multiplier=0.0, expected_lot_size=4.0, seed=0),
            optax.sgd(1.0),
        )
        state = tx.init(self.params)
        updates, _ = tx.update(self.per_example, state, self.params, mask=self.mask)
        grad_sum, _ = core.clip_and_sum(self.per_example, 1.0, self.mask)
        chex.assert_trees_all_close(updates, jax.tree_util.tree_map(lambda g: -g / 4.0, grad_sum))

    def test_rejects_invalid_parameters(self):
        with self.assertRaisesRegex(ValueError, "l2_clip"):
            core.dp_aggregate(l2_clip=0.0, noise_multiplier=1.0, expected_lot_size=4.0, seed=0)
        with self.assertRaisesRegex(ValueError, "expected_lot_size"):
            core.dp_aggregate(l2_clip=1.0, noise_multiplier=1.0, expected_lot_size=-4.0, seed=0)


if __name__ == "__main__":
    absltest.main()
