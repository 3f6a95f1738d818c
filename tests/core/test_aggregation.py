"""dp_aggregate: the optax GradientTransformation form of one DP-SGD release."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl.testing import absltest, parameterized

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


def _microbatches(seed: int, num: int, size: int = 4):
    rng = np.random.default_rng(seed)
    grads = {
        "w": jnp.asarray(rng.normal(size=(num, size, 3, 2)) * 3, jnp.float32),
        "b": jnp.asarray(rng.normal(size=(num, size, 2)) * 3, jnp.float32),
    }
    mask = jnp.asarray(rng.integers(0, 2, size=(num, size)), jnp.float32)
    return grads, mask


class DpAccumulateAggregateTest(parameterized.TestCase):
    def setUp(self):
        super().setUp()
        self.params = {"w": jnp.zeros((3, 2)), "b": jnp.zeros((2,))}
        self.tx = core.dp_accumulate_aggregate(
            l2_clip=0.7, noise_multiplier=1.3, expected_lot_size=9.0, seed=5
        )

    def _run_lot(self, update, state, grads, mask):
        num = mask.shape[0]
        outs = []
        for k in range(num):
            micro = jax.tree_util.tree_map(lambda g, k=k: g[k], grads)
            out, state = update(micro, state, mask=mask[k], release=k == num - 1)
            outs.append(out)
        return outs, state

    @chex.variants(with_jit=True, without_jit=True)
    def test_release_is_noisy_average_of_the_accumulated_clipped_sum(self):
        update = self.variant(self.tx.update)
        state = self.tx.init(self.params)
        for lot, num in enumerate((3, 1, 2)):
            grads, mask = _microbatches(lot, num)
            outs, state = self._run_lot(update, state, grads, mask)
            acc = core.init_accumulator(self.params)
            for k in range(num):
                micro = jax.tree_util.tree_map(lambda g, k=k: g[k], grads)
                grad_sum, _ = core.clip_and_sum(micro, 0.7, mask[k])
                acc = core.accumulate(acc, grad_sum, int(mask[k].sum()))
            key = core.noise_key_for_step(core.key_from_seed(5), lot)
            expected = core.noisy_average(acc, key, 1.3, 0.7, 9.0)
            chex.assert_trees_all_close(outs[-1], expected, rtol=1e-5, atol=1e-6)
            for held in outs[:-1]:  # nothing leaves before the lot ends
                chex.assert_trees_all_equal(held, jax.tree_util.tree_map(jnp.zeros_like, held))
            self.assertEqual(int(state.count), lot + 1)
            self.assertEqual(int(state.accumulator.num_examples), 0)

    def test_one_program_for_lots_of_any_size(self):
        traces = []

        def traced(updates, state, mask, release):
            traces.append(1)
            return self.tx.update(updates, state, mask=mask, release=release)

        update = jax.jit(traced)
        state = self.tx.init(self.params)
        for lot, num in enumerate((1, 4, 2, 7)):
            grads, mask = _microbatches(10 + lot, num)
            for k in range(num):
                micro = jax.tree_util.tree_map(lambda g, k=k: g[k], grads)
                _, state = update(micro, state, mask[k], jnp.asarray(k == num - 1))
        self.assertLen(traces, 1)
        self.assertEqual(int(state.count), 4)

    def test_empty_lot_releases_noise_only(self):
        state = self.tx.init(self.params)
        grads, _ = _microbatches(0, 1)
        micro = jax.tree_util.tree_map(lambda g: g[0], grads)
        out, state = self.tx.update(micro, state, mask=jnp.zeros(4), release=True)
        key = core.noise_key_for_step(core.key_from_seed(5), 0)
        noise_only = core.noisy_average(core.init_accumulator(self.params), key, 1.3, 0.7, 9.0)
        chex.assert_trees_all_close(out, noise_only, rtol=1e-6)
        self.assertGreater(float(jnp.abs(out["w"]).sum()), 0.0)
        self.assertEqual(int(state.count), 1)

    def test_rejects_invalid_parameters(self):
        with self.assertRaisesRegex(ValueError, "noise_multiplier"):
            core.dp_accumulate_aggregate(1.0, -1.0, 4.0, 0)


class PrivateLotGradientTest(parameterized.TestCase):
    def test_equals_accumulate_then_noisy_average_and_compiles_once(self):
        rng = np.random.default_rng(0)
        data = {"x": jnp.asarray(rng.normal(size=(64, 3)), jnp.float32)}
        params = {"w": jnp.asarray(rng.normal(size=(3,)), jnp.float32)}

        def loss_fn(p, example):
            return jnp.sum((example["x"] * p["w"]) ** 2)

        traces = []

        @jax.jit
        def step(lot, key):
            traces.append(1)
            return core.private_lot_gradient(
                loss_fn,
                params,
                data,
                lot,
                key,
                l2_clip=0.5,
                noise_multiplier=0.8,
                expected_lot_size=12.8,
                clipping_method="vmap",
            )

        sizes = set()
        for s in range(4):
            lot = core.poisson_lot(
                jax.random.key(s), 64, 0.2, microbatch_size=4, max_microbatches=8
            )
            sizes.add(int(lot.mask.sum()))
            key = jax.random.key(100 + s)
            acc = core.init_accumulator(params)
            for k in range(8):
                rows = {"x": data["x"][lot.indices[k]]}
                grad_sum, _, _ = core.private_grad_sum(
                    loss_fn, params, rows, lot.mask[k], 0.5, clipping="vmap"
                )
                acc = core.accumulate(acc, grad_sum, int(lot.mask[k].sum()))
            expected = core.noisy_average(acc, key, 0.8, 0.5, 12.8)
            chex.assert_trees_all_close(step(lot, key), expected, rtol=1e-5, atol=1e-6)
        self.assertGreater(len(sizes), 1)
        self.assertLen(traces, 1)

    def test_example_key_reaches_each_micro_batch(self):
        data = {"x": jnp.arange(12.0).reshape(12, 1)}
        params = {"w": jnp.ones((1,))}

        def loss_fn(p, example, key):  # a dropout-like random factor per example
            return jnp.sum(example["x"] * p["w"]) * jax.random.uniform(key)

        lot = core.to_microbatches(jnp.arange(12), jnp.ones(12, bool), 4, 3)
        kwargs = dict(l2_clip=100.0, noise_multiplier=0.0, expected_lot_size=1.0)
        kwargs["clipping_method"] = "vmap"
        got = core.private_lot_gradient(
            loss_fn, params, data, lot, jax.random.key(0), example_key=jax.random.key(7), **kwargs
        )
        expected = 0.0
        for k in range(3):
            keys = jax.random.split(jax.random.fold_in(jax.random.key(7), k), 4)
            xs = data["x"][lot.indices[k], 0]
            expected += float(jnp.sum(xs * jax.vmap(jax.random.uniform)(keys)))
        np.testing.assert_allclose(float(got["w"][0]), expected, rtol=1e-5)


def test_bfloat16_accumulator_keeps_sensitivity_at_most_clip():
    """Regression (core/accumulation.py:43-45 and core/clipping.py:79): the lot sum is
    kept in the parameter dtype. With bfloat16 parameters the accumulated sum is
    rounded to 8 mantissa bits after every micro-batch, and removing ONE example
    (norm <= C) can move the released sum by a whole bf16 ulp of the lot sum:
    here 16 C, not C. Accumulate (and return micro-batch sums) in float32."""
    l2_clip = 1.0
    params = {"w": jnp.zeros((1,), jnp.bfloat16)}
    ones = jnp.ones((16, 1), jnp.bfloat16)  # Every example's gradient has norm exactly C.

    def lot_sum(last_microbatch_real_rows: int) -> float:
        state = core.init_accumulator(params)
        for _ in range(128):  # 128 full micro-batches of 16: sum 2048 (exact in bf16).
            grad_sum, _ = core.clip_and_sum({"w": ones}, l2_clip)
            state = core.accumulate(state, grad_sum, 16)
        mask = jnp.arange(16) < last_microbatch_real_rows
        grad_sum, _ = core.clip_and_sum({"w": ones}, l2_clip, mask)
        state = core.accumulate(state, grad_sum, last_microbatch_real_rows)
        return float(state.grad_sum["w"][0])

    with_example, without_example = lot_sum(9), lot_sum(8)  # Neighbouring lots.
    assert abs(with_example - without_example) <= l2_clip * (1 + 1e-2), (
        f"one example moved the bf16 lot sum by {abs(with_example - without_example)} > C"
    )


if __name__ == "__main__":
    absltest.main()


class OverflowedLotTest(absltest.TestCase):
    def test_an_overflowed_lot_gives_nan_never_a_releasable_gradient(self):
        data = {"x": jnp.ones((64, 3), jnp.float32)}
        params = {"w": jnp.ones((3,), jnp.float32)}
        # q = 1 puts all 64 examples in a lot with room for 8: truncated.
        lot = core.poisson_lot(
            jax.random.key(0), 64, 1.0, microbatch_size=4, max_microbatches=2, on_overflow="flag"
        )
        self.assertTrue(bool(lot.overflow))
        grad = core.private_lot_gradient(
            lambda p, ex: jnp.sum(ex["x"] * p["w"]),
            params,
            data,
            lot,
            jax.random.key(1),
            l2_clip=1.0,
            noise_multiplier=1.0,
            expected_lot_size=8.0,
            clipping_method="vmap",
        )
        self.assertTrue(bool(jnp.all(jnp.isnan(grad["w"]))))
