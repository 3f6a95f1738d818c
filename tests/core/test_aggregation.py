"""dp_aggregate: the optax GradientTransformation form of one DP-SGD release."""

import pickle

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl.testing import absltest, parameterized
from flax import serialization

from dpnmt import core

NOISE_KEY = core.key_from_seed(11, allow_fixed_seed_for_testing=True)

# dp_accumulate_aggregate stays tested while deprecated (tests/core/test_multi_steps.py).
pytestmark = pytest.mark.filterwarnings("ignore:dp_accumulate_aggregate is deprecated")


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
        self.clip = dict(mask=self.mask, params=self.params)  # clip_and_sum's other arguments

    def test_equals_explicit_clip_accumulate_noise(self):
        tx = core.dp_aggregate(l2_clip=0.5, noise_multiplier=1.2, expected_lot_size=6.0)
        state = tx.init(self.params)
        update = jax.jit(tx.update)
        for step in range(3):
            noisy, state = update(
                self.per_example, state, self.params, mask=self.mask, noise_key=NOISE_KEY
            )
            grad_sum, _ = core.clip_and_sum(self.per_example, l2_clip=0.5, **self.clip)
            acc = core.accumulate(core.init_accumulator(self.params), grad_sum, 4)
            key = core.noise_key_for_step(NOISE_KEY, step)
            expected = core.noisy_average(
                acc, key, noise_multiplier=1.2, l2_clip=0.5, expected_lot_size=6.0
            )
            chex.assert_trees_all_close(noisy, expected, rtol=1e-6, atol=1e-7)
        self.assertEqual(int(state.count), 3)

    def test_each_release_gets_new_noise(self):
        tx = core.dp_aggregate(l2_clip=1.0, noise_multiplier=1.0, expected_lot_size=5.0)
        state = tx.init(self.params)
        first, state = tx.update(self.per_example, state, self.params, noise_key=NOISE_KEY)
        second, _ = tx.update(self.per_example, state, self.params, noise_key=NOISE_KEY)
        self.assertFalse(np.allclose(first["w"], second["w"]))

    def test_chains_with_an_optimizer(self):
        tx = optax.chain(
            core.dp_aggregate(l2_clip=1.0, noise_multiplier=0.0, expected_lot_size=4.0),
            optax.sgd(1.0),
        )
        state = tx.init(self.params)
        updates, _ = tx.update(
            self.per_example, state, self.params, mask=self.mask, noise_key=NOISE_KEY
        )
        grad_sum, _ = core.clip_and_sum(self.per_example, l2_clip=1.0, **self.clip)
        chex.assert_trees_all_close(updates, jax.tree_util.tree_map(lambda g: -g / 4.0, grad_sum))

    def test_rejects_invalid_parameters(self):
        with self.assertRaisesRegex(ValueError, "l2_clip"):
            core.dp_aggregate(l2_clip=0.0, noise_multiplier=1.0, expected_lot_size=4.0)
        with self.assertRaisesRegex(ValueError, "expected_lot_size"):
            core.dp_aggregate(l2_clip=1.0, noise_multiplier=1.0, expected_lot_size=-4.0)


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
            l2_clip=0.7, noise_multiplier=1.3, expected_lot_size=9.0
        )

    def _run_lot(self, update, state, grads, mask):
        num = mask.shape[0]
        outs = []
        for k in range(num):
            micro = jax.tree_util.tree_map(lambda g, k=k: g[k], grads)
            out, state = update(
                micro, state, mask=mask[k], release=k == num - 1, noise_key=NOISE_KEY
            )
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
                one = jax.tree_util.tree_map(lambda g, k=k: g[k], grads)
                grad_sum, _ = core.clip_and_sum(one, l2_clip=0.7, mask=mask[k], params=self.params)
                acc = core.accumulate(acc, grad_sum, int(mask[k].sum()))
            key = core.noise_key_for_step(NOISE_KEY, lot)
            expected = core.noisy_average(
                acc, key, noise_multiplier=1.3, l2_clip=0.7, expected_lot_size=9.0
            )
            chex.assert_trees_all_close(outs[-1], expected, rtol=1e-5, atol=1e-6)
            for held in outs[:-1]:  # nothing leaves before the lot ends
                chex.assert_trees_all_equal(held, jax.tree_util.tree_map(jnp.zeros_like, held))
            self.assertEqual(int(state.count), lot + 1)
            self.assertEqual(int(state.accumulator.num_examples), 0)

    def test_one_program_for_lots_of_any_size(self):
        traces = []

        def traced(updates, state, mask, release):
            traces.append(1)
            return self.tx.update(updates, state, mask=mask, release=release, noise_key=NOISE_KEY)

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
        out, state = self.tx.update(
            micro, state, mask=jnp.zeros(4), release=True, noise_key=NOISE_KEY
        )
        key = core.noise_key_for_step(NOISE_KEY, 0)
        noise_only = core.noisy_average(
            core.init_accumulator(self.params),
            key,
            noise_multiplier=1.3,
            l2_clip=0.7,
            expected_lot_size=9.0,
        )
        chex.assert_trees_all_close(out, noise_only, rtol=1e-6)
        self.assertGreater(float(jnp.abs(out["w"]).sum()), 0.0)
        self.assertEqual(int(state.count), 1)

    def test_rejects_invalid_parameters(self):
        with self.assertRaisesRegex(ValueError, "noise_multiplier"):
            core.dp_accumulate_aggregate(l2_clip=1.0, noise_multiplier=-1.0, expected_lot_size=4.0)


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
                clipping="vmap",
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
                    loss_fn, params, rows, lot.mask[k], l2_clip=0.5, clipping="vmap"
                )
                acc = core.accumulate(acc, grad_sum, int(lot.mask[k].sum()))
            expected = core.noisy_average(
                acc, key, noise_multiplier=0.8, l2_clip=0.5, expected_lot_size=12.8
            )
            chex.assert_trees_all_close(step(lot, key), expected, rtol=1e-5, atol=1e-6)
        self.assertGreater(len(sizes), 1)
        self.assertLen(traces, 1)

    def test_example_key_reaches_each_micro_batch(self):
        data = {"x": jnp.arange(12.0).reshape(12, 1)}
        params = {"w": jnp.ones((1,))}

        def loss_fn(p, example, key):  # a dropout-like random factor per example
            return jnp.sum(example["x"] * p["w"]) * jax.random.uniform(key)

        lot = core.to_microbatches(jnp.arange(12), jnp.ones(12, bool), 4, 3, num_examples=12)
        kwargs = dict(l2_clip=100.0, noise_multiplier=0.0, expected_lot_size=1.0)
        kwargs["clipping"] = "vmap"
        got = core.private_lot_gradient(
            loss_fn, params, data, lot, jax.random.key(0), dropout_key=jax.random.key(7), **kwargs
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
            grad_sum, _ = core.clip_and_sum({"w": ones}, l2_clip=l2_clip, params=params)
            state = core.accumulate(state, grad_sum, 16)
        mask = jnp.arange(16) < last_microbatch_real_rows
        grad_sum, _ = core.clip_and_sum({"w": ones}, l2_clip=l2_clip, mask=mask, params=params)
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
            clipping="vmap",
        )
        self.assertTrue(bool(jnp.all(jnp.isnan(grad["w"]))))


