"""The floating-point attack on the float32 Gaussian, replayed against both noise modes.

Neighbours: one release of 64 coordinates, sums s = 0 and s' = s + (1/8, ..., 1/8)
(‖s' - s‖₂ = C = 1), noise σC = 5: the Gaussian mechanism claims ε ≈ 0.8 at
δ = 1e-5. The distinguisher asks whether the output y is one the mechanism can
produce from s. For float32 noise that set is sparse (2**23 noise values, then
rounding of s + z), so it separates the neighbours almost surely (issue 26).
"""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats
from absl.testing import parameterized
from jax import lax

from dpnmt import core
from dpnmt.core import secure_noise

TRIALS = 4000
COORDS = 64
SIGMA = 5.0
CLIP = 1.0
DELTA = 1e-5
ALPHA = 1e-6  # Significance of the statistical tests (fixed seeds).
_LOW = np.nextafter(np.float32(-1.0), np.float32(0.0))


def _float_normal_from_mantissa(mantissa):
    """The float32 normal that 23 random mantissa bits give: `core.threefry.normal`'s transform."""
    one = np.float32(1.0)
    word = mantissa.astype(jnp.uint32) | np.array(one).view(np.uint32)
    floats = lax.bitcast_convert_type(word, jnp.float32) - one
    uniform = lax.max(_LOW, floats * (one - _LOW) + _LOW)
    return np.float32(np.sqrt(2)) * lax.erf_inv(uniform)


def _float_reachable(y, s):
    """Per coordinate: is y = float32(s + float32(normal(m) · σC)) for some mantissa m?"""
    normals = _candidate_normals((y.astype(jnp.float32) - s) / np.float32(SIGMA * CLIP))
    return _reached(normals, y, s)


@jax.jit
def _candidate_normals(z):
    # Invert the transform approximately, then try the mantissas around the estimate.
    u = jax.scipy.special.erf(z / np.sqrt(2))
    estimate = jnp.round((u - _LOW) / (1 - _LOW) * 2**23).astype(jnp.int32)
    mantissa = jnp.clip(estimate[..., None] + jnp.arange(-8, 9), 0, 2**23 - 1)
    return _float_normal_from_mantissa(mantissa)


@jax.jit
def _reached(normals, y, s):
    # A separate program: the mechanism stores its float32 normals, then scales them
    # (`core.threefry.normal_vector`); fused, XLA would round √2·erfinv(u)·σC once fewer.
    return jnp.any(s[..., None] + normals * np.float32(SIGMA * CLIP) == y[..., None], axis=-1)


def _releases(mode, shift, seed):
    """`TRIALS` independent releases of 64 coordinates from s = shift (one key each)."""
    sums = jnp.full((TRIALS, COORDS), shift, jnp.float32)
    keys = jax.random.split(jax.random.key(seed), TRIALS)

    def one(total, key):
        return core.add_gaussian_noise(
            total, SIGMA * CLIP, key, noise_mode=mode, l2_sensitivity=CLIP
        )

    return jax.jit(jax.vmap(one))(sums, keys)


def _secure_reachable(y, s):
    """Per coordinate: is y = γ·(round(s/γ) + N) for an N the sampler can draw (|N| < 17 S)?"""
    plan = secure_noise.secure_grid(COORDS, SIGMA * CLIP, CLIP)
    steps = np.asarray(y, np.float64) / plan.grid
    offset = steps - np.round(np.asarray(s, np.float64) / plan.grid)
    return (steps == np.round(steps)) & (np.abs(offset) < 17 * plan.integer_scale)


def _claimed_epsilon():
    """ε of one Gaussian mechanism at σ = 5, δ = 1e-5 (no sampling: q = 1, T = 1)."""
    return core.compute_epsilon(SIGMA, 1.0, 1, DELTA)


def _epsilon_lower_bound(true_positives, false_positives, n, confidence=0.95):
    """ε >= log((TPR - δ) / FPR) at Clopper-Pearson bounds (both one-sided at confidence)."""
    tpr = scipy.stats.beta.ppf(1 - confidence, true_positives, n - true_positives + 1)
    fpr = scipy.stats.beta.ppf(confidence, false_positives + 1, n - false_positives)
    return math.log(max(tpr - DELTA, 1e-300) / fpr)


