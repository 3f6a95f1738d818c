"""JAX-native sampling: Poisson inclusion, lot sizes, independence, padding, shuffling."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats
from absl.testing import absltest, parameterized
from hypothesis import given, settings
from hypothesis import strategies as st

from dpnmt import core

# Significance level of every statistical test: seeds are fixed, so the tests
# are deterministic; ALPHA bounds how unlucky a seed could make a correct
# sampler look.
ALPHA = 1e-6
N, Q, STEPS = 200, 0.05, 4000


def _masks(seed: int, num_examples: int, sampling_rate: float, steps: int) -> np.ndarray:
    """Inclusion masks `[steps, N]` of consecutive steps, keys fold_in(key, step)."""
    base = jax.random.key(seed)
    keys = jax.vmap(lambda s: jax.random.fold_in(base, s))(jnp.arange(steps))
    draw = jax.jit(jax.vmap(lambda k: core.poisson_mask(k, num_examples, sampling_rate)))
    return np.asarray(draw(keys))


class PoissonMaskTest(parameterized.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.masks = _masks(0, N, Q, STEPS)

    def test_each_example_included_with_probability_q(self):
        counts = self.masks.sum(axis=0)
        # Each count ~ Binomial(STEPS, Q); Bonferroni over the N examples.
        lo, hi = scipy.stats.binom.interval(1 - ALPHA / N, STEPS, Q)
        self.assertGreaterEqual(counts.min(), lo)
        self.assertLessEqual(counts.max(), hi)
        # And the pooled frequency, ~ Binomial(STEPS·N, Q).
        lo, hi = scipy.stats.binom.interval(1 - ALPHA, STEPS * N, Q)
        self.assertBetween(counts.sum(), lo, hi)

    def _lot_size_pvalue(self, sizes: np.ndarray, sampling_rate: float) -> float:
        # chi-square goodness of fit against Binomial(N, q), tails pooled so that
        # every expected count is >= 5.
        support = np.arange(N + 1)
        probs = scipy.stats.binom.pmf(support, N, sampling_rate)
        lo = int(scipy.stats.binom.ppf(0.01, N, sampling_rate))
        hi = int(scipy.stats.binom.ppf(0.99, N, sampling_rate))
        edges = list(range(lo, hi + 1))
        expected = [probs[:lo].sum()] + [probs[k] for k in edges] + [probs[hi + 1 :].sum()]
        observed = [np.sum(sizes < lo)] + [np.sum(sizes == k) for k in edges]
        observed.append(np.sum(sizes > hi))
        expected = np.asarray(expected) * sizes.size
        return scipy.stats.chisquare(observed, expected).pvalue

    def test_lot_size_is_binomial_and_a_wrong_rate_is_rejected(self):
        sizes = self.masks.sum(axis=1)
        self.assertGreater(self._lot_size_pvalue(sizes, Q), ALPHA)
        # Power: the same test rejects rates 20% off.
        for wrong in (0.8 * Q, 1.2 * Q):
            self.assertLess(self._lot_size_pvalue(sizes, wrong), ALPHA)

    def test_steps_are_independent(self):
        # 2x2 table of (in lot t, in lot t+1) over all examples and steps.
        now, nxt = self.masks[:-1].ravel(), self.masks[1:].ravel()
        table = [[np.sum(~now & ~nxt), np.sum(~now & nxt)], [np.sum(now & ~nxt), np.sum(now & nxt)]]
        self.assertGreater(scipy.stats.chi2_contingency(table).pvalue, ALPHA)
        # Examples within a step are independent too: lot sizes' variance is Nq(1-q).
        sizes = self.masks.sum(axis=1)
        df = STEPS - 1
        lo, hi = scipy.stats.chi2.ppf([ALPHA / 2, 1 - ALPHA / 2], df)
        ratio = sizes.var(ddof=1) / (N * Q * (1 - Q))
        self.assertBetween(ratio, lo / df, hi / df)

    def test_the_same_key_reused_would_be_caught(self):
        # The independence check has power: identical lots fail it.
        repeated = np.repeat(self.masks[:1], STEPS, axis=0)
        now, nxt = repeated[:-1].ravel(), repeated[1:].ravel()
        table = [[np.sum(~now & ~nxt), np.sum(~now & nxt)], [np.sum(now & ~nxt), np.sum(now & nxt)]]
        self.assertLess(scipy.stats.chi2_contingency(table).pvalue, ALPHA)

    @parameterized.parameters(1.0001 * 2.0**-23, 1e-6, 0.3, 0.5, 1.0)
    def test_inclusion_is_a_64_bit_word_below_floor_q_2_64(self, sampling_rate):
        # The probability is exactly floor(q·2^64)/2^64 <= q. A float32 uniform
        # (jax.random.bernoulli) rounds q UP to its 2^-23 grid: 2q for the first
        # rate, so the accountant's q would understate the sampling that ran.
        key = jax.random.key(3)
        mask = np.asarray(core.poisson_mask(key, 4096, sampling_rate))
        words = np.asarray(jax.random.bits(key, (4096, 2), jnp.uint32)).astype(np.uint64)
        values = [int(hi) << 32 | int(lo) for hi, lo in words]
        threshold = int(sampling_rate * 2.0**64)
        np.testing.assert_array_equal(mask, [v < threshold for v in values])
        self.assertLessEqual(threshold / 2.0**64, sampling_rate)

    def test_rejects_bad_rates(self):
        with self.assertRaisesRegex(ValueError, "sampling_rate"):
            core.poisson_mask(jax.random.key(0), 10, 1.5)
        with self.assertRaisesRegex(ValueError, "num_examples"):
            core.poisson_mask(jax.random.key(0), 0, 0.5)


class PoissonLotTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_real_rows_are_the_poisson_sample_once_and_padding_is_masked(self):
        sample = self.variant(
            lambda k: core.poisson_lot(k, 100, 0.2, microbatch_size=8, max_microbatches=6)
        )
        for seed in range(5):
            key = jax.random.key(seed)
            lot = sample(key)
            chex.assert_shape([lot.indices, lot.mask], (6, 8))
            expected = np.flatnonzero(np.asarray(core.poisson_mask(key, 100, 0.2)))
            indices, mask = np.asarray(lot.indices).ravel(), np.asarray(lot.mask).ravel()
            real = indices[mask == 1]
            np.testing.assert_array_equal(real, expected)  # each selected example, once
            self.assertEqual(len(set(real.tolist())), real.size)
            self.assertTrue(set(np.unique(mask)) <= {0.0, 1.0})
            np.testing.assert_array_equal(indices[mask == 0], 0)  # valid dummy index
            self.assertEqual(int(lot.num_microbatches), -(-real.size // 8))
            self.assertTrue(np.all(np.asarray(lot.mask)[int(lot.num_microbatches) :] == 0))
            self.assertFalse(bool(lot.overflow))

    def test_overflow_raises_without_naming_the_lot_size(self):
        """Regression (issue 26 item 4): the docs promised an `OverflowError`; under
        `jax.jit` it surfaces as `jax.errors.JaxRuntimeError`. The docstring now
        names each type where it is raised."""
        size = int(core.poisson_mask(jax.random.key(0), 100, 0.5).sum())

        def sample(k):
            return core.poisson_lot(k, 100, 0.5, microbatch_size=4, max_microbatches=2)

        with self.assertRaisesRegex(OverflowError, "exceeded its capacity of 8 rows") as eager:
            sample(jax.random.key(0))
        with self.assertRaisesRegex(
            jax.errors.JaxRuntimeError, "OverflowError: A Poisson lot exceeded its capacity"
        ) as compiled:
            jax.block_until_ready(jax.jit(sample)(jax.random.key(0)))
        for caught in (eager, compiled):
            self.assertNotIn(f" {size} ", str(caught.exception).split("OverflowError")[-1])
        doc = " ".join(core.poisson_lot.__doc__.split())
        self.assertIn("Called eagerly, that `OverflowError` reaches the caller", doc)
        self.assertIn("raises `jax.errors.JaxRuntimeError`", doc)
        self.assertIn("contains `OverflowError: A Poisson lot exceeded its capacity`", doc)

    def test_overflow_flagged_when_asked(self):
        lot = core.poisson_lot(
            jax.random.key(0), 100, 0.5, microbatch_size=4, max_microbatches=2, on_overflow="flag"
        )
        self.assertTrue(bool(lot.overflow))
        with self.assertRaisesRegex(ValueError, "on_overflow"):
            core.poisson_lot(
                jax.random.key(0), 10, 0.5, microbatch_size=4, max_microbatches=2, on_overflow="x"
            )

    def test_lot_capacity_bounds_the_overflow_probability(self):
        n, q, b, steps = 60_000, 256 / 60_000, 32, 1000
        k = core.lot_capacity(n, q, b, num_steps=steps, overflow_probability=1e-9)
        self.assertLessEqual(scipy.stats.binom.sf(k * b, n, q) * steps, 1e-9)
        self.assertGreater(scipy.stats.binom.sf((k - 1) * b, n, q) * steps, 1e-9 * 1e-6)
        self.assertGreater(k * b, 256)


class ToMicrobatchesTest(parameterized.TestCase):
    @settings(max_examples=10)
    @given(
        size=st.integers(0, 40),
        microbatch_size=st.integers(1, 9),
        extra=st.integers(0, 3),
    )
    def test_packs_a_prefix_and_masks_the_rest(self, size, microbatch_size, extra):
        num_microbatches = -(-max(size, 1) // microbatch_size) + extra
        indices = jnp.arange(size, dtype=jnp.int32) * 3 + 1
        lot = core.to_microbatches(
            indices, jnp.ones(size, bool), microbatch_size, num_microbatches, num_examples=200
        )
        mask = np.asarray(lot.mask).ravel()
        np.testing.assert_array_equal(np.asarray(lot.indices).ravel()[mask == 1], indices)
        self.assertEqual(mask.sum(), size)
        np.testing.assert_array_equal(np.asarray(lot.indices).ravel()[mask == 0], 0)
        self.assertEqual(int(lot.num_microbatches), -(-size // microbatch_size))

    def test_too_many_indices_is_an_error(self):
        with self.assertRaisesRegex(ValueError, "raise num_microbatches"):
            core.to_microbatches(jnp.arange(10), jnp.ones(10, bool), 4, 2, num_examples=10)

    @chex.variants(with_jit=True, without_jit=True)
    def test_any_valid_mask_keeps_every_real_row_in_the_leading_microbatches(self):
        """Regression (issue 26 item 4): a `valid` that is not a prefix had its real
        rows left in place, while `num_microbatches` counted only ceil(real / b)
        leading micro-batches: the real row in a later one was skipped."""
        indices = jnp.arange(8, dtype=jnp.int32) + 10
        valid = jnp.array([0, 0, 0, 0, 1, 0, 0, 1], bool)
        lot = self.variant(lambda i, v: core.to_microbatches(i, v, 4, 2, num_examples=20))(
            indices, valid
        )
        used = np.asarray(lot.indices)[: int(lot.num_microbatches)]
        used_mask = np.asarray(lot.mask)[: int(lot.num_microbatches)]
        self.assertEqual(sorted(used[used_mask == 1].tolist()), [14, 17])
        self.assertEqual(float(np.asarray(lot.mask).sum()), 2.0)

    def test_lot_carries_n_and_refuses_indices_outside_it(self):
        lot = core.to_microbatches(jnp.arange(5), jnp.ones(5, bool), 4, 2, num_examples=7)
        self.assertEqual(lot.num_examples, 7)
        with self.assertRaisesRegex(ValueError, r"outside \[0, num_examples = 5\)"):
            core.to_microbatches(jnp.arange(6), jnp.ones(6, bool), 4, 2, num_examples=5)
        with self.assertRaisesRegex(ValueError, "valid has shape"):
            core.to_microbatches(jnp.arange(6), jnp.ones(5, bool), 4, 2, num_examples=9)


class ShuffledLotsTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_an_epoch_is_a_permutation_cut_into_fixed_lots(self):
        lots = np.asarray(self.variant(lambda k: core.shuffled_lots(k, 103, 10))(jax.random.key(3)))
        self.assertEqual(lots.shape, (10, 10))
        self.assertEqual(len(set(lots.ravel().tolist())), 100)  # no duplicates
        self.assertTrue(np.all((lots >= 0) & (lots < 103)))

    def test_epochs_differ_and_positions_are_uniform(self):
        base = jax.random.key(4)
        epochs = 3000
        firsts = np.asarray(
            jax.vmap(lambda e: core.shuffled_lots(jax.random.fold_in(base, e), 20, 5)[0, 0])(
                jnp.arange(epochs)
            )
        )
        # The first slot is uniform over the 20 examples.
        counts = np.bincount(firsts, minlength=20)
        self.assertGreater(scipy.stats.chisquare(counts).pvalue, ALPHA)

    def test_rejects_a_lot_larger_than_the_data(self):
        with self.assertRaisesRegex(ValueError, "lot_size=11 exceeds num_examples=10"):
            core.shuffled_lots(jax.random.key(0), 10, 11)


if __name__ == "__main__":
    absltest.main()