def _noise_sums_regenerated_from(saved: bytes, noisy_grad, count: int, std: float, lot: float):
    """The attack on a saved optimizer state: each key-like leaf in it regenerates
    release `count`'s noise, and `noisy_grad · L − noise` is then a candidate for
    the lot's exact clipped sum."""
    state = pickle.loads(saved)
    keys = []
    for leaf in jax.tree_util.tree_leaves(state):
        if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            keys.append(leaf)
        elif jnp.issubdtype(leaf.dtype, jnp.integer) and leaf.size >= 2:
            words = np.asarray(leaf).astype(np.uint32).ravel()
            keys += [jax.random.wrap_key_data(words[i : i + 2]) for i in range(words.size - 1)]
    zeros = jax.tree_util.tree_map(jnp.zeros_like, noisy_grad)
    for key in keys:
        noise = core.add_gaussian_noise(zeros, std, core.noise_key_for_step(key, count))
        yield jax.tree_util.tree_map(lambda g, n: g * lot - n, noisy_grad, noise)


class SecretsStayOutOfStateTest(absltest.TestCase):
    def test_saved_chain_state_holds_no_key_that_regenerates_the_noise(self):
        """Regression (issue 26 item 1): `dp_aggregate` kept the run's noise key in
        its state, so a saved `optax.chain(dp_aggregate(...), optax.adam(...))`
        state regenerated each step's noise: with adam's first moment (the noisy
        gradient) the exact clipped sum came back (ε = ∞)."""
        rng = np.random.default_rng(3)
        params = {"w": jnp.zeros((3, 2)), "b": jnp.zeros((2,))}
        grads = {
            "w": jnp.asarray(rng.normal(size=(6, 3, 2)), jnp.float32),
            "b": jnp.asarray(rng.normal(size=(6, 2)), jnp.float32),
        }
        sigma, clip, lot, b1 = 2.0, 1.0, 6.0, 0.9
        tx = optax.chain(
            core.dp_aggregate(l2_clip=clip, noise_multiplier=sigma, expected_lot_size=lot),
            optax.adam(1e-3, b1=b1),
        )
        _, state = tx.update(grads, tx.init(params), params, noise_key=NOISE_KEY)
        saved = pickle.dumps(state)  # what a checkpoint of the optimizer holds
        mu = pickle.loads(saved)[1][0].mu  # adam's first moment: (1 - b1) · the release
        noisy = jax.tree_util.tree_map(lambda m: m / (1 - b1), mu)
        clipped_sum, _ = core.clip_and_sum(grads, l2_clip=clip, params=params)

        def recovers(candidate):
            return all(
                np.allclose(c, s, atol=1e-3)
                for c, s in zip(
                    jax.tree.leaves(candidate), jax.tree.leaves(clipped_sum), strict=True
                )
            )

        # The attack is sound: the secret key does recover the exact clipped sum.
        real = _noise_sums_regenerated_from(pickle.dumps(NOISE_KEY), noisy, 0, sigma * clip, lot)
        self.assertTrue(any(recovers(c) for c in real))
        # The saved state does not.
        from_state = _noise_sums_regenerated_from(saved, noisy, 0, sigma * clip, lot)
        self.assertFalse(any(recovers(c) for c in from_state))
        for leaf in jax.tree_util.tree_leaves(state):
            self.assertFalse(jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key))
        # And it serialises with flax like any optimizer state (a key leaf did not).
        serialization.msgpack_serialize(serialization.to_state_dict(state))

    def test_accumulate_state_holds_no_key(self):
        tx = core.dp_accumulate_aggregate(l2_clip=1.0, noise_multiplier=1.0, expected_lot_size=4.0)
        params = {"w": jnp.zeros((3,))}
        _, state = tx.update(
            {"w": jnp.ones((2, 3))}, tx.init(params), noise_key=NOISE_KEY, release=True
        )
        for leaf in jax.tree_util.tree_leaves(state):
            self.assertFalse(jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key))
            self.assertFalse(jnp.issubdtype(leaf.dtype, jnp.unsignedinteger))
        serialization.msgpack_serialize(serialization.to_state_dict(state))

    def test_update_without_a_noise_key_is_refused(self):
        params = {"w": jnp.zeros((3,))}
        for tx, kwargs in (
            (core.dp_aggregate(l2_clip=1.0, noise_multiplier=1.0, expected_lot_size=4.0), {}),
            (
                core.dp_accumulate_aggregate(
                    l2_clip=1.0, noise_multiplier=1.0, expected_lot_size=4.0
                ),
                {"release": True},
            ),
        ):
            with self.assertRaisesRegex(ValueError, "needs noise_key="):
                tx.update({"w": jnp.ones((2, 3))}, tx.init(params), params, **kwargs)


