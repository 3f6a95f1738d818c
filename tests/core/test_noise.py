"""Gaussian noise: its scale, independence, dtypes, and once-per-lot release."""

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats
from absl.testing import absltest, parameterized

from dpnmt import core

# Significance level of every statistical test here: with fixed seeds the tests
# are deterministic; alpha bounds how unlucky a seed could make a correct
# implementation look.
ALPHA = 1e-6
NUM_SAMPLES = 200_000


def _std_interval(stddev, n, alpha=ALPHA):
    """Two-sided (1 - alpha) interval for the sample std of n N(0, stddev²) draws.

    (n - 1) s² / stddev² ~ chi-square(n - 1).
    """
    lo, hi = scipy.stats.chi2.ppf([alpha / 2, 1 - alpha / 2], n - 1)
    return stddev * np.sqrt(lo / (n - 1)), stddev * np.sqrt(hi / (n - 1))


class AddGaussianNoiseTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(0.01, 1.0, 37.5)
    def test_sample_std_matches(self, stddev):
        tree = {"big": jnp.zeros((NUM_SAMPLES,), jnp.float32)}
        noised = self.variant(core.add_gaussian_noise, static_argnums=1)(
            tree, stddev, jax.random.key(0)
        )
        sample = np.asarray(noised["big"], np.float64)
        lo, hi = _std_interval(stddev, sample.size)
        self.assertBetween(sample.std(ddof=1), lo, hi)
        # Mean: N(0, stddev² / n).
        z = scipy.stats.norm.ppf(1 - ALPHA / 2)
        self.assertLess(abs(sample.mean()), z * stddev / np.sqrt(sample.size))

    def test_ks_accepts_right_scale_and_rejects_wrong_ones(self):
        stddev = 2.0
        sample = np.asarray(
            core.add_gaussian_noise(jnp.zeros((20_000,)), stddev, jax.random.key(1)), np.float64
        )
        self.assertGreater(scipy.stats.kstest(sample / stddev, "norm").pvalue, ALPHA)
        for wrong in (2 / 3 * stddev, 3 / 2 * stddev):
            self.assertLess(scipy.stats.kstest(sample / wrong, "norm").pvalue, ALPHA)

    def test_leaves_get_independent_noise(self):
        n = 50_000
        tree = {"a": jnp.zeros((n,)), "b": jnp.zeros((n,)), "c": jnp.zeros((n,))}
        noised = core.add_gaussian_noise(tree, 1.0, jax.random.key(2))
        samples = np.stack([np.asarray(noised[k]) for k in "abc"])
        correlation = np.corrcoef(samples)
        # Under independence, the sample correlation is ~ N(0, 1/n).
        bound = scipy.stats.norm.ppf(1 - ALPHA / 2) / np.sqrt(n)
        off_diagonal = correlation[~np.eye(3, dtype=bool)]
        self.assertLess(np.max(np.abs(off_diagonal)), bound)
        self.assertFalse(np.array_equal(samples[0], samples[1]))

    def test_steps_get_independent_noise(self):
        n = 50_000
        base = jax.random.key(3)
        draws = [
            np.asarray(
                core.add_gaussian_noise(jnp.zeros((n,)), 1.0, core.noise_key_for_step(base, step))
            )
            for step in range(4)
        ]
        correlation = np.corrcoef(np.stack(draws))
        bound = scipy.stats.norm.ppf(1 - ALPHA / 2) / np.sqrt(n)
        self.assertLess(np.max(np.abs(correlation[~np.eye(4, dtype=bool)])), bound)

    def test_step_keys_are_a_function_of_the_step(self):
        base = jax.random.key(4)
        again = jax.random.key(4)
        for step in (0, 1, 17):
            chex.assert_trees_all_equal(
                jax.random.key_data(core.noise_key_for_step(base, step)),
                jax.random.key_data(core.noise_key_for_step(again, step)),
            )
        keys = {
            tuple(np.asarray(jax.random.key_data(core.noise_key_for_step(base, s))))
            for s in range(100)
        }
        self.assertLen(keys, 100)

    @parameterized.parameters(jnp.float32, jnp.bfloat16, jnp.float16)
    def test_dtype_and_shape_preserved(self, dtype):
        tree = {"w": jnp.ones((3, 4), dtype), "b": [jnp.ones((2,), dtype)]}
        noised = core.add_gaussian_noise(tree, 0.1, jax.random.key(5))
        chex.assert_trees_all_equal_shapes_and_dtypes(noised, tree)

    @parameterized.parameters(jnp.float32, jnp.bfloat16)
    def test_noise_is_one_jax_random_normal_draw_bit_for_bit(self, dtype):
        """One `jax.random.normal` draw over all coordinates, sliced to the leaves (issue 30
        item 3: a draw per leaf compiled a Threefry hash per leaf)."""
        tree = {"w": jnp.full((33, 17), 2.0, dtype), "b": [jnp.zeros((5,), dtype)]}
        tree["empty"] = jnp.ones((0, 3), dtype)
        key = jax.random.key(9)

        def reference(tree, key):
            leaves, treedef = jax.tree_util.tree_flatten(tree)
            (group_key,) = jax.random.split(key, 1)
            draws = jax.random.normal(group_key, (sum(leaf.size for leaf in leaves),))
            noised, start = [], 0
            for leaf in leaves:
                noise = draws[start : start + leaf.size].reshape(leaf.shape) * 0.5
                noised.append((leaf.astype(jnp.float32) + noise).astype(leaf.dtype))
                start += leaf.size
            return jax.tree_util.tree_unflatten(treedef, noised)

        for transform in (jax.jit, lambda f: f):
            noised = transform(lambda t, k: core.add_gaussian_noise(t, 0.5, k))(tree, key)
            chex.assert_trees_all_equal(noised, transform(reference)(tree, key))

    def test_every_leaf_has_the_right_std_and_no_two_leaves_share_bits(self):
        """Many leaves, equal and unequal shapes: each leaf's noise is N(0, σ²) i.i.d.,
        uncorrelated with every other leaf's (no bits reused), and fresh per key."""
        stddev, n = 2.5, 8192
        shapes = [(n,)] * 4 + [(64, 128), (128, 64), (2, 4096), (n // 2, 2)]
        tree = [jnp.zeros(shape) for shape in shapes]
        step_noise = []
        for step in range(3):
            key = core.noise_key_for_step(jax.random.key(12), step)
            noise = jax.jit(lambda t, k: core.add_gaussian_noise(t, stddev, k))(tree, key)
            step_noise.append(np.stack([np.asarray(leaf, np.float64).ravel() for leaf in noise]))
        num_tests = len(shapes) * (1 + len(shapes) * 3)  # Bonferroni over every check below.
        alpha = ALPHA / num_tests
        # Known mean 0: sum(z²)/σ² ~ chi-square(n) per leaf.
        low, high = scipy.stats.chi2.ppf([alpha / 2, 1 - alpha / 2], n)
        for leaf in step_noise[0]:
            self.assertBetween(np.sum(leaf**2) / stddev**2, low, high)
        # Sample correlations of independent leaves (or lots) are ~ N(0, 1/n).
        bound = scipy.stats.norm.ppf(1 - alpha / 2) / np.sqrt(n)
        for a, b in [(0, 0), (0, 1), (0, 2)]:  # Leaves of a lot; leaves across lots.
            correlation = np.corrcoef(step_noise[a], step_noise[b])[: len(shapes), len(shapes) :]
            if a == b:
                correlation = correlation[~np.eye(len(shapes), dtype=bool)]
            self.assertLess(np.max(np.abs(correlation)), bound, (a, b))
        for a, b in [(0, 1), (4, 5), (6, 7)]:  # Equal sizes: not the same draws.
            self.assertLess(np.isin(step_noise[0][a], step_noise[0][b]).mean(), 0.01)

    def test_compiles_one_threefry_hash_whatever_the_number_of_leaves(self):
        """Issue 30 item 3: one draw per leaf compiled one straight-line hash per leaf
        (three quarters of a DP update's compile). Counted in the compiled HLO."""

        def xor_count(num_leaves):
            tree = [jnp.zeros((16, 8 + i)) for i in range(num_leaves)]
            noise = jax.jit(lambda t, k: core.add_gaussian_noise(t, 1.0, k))
            hlo = noise.lower(tree, jax.random.key(0)).compile().as_text()
            return len(re.findall(r"= \S+ xor\(", hlo))

        one = xor_count(1)
        self.assertGreater(one, 20)  # Threefry-2x32's 20 rounds: the count sees the hash.
        self.assertLess(xor_count(24), 2 * one)

    def test_zero_stddev_is_identity_and_negative_is_error(self):
        tree = {"w": jnp.arange(5.0)}
        chex.assert_trees_all_equal(core.add_gaussian_noise(tree, 0.0, jax.random.key(0)), tree)
        with self.assertRaisesRegex(ValueError, "stddev"):
            core.add_gaussian_noise(tree, -1.0, jax.random.key(0))

    def test_fresh_seeds_differ(self):
        self.assertNotEqual(core.fresh_seed(), core.fresh_seed())


class SeedTest(absltest.TestCase):
    def test_fresh_seeds_have_128_bits(self):
        # 64 draws all below 2**120 has probability 2**-512 for a 128-bit seed.
        seeds = [core.fresh_seed() for _ in range(64)]
        self.assertGreater(max(seed.bit_length() for seed in seeds), 120)
        self.assertLess(max(seeds), 2**128)

    def test_key_depends_on_every_bit_of_a_big_seed(self):
        """key_from_seed folded 63 bits into the key and refused larger seeds."""
        seed = 2**127 + 0x5DEECE66D_0123_4567
        key_data = np.asarray(jax.random.key_data(core.key_from_seed(seed)))
        for bit in (0, 31, 32, 63, 64, 100, 127):
            other_key = core.key_from_seed(seed ^ 1 << bit, allow_fixed_seed_for_testing=True)
            other = np.asarray(jax.random.key_data(other_key))
            self.assertFalse(np.array_equal(key_data, other), f"bit {bit} is ignored")
        again = np.asarray(jax.random.key_data(core.key_from_seed(seed)))
        np.testing.assert_array_equal(key_data, again)  # A function of the seed.
        with self.assertRaisesRegex(ValueError, "non-negative"):
            core.key_from_seed(-1)

    def test_fixed_seeds_are_refused_unless_testing(self):
        """Regression (issue 26 item 1): `seed=0` (or any typed-in seed) was accepted
        for a release; whoever knows it rebuilds the noise."""
        for seed in (0, 1234, 2**64 - 1, np.int64(7)):
            with self.assertRaisesRegex(ValueError, "below 2\\*\\*64.*fresh_seed"):
                core.key_from_seed(seed)
            core.key_from_seed(seed, allow_fixed_seed_for_testing=True)
        for _ in range(16):  # fresh seeds are never mistaken for fixed ones
            self.assertGreaterEqual(core.fresh_seed(), 2**64)
        core.key_from_seed(2**64)

    def test_non_integer_seeds_are_refused(self):
        """Regression (issue 26 item 4): `key_from_seed(1.5)` was `key_from_seed(1)`."""
        for seed in (1.5, 2.0**70, np.float64(2.0**70), True, np.bool_(True), "7"):
            with self.assertRaisesRegex(TypeError, "seed must be an integer"):
                core.key_from_seed(seed, allow_fixed_seed_for_testing=True)
        big = core.key_from_seed(np.uint64(2**64 - 1), allow_fixed_seed_for_testing=True)
        same = core.key_from_seed(2**64 - 1, allow_fixed_seed_for_testing=True)
        np.testing.assert_array_equal(jax.random.key_data(big), jax.random.key_data(same))

    def test_docstring_states_the_key_size_and_collision_probability(self):
        """Regression (issue 26 item 13): the docstring said no two seeds share a key,
        but a 128-bit seed is hashed to a 64-bit threefry key."""
        self.assertEqual(jax.random.key_data(core.key_from_seed(core.fresh_seed())).shape, (2,))
        doc = " ".join(core.key_from_seed.__doc__.split())
        self.assertNotIn("no two seeds", doc)
        self.assertIn("A threefry key holds 64 bits", doc)
        self.assertIn("share a key with probability about 2**-64", doc)


class NoisyAverageTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_noise_is_drawn_once_on_the_accumulated_sum(self):
        """K micro-batches, one release: std is σC/L, not σC·√K/L."""
        sigma, l2_clip, lot_size, num_micro = 1.3, 0.5, 64.0, 8
        params = {"w": jnp.zeros((NUM_SAMPLES,))}
        state = core.init_accumulator(params)
        for _ in range(num_micro):
            state = core.accumulate(state, params, 8)
        release = self.variant(
            core.noisy_average,
            static_argnames=("noise_multiplier", "l2_clip", "expected_lot_size"),
        )
        noisy = release(
            state,
            jax.random.key(6),
            noise_multiplier=sigma,
            l2_clip=l2_clip,
            expected_lot_size=lot_size,
        )
        sample = np.asarray(noisy["w"], np.float64)
        lo, hi = _std_interval(sigma * l2_clip / lot_size, sample.size)
        self.assertBetween(sample.std(ddof=1), lo, hi)
        # Noise per micro-batch would give σC·√K/L: that interval must not match.
        lo_k, hi_k = _std_interval(sigma * l2_clip * np.sqrt(num_micro) / lot_size, sample.size)
        self.assertFalse(lo_k <= sample.std(ddof=1) <= hi_k)

    def test_divides_by_expected_lot_size_not_realised_count(self):
        grad_sum = {"w": jnp.full((3,), 12.0)}
        state = core.accumulate(core.init_accumulator(grad_sum), grad_sum, 3)
        for realised in (0, 3, 1000):
            state = state._replace(num_examples=jnp.asarray(realised, jnp.int32))
            out = core.noisy_average(
                state, jax.random.key(0), noise_multiplier=0.0, l2_clip=1.0, expected_lot_size=4.0
            )
            np.testing.assert_allclose(out["w"], 3.0)

    def test_empty_lot_releases_pure_noise(self):
        params = {"w": jnp.zeros((1000,))}
        out = core.noisy_average(
            core.init_accumulator(params),
            jax.random.key(7),
            noise_multiplier=2.0,
            l2_clip=1.0,
            expected_lot_size=10.0,
        )
        expected = core.add_gaussian_noise(params, 2.0, jax.random.key(7))
        chex.assert_trees_all_close(out, jax.tree_util.tree_map(lambda x: x / 10.0, expected))
        self.assertGreater(float(jnp.std(out["w"])), 0.1)

    def test_privacy_parameters_work_under_jit_when_static(self):
        state = core.init_accumulator({"w": jnp.zeros((4,))})
        fn = jax.jit(
            core.noisy_average, static_argnames=("noise_multiplier", "l2_clip", "expected_lot_size")
        )
        out = fn(state, jax.random.key(0), noise_multiplier=1.0, l2_clip=1.0, expected_lot_size=2.0)
        chex.assert_shape(out["w"], (4,))

    @parameterized.named_parameters(
        ("negative_sigma", -0.1, 1.0, 8.0, "noise_multiplier"),
        ("zero_clip", 1.0, 0.0, 8.0, "l2_clip"),
        ("zero_lot", 1.0, 1.0, 0.0, "expected_lot_size"),
        ("inf_lot", 1.0, 1.0, float("inf"), "expected_lot_size"),
    )
    def test_invalid_parameters(self, sigma, l2_clip, lot_size, name):
        state = core.init_accumulator({"w": jnp.zeros((2,))})
        with self.assertRaisesRegex(ValueError, name):
            core.noisy_average(
                state,
                jax.random.key(0),
                noise_multiplier=sigma,
                l2_clip=l2_clip,
                expected_lot_size=lot_size,
            )


def test_noise_seeds_differing_above_bit_32_give_different_noise():
    """Regression (core/noise.py:58, core/aggregation.py:63): `fresh_seed()` promises 63
    CSPRNG bits, but `jax.random.key(seed)` (x64 off, the default) keeps only the
    low 32 bits, so two seeds that differ only in bits >= 32 draw identical noise
    and a release run's noise key has 32 bits of entropy, not 63."""
    low = 123456789
    high = low + (1 << 40)  # A different 63-bit seed with the same low 32 bits.
    per_example = {"w": jnp.ones((4, 8), jnp.float32)}
    noisy = []
    for seed in (low, high):
        tx = core.dp_aggregate(l2_clip=1.0, noise_multiplier=1.0, expected_lot_size=4.0)
        key = core.key_from_seed(seed, allow_fixed_seed_for_testing=True)
        params = {"w": jnp.zeros(8)}
        update, _ = tx.update(per_example, tx.init(params), params, noise_key=key)
        noisy.append(np.asarray(update["w"]))
    assert not np.array_equal(noisy[0], noisy[1]), "seeds differing above bit 32 collide"


if __name__ == "__main__":
    absltest.main()