def test_float_noise_is_exposed_to_the_attack():
    """Documents the exposure: the default mode's raw noisy sum separates neighbours."""
    s, s_prime = jnp.zeros((TRIALS, COORDS)), jnp.full((TRIALS, COORDS), 1 / 8)
    from_s = _releases("float", 0.0, seed=0)
    from_s_prime = _releases("float", 1 / 8, seed=1)
    hits = np.asarray(jnp.all(_float_reachable(from_s, s), axis=-1))
    false_hits = np.asarray(jnp.all(_float_reachable(from_s_prime, s), axis=-1))
    assert hits.sum() == TRIALS  # The test never misses the true input...
    assert false_hits.sum() == 0  # ... and never accepts the neighbour.
    # So ε >= 7 where the Gaussian mechanism claims under 1.
    bound = _epsilon_lower_bound(hits.sum(), false_hits.sum(), TRIALS)
    assert bound > 7 > 5 * _claimed_epsilon()
    # Sanity: the neighbours' outputs as seen from s' are reachable from s'.
    assert bool(jnp.all(_float_reachable(from_s_prime, s_prime)))


def test_secure_noise_defeats_the_attack():
    """The same replay against mode "secure": the output sets coincide, advantage 0."""
    s, s_prime = np.zeros((TRIALS, COORDS)), np.full((TRIALS, COORDS), 1 / 8)
    from_s = _releases("secure", 0.0, seed=0)
    from_s_prime = _releases("secure", 1 / 8, seed=1)
    hits = np.all(_secure_reachable(from_s, s), axis=-1).sum()
    false_hits = np.all(_secure_reachable(from_s_prime, s), axis=-1).sum()
    assert hits == false_hits == TRIALS
    assert np.all(_secure_reachable(from_s_prime, s_prime))
    # The float attack finds nothing to hold on to either (chance: both near 0).
    float_hits = np.asarray(jnp.all(_float_reachable(from_s, jnp.asarray(s)), axis=-1)).sum()
    float_false = np.asarray(jnp.all(_float_reachable(from_s_prime, jnp.asarray(s)), axis=-1))
    assert float_hits == float_false.sum() == 0
    # The low bits carry no signal: the outputs are γ·m, and m is odd as often
    # from s as from s' (two-proportion z-test).
    grid = secure_noise.secure_grid(COORDS, SIGMA * CLIP, CLIP).grid
    low_bit = [np.round(np.asarray(y, np.float64) / grid) % 2 for y in (from_s, from_s_prime)]
    n = TRIALS * COORDS
    p = [b.mean() for b in low_bit]
    pooled = (p[0] + p[1]) / 2
    z = abs(p[0] - p[1]) / math.sqrt(2 * pooled * (1 - pooled) / n)
    assert z < scipy.stats.norm.ppf(1 - ALPHA / 2)


class DiscreteGaussianTest(parameterized.TestCase):
    @parameterized.parameters(1, 3, 10)
    def test_matches_the_discrete_gaussian_pmf(self, scale):
        n = 60_000
        draws = np.asarray(
            jax.jit(lambda k: secure_noise.discrete_gaussian(k, scale, n))(jax.random.key(scale))
        )
        support = np.arange(-17 * scale + 1, 17 * scale)
        pmf = np.exp(-(support.astype(np.float64) ** 2) / (2 * scale**2))
        pmf /= pmf.sum()
        counts = np.array([(draws == j).sum() for j in support])
        self.assertEqual(counts.sum(), n)  # Nothing outside |N| < 17 S.
        keep = pmf * n >= 5  # Pool the tails for the chi-square test.
        observed = np.append(counts[keep], counts[~keep].sum())
        expected = np.append(pmf[keep] * n, pmf[~keep].sum() * n)
        self.assertGreater(scipy.stats.chisquare(observed, expected).pvalue, ALPHA)

    def test_large_scale_is_normal_with_stddev_s(self):
        scale, n = 3_000_017, 60_000
        draws = np.asarray(secure_noise.discrete_gaussian(jax.random.key(0), scale, n), np.float64)
        self.assertGreater(scipy.stats.kstest(draws / scale, "norm").pvalue, ALPHA)
        lo, hi = scipy.stats.chi2.ppf([ALPHA / 2, 1 - ALPHA / 2], n - 1)
        self.assertBetween(draws.std(ddof=1), scale * math.sqrt(lo / n), scale * math.sqrt(hi / n))
        for wrong in (0.9 * scale, 1.1 * scale):  # A 10 % error in S is caught.
            self.assertLess(scipy.stats.kstest(draws / wrong, "norm").pvalue, ALPHA)

    def test_refuses_a_scale_out_of_range(self):
        with self.assertRaisesRegex(ValueError, "scale"):
            secure_noise.discrete_gaussian(jax.random.key(0), secure_noise.MAX_SCALE + 1, 4)