class PerExampleAxisTest(absltest.TestCase):
    def setUp(self):
        super().setUp()
        self.params = {"w": jnp.zeros((3,))}
        self.tx = core.dp_aggregate(l2_clip=1.0, noise_multiplier=0.0, expected_lot_size=1.0)

    def test_batch_gradient_without_the_per_example_axis_is_refused(self):
        """Regression (issue 26 item 4): a `[3]` gradient for a `[3]` parameter was
        read as 3 examples of scalars and returned a scalar update that optax
        broadcast to every weight."""
        state = self.tx.init(self.params)
        with self.assertRaisesRegex(ValueError, r"\['w'\] has shape \(3,\).*per-example axis"):
            self.tx.update({"w": jnp.ones(3)}, state, self.params, noise_key=NOISE_KEY)
        with self.assertRaisesRegex(ValueError, "needs params"):
            self.tx.update({"w": jnp.ones((2, 3))}, state, noise_key=NOISE_KEY)
        acc_tx = core.dp_accumulate_aggregate(
            l2_clip=1.0, noise_multiplier=0.0, expected_lot_size=1.0
        )
        with self.assertRaisesRegex(ValueError, "per-example axis"):
            acc_tx.update(
                {"w": jnp.ones(3)}, acc_tx.init(self.params), noise_key=NOISE_KEY, release=True
            )

    def test_leaves_with_different_batch_sizes_are_refused(self):
        grads = {"w": jnp.ones((4, 3)), "b": jnp.ones((2, 2))}
        with self.assertRaisesRegex(
            ValueError, r"same leading \(batch\) axis B; got \['b'\]: 2, \['w'\]: 4"
        ):
            core.clip_and_sum(grads, l2_clip=1.0, params={"w": jnp.ones(3), "b": jnp.ones(2)})
        # A mask of the wrong length: tests/core/test_validation.py.

    def test_empty_batch_is_a_clear_error(self):
        """Regression (issue 26 item 4): B = 0 died with ZeroDivisionError in a reshape."""
        state = self.tx.init(self.params)
        with self.assertRaisesRegex(ValueError, r"empty batch \(B = 0\)"):
            self.tx.update({"w": jnp.ones((0, 3))}, state, self.params, noise_key=NOISE_KEY)
        with self.assertRaisesRegex(ValueError, r"empty batch \(B = 0\)"):
            core.private_grad_sum(
                lambda p, ex: jnp.sum(ex["x"] * p["w"]),
                self.params,
                {"x": jnp.ones((0, 3))},
                jnp.ones(0),
                l2_clip=1.0,
                clipping="vmap",
            )


