"""The clipped sum's sensitivity in float32: no row above C, padding and non-finite rows zero.

Each test names the bug it catches: a factor rounded up, a factor relative to
float32(C) > C, a norm computed a little low, 0 * NaN leaking into the sum.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

from dpnmt import core
from dpnmt.core import clipping

# C values whose float32 is above C (0.1, 1/3, 0.3) or exactly C (1, 2**-7).
CLIPS = (0.1, 1.0 / 3.0, 0.3, 1.0, 2.0**-7)


def _rows_near_clip(seed, rows, width, l2_clip):
    """Rows whose norms lie within ~1e-5 of C on either side, or far above it."""
    rng = np.random.default_rng(seed)
    grads = rng.normal(size=(rows, width))
    target = l2_clip * np.concatenate(
        [1.0 + rng.uniform(-1e-5, 1e-5, rows - rows // 4), rng.uniform(1.0, 1e4, rows // 4)]
    )
    grads *= (target / np.linalg.norm(grads, axis=1))[:, None]
    return jnp.asarray(grads, jnp.float32)


class ClipFactorTest(parameterized.TestCase):
    @parameterized.parameters(*CLIPS)
    def test_factor_times_norm_never_exceeds_c_exactly(self, l2_clip):
        # Catches fl(C / n) rounded up, and a factor relative to float32(C) > C.
        rng = np.random.default_rng(0)
        norms = np.concatenate(
            [l2_clip * rng.uniform(1.0, 1.001, 20000), l2_clip * rng.uniform(1.0, 1e6, 20000)]
        ).astype(np.float32)
        keep, scale = jax.jit(lambda n: clipping.clip_factors(n, l2_clip))(norms)
        self.assertTrue(bool(jnp.all(keep)))
        exact = np.asarray(scale, np.float64) * norms.astype(np.float64)
        self.assertLessEqual(exact.max(), l2_clip)  # Python float C, exactly.
        np.testing.assert_array_less(l2_clip * (1 - 1e-6), exact[norms > l2_clip])

    def test_rows_at_or_under_c_keep_factor_one(self):
        norms = jnp.asarray([0.0, 0.25, np.float32(0.5)], jnp.float32)
        _, scale = clipping.clip_factors(norms, 0.5, jnp.asarray([1, 1, 1]))
        np.testing.assert_array_equal(scale, [1.0, 1.0, 1.0])


class OneRowContributionTest(parameterized.TestCase):
    @parameterized.parameters(*CLIPS)
    def test_each_clipped_row_as_computed_has_norm_at_most_c(self, l2_clip):
        # One row at a time: the float32 output IS that row's contribution. Catches
        # clipping from the computed norm without its rounding bound (a norm a few
        # ulps low, then the rounded products) as well as a factor rounded up.
        rows = _rows_near_clip(1, 2048, 3000, l2_clip)
        one = jax.jit(
            jax.vmap(
                lambda g: core.clip_and_sum({"g": g[None]}, l2_clip=l2_clip, params={"g": g})[0][
                    "g"
                ]
            )
        )
        contributions = np.asarray(one(rows), np.float64)
        norms = np.sqrt(np.sum(contributions**2, axis=1))
        self.assertLessEqual(norms.max(), l2_clip)
        np.testing.assert_allclose(norms, l2_clip, rtol=2e-5)  # Clipped, not shrunk further.


class AddOneExampleTest(parameterized.TestCase):
    def setUp(self):
        super().setUp()
        rng = np.random.default_rng(2)
        self.base = {
            "w": jnp.asarray(rng.normal(size=(16, 64, 32)), jnp.float32),
            "b": jnp.asarray(rng.normal(size=(16, 32)), jnp.float32),
        }
        self.params = jax.tree.map(lambda x: x[0], self.base)

    def _with_row(self, row):
        return jax.tree.map(lambda x, r: x.at[7].set(r), self.base, row)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(np.nan, np.inf, -np.inf, 3e38)
    def test_a_nonfinite_example_adds_exactly_zero(self, value):
        # Catches 0 * NaN (a non-finite row's factor 0 times its entries) in the sum.
        clip = self.variant(lambda g: core.clip_and_sum(g, l2_clip=0.5, params=self.params)[0])
        zero_row = jax.tree.map(lambda x: jnp.zeros(x.shape[1:], x.dtype), self.base)
        bad_row = jax.tree.map(lambda z: z.at[(0,) * z.ndim].set(value), zero_row)
        if value == 3e38:  # Finite entries, but the squared norm overflows: dropped.
            bad_row = jax.tree.map(lambda z: z + value, zero_row)
        chex.assert_trees_all_equal(clip(self._with_row(bad_row)), clip(self._with_row(zero_row)))

    @chex.variants(with_jit=True, without_jit=True)
    def test_a_padding_row_adds_exactly_zero_whatever_it_holds(self):
        mask = jnp.ones(16).at[7].set(0)
        clip = self.variant(
            lambda g, m: core.clip_and_sum(g, l2_clip=0.5, mask=m, params=self.params)[0]
        )
        zero_row = jax.tree.map(lambda x: jnp.zeros(x.shape[1:], x.dtype), self.base)
        expected = clip(self._with_row(zero_row), mask)
        for value in (np.nan, np.inf, 1e30, 5.0):
            garbage = jax.tree.map(lambda z, v=value: z + v, zero_row)
            chex.assert_trees_all_equal(clip(self._with_row(garbage), mask), expected)

    @parameterized.parameters(*CLIPS)
    def test_adding_one_example_moves_the_sum_by_at_most_c(self, l2_clip):
        mask = jnp.ones(16).at[7].set(0)
        rng = np.random.default_rng(3)
        added = jax.tree.map(
            lambda x: jnp.asarray(rng.normal(size=x.shape[1:]) * 100, jnp.float32), self.base
        )
        clip = jax.jit(
            lambda g, m: core.clip_and_sum(g, l2_clip=l2_clip, mask=m, params=self.params)[0]
        )
        without = clip(self._with_row(added), mask)
        with_it = clip(self._with_row(added), jnp.ones(16))
        diff = jax.tree.map(
            lambda a, b: np.asarray(a, np.float64) - np.asarray(b, np.float64), with_it, without
        )
        moved = np.sqrt(sum(np.sum(d**2) for d in jax.tree.leaves(diff)))
        # Float32 rounding of the sum of 16 rows of norm <= C, each a few ulps.
        self.assertLessEqual(moved, l2_clip * (1 + 16 * 2.0**-23))
        self.assertGreater(moved, l2_clip * (1 - 1e-4))  # The added row was clipped to C.


class PrivateGradSumVmapTest(absltest.TestCase):
    def test_example_whose_loss_is_nan_adds_exactly_zero(self):
        rng = np.random.default_rng(4)
        params = {"w": jnp.asarray(rng.normal(size=(8, 4)), jnp.float32)}
        x = jnp.asarray(rng.uniform(0.5, 2.0, size=(6, 8)), jnp.float32)

        def loss_fn(params, x):  # log of a negative input: NaN loss and gradient.
            return jnp.sum(jnp.log(x) @ params["w"])

        poisoned = x.at[2, 0].set(-1.0)
        mask = jnp.ones(6)
        run = jax.jit(
            lambda b, m: core.private_grad_sum(loss_fn, params, b, m, l2_clip=0.3, clipping="vmap")[
                0
            ]
        )
        got = run(poisoned, mask)
        expected = run(x, mask.at[2].set(0))
        chex.assert_tree_all_finite(got)
        chex.assert_trees_all_close(got, expected, rtol=1e-6, atol=1e-7)


if __name__ == "__main__":
    absltest.main()