class SecureModeTest(parameterized.TestCase):
    def test_grid_keeps_the_accounted_noise_multiplier(self):
        for d, sigma in ((64, 5.0), (10**6, 0.7), (60_000_000, 1.1)):
            plan = secure_noise.secure_grid(d, sigma * 0.5, 0.5)
            self.assertEqual(math.log2(plan.grid), round(math.log2(plan.grid)))
            self.assertLessEqual(plan.grid * math.sqrt(d), secure_noise.GRID_INFLATION * 0.5)
            self.assertGreaterEqual(plan.integer_scale, sigma * plan.sensitivity)
            self.assertGreaterEqual(plan.stddev, sigma * 0.5)  # Never less noise than σC...
            limit = sigma * 0.5 * (1 + secure_noise.GRID_INFLATION) + plan.grid
            self.assertLessEqual(plan.stddev, limit)  # ... and at most 0.4 % (+ a step) more.

    def test_refuses_a_scale_beyond_int32(self):
        with self.assertRaisesRegex(ValueError, "noise_mode='secure'.*noise multiplier 100"):
            secure_noise.secure_grid(10**8, 100.0, 1.0)

    @chex.variants(with_jit=True, without_jit=True)
    def test_output_is_on_the_grid_with_leaf_shapes_and_dtypes(self):
        tree = {"w": jnp.linspace(-3, 3, 300).reshape(20, 15), "b": [jnp.ones((7,), jnp.bfloat16)]}
        noised = self.variant(
            lambda t, k: core.add_gaussian_noise(t, 0.5, k, noise_mode="secure", l2_sensitivity=1.0)
        )(tree, jax.random.key(3))
        chex.assert_trees_all_equal_shapes_and_dtypes(noised, tree)
        grid = secure_noise.secure_grid(307, 0.5, 1.0).grid
        steps = np.asarray(noised["w"], np.float64) / grid
        np.testing.assert_array_equal(steps, np.round(steps))
        self.assertGreater(float(jnp.std(noised["w"] - tree["w"])), 0.3)

    def test_zero_stddev_is_identity_and_nan_stays_nan(self):
        tree = {"w": jnp.array([0.3, jnp.nan, -1.0])}
        same = core.add_gaussian_noise(
            tree, 0.0, jax.random.key(0), noise_mode="secure", l2_sensitivity=1.0
        )
        chex.assert_trees_all_equal(same, tree)
        noised = core.add_gaussian_noise(
            tree, 1.0, jax.random.key(0), noise_mode="secure", l2_sensitivity=1.0
        )
        np.testing.assert_array_equal(np.isnan(noised["w"]), [False, True, False])

    @parameterized.named_parameters(
        ("unknown_mode", dict(noise_mode="exact"), "noise mode 'exact' is unknown"),
        ("no_sensitivity", dict(noise_mode="secure"), "l2_sensitivity"),
        ("bad_sensitivity", dict(noise_mode="secure", l2_sensitivity=0.0), "l2_sensitivity"),
    )
    def test_bad_mode_arguments(self, kwargs, message):
        with self.assertRaisesRegex(ValueError, message):
            core.add_gaussian_noise({"w": jnp.zeros(3)}, 1.0, jax.random.key(0), **kwargs)

    def test_noisy_average_secure_has_the_planned_stddev(self):
        sigma, l2_clip, lot_size, n = 1.3, 0.5, 64.0, 60_000
        state = core.init_accumulator({"w": jnp.zeros((n,))})
        release = jax.jit(
            lambda st, k: core.noisy_average(
                st,
                k,
                noise_multiplier=sigma,
                l2_clip=l2_clip,
                expected_lot_size=lot_size,
                noise_mode="secure",
            )
        )
        sample = np.asarray(release(state, jax.random.key(6))["w"], np.float64)
        stddev = secure_noise.secure_grid(n, sigma * l2_clip, l2_clip).stddev / lot_size
        lo, hi = scipy.stats.chi2.ppf([ALPHA / 2, 1 - ALPHA / 2], n - 1)
        self.assertBetween(
            sample.std(ddof=1), stddev * math.sqrt(lo / n), stddev * math.sqrt(hi / n)
        )

    def test_default_mode_is_unchanged(self):
        state = core.init_accumulator({"w": jnp.zeros((1000,))})
        default = core.noisy_average(
            state, jax.random.key(7), noise_multiplier=2.0, l2_clip=1.0, expected_lot_size=10.0
        )
        explicit = core.noisy_average(
            state,
            jax.random.key(7),
            noise_multiplier=2.0,
            l2_clip=1.0,
            expected_lot_size=10.0,
            noise_mode="float",
        )
        chex.assert_trees_all_equal(default, explicit)
        normal = jax.random.normal(jax.random.split(jax.random.key(7), 1)[0], (1000,)) * 2.0
        chex.assert_trees_all_equal(default["w"], normal / 10.0)


def test_attack_helper_reproduces_the_sampler():
    """The distinguisher's copy of the float sampler is exact (else its test proves nothing)."""
    key = jax.random.key(11)
    z = np.asarray(jax.random.normal(key, (5000,)))
    bits = np.asarray(jax.random.bits(key, (5000,), jnp.uint32))
    np.testing.assert_array_equal(
        np.asarray(_float_normal_from_mantissa(jnp.asarray(bits >> 9))), z
    )