class LotDrawnForAnotherDataSetTest(absltest.TestCase):
    def test_lot_for_a_larger_n_is_refused(self):
        """Regression (issue 26 item 3): a lot drawn for N = 100 applied to 8 rows had
        its indices clamped by JAX, so row 7 counted many times (sensitivity ≫ C)."""
        data = {"x": jnp.ones((8, 3))}
        params = {"w": jnp.ones((3,))}
        lot = core.poisson_lot(jax.random.key(0), 100, 0.3, microbatch_size=8, max_microbatches=8)
        self.assertEqual(lot.num_examples, 100)
        kwargs = dict(l2_clip=1.0, noise_multiplier=0.0, expected_lot_size=1.0)

        def grad(lot):
            return core.private_lot_gradient(
                lambda p, ex: jnp.sum(ex["x"] * p["w"]),
                params,
                data,
                lot,
                jax.random.key(1),
                clipping="vmap",
                **kwargs,
            )

        message = "drawn for num_examples = 100 but examples has 8 rows"
        with self.assertRaisesRegex(ValueError, message):
            grad(lot)
        with self.assertRaisesRegex(ValueError, message):
            jax.jit(grad)(lot)  # N is static: checked under jit too
        small = core.to_microbatches(jnp.arange(8), jnp.ones(8, bool), 4, 2, num_examples=8)
        self.assertTrue(bool(jnp.all(jnp.isfinite(jax.jit(grad)(small)["w"]))))
