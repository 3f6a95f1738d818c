"""Per-example clipping: bounded norms, masking, non-finite rows, sensitivity."""

import chex
import hypothesis
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from hypothesis import strategies as st

from dpnmt import core


def _random_grads(seed, batch_size, scale=1.0):
    rng = np.random.default_rng(seed)
    return {
        "w": jnp.asarray(rng.normal(size=(batch_size, 3, 4)) * scale, jnp.float32),
        "b": jnp.asarray(rng.normal(size=(batch_size, 4)) * scale, jnp.float32),
    }


def _clip_each(grads, l2_clip):
    """Reference: numpy, one example at a time."""
    leaves = {k: np.asarray(v, np.float64) for k, v in grads.items()}
    batch_size = leaves["w"].shape[0]
    clipped = {k: np.zeros_like(v) for k, v in leaves.items()}
    for i in range(batch_size):
        norm = np.sqrt(sum(np.sum(v[i] ** 2) for v in leaves.values()))
        scale = min(1.0, l2_clip / norm) if norm > 0 else 1.0
        for k in leaves:
            clipped[k][i] = leaves[k][i] * scale
    return clipped


def _params_of(per_example_grads):
    """The parameters' shapes: one row of each per-example leaf."""
    return jax.tree.map(lambda g: jax.ShapeDtypeStruct(g.shape[1:], g.dtype), per_example_grads)


def _clip_and_sum(grads, l2_clip, mask=None):  # positional C, for static_argnums under jit
    return core.clip_and_sum(grads, l2_clip=l2_clip, mask=mask, params=_params_of(grads))


def _private_grad_sum(loss_fn, params, batch, mask, l2_clip):
    return core.private_grad_sum(loss_fn, params, batch, mask, l2_clip=l2_clip)


class ClippingTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_norms_match_numpy(self):
        grads = _random_grads(0, 5)
        norms = self.variant(core.per_example_l2_norms)(grads)
        expected = np.sqrt(
            np.sum(np.asarray(grads["w"]).reshape(5, -1) ** 2, 1)
            + np.sum(np.asarray(grads["b"]) ** 2, 1)
        )
        chex.assert_shape(norms, (5,))
        np.testing.assert_allclose(norms, expected, rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(0.1, 1.0, 3.0, 100.0)
    def test_sum_equals_sum_of_individually_clipped(self, l2_clip):
        grads = _random_grads(1, 7)
        grad_sum, _ = self.variant(_clip_and_sum, static_argnums=1)(grads, l2_clip)
        reference = _clip_each(grads, l2_clip)
        for name in grads:
            np.testing.assert_allclose(grad_sum[name], reference[name].sum(0), rtol=1e-5, atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_every_clipped_example_has_norm_at_most_c(self):
        l2_clip = 0.5
        grads = _random_grads(2, 9, scale=10.0)
        clip_one = self.variant(lambda g: _clip_and_sum(g, l2_clip)[0])
        for i in range(9):
            one = jax.tree_util.tree_map(lambda x, i=i: x[i : i + 1], grads)
            norm = core.per_example_l2_norms(
                jax.tree_util.tree_map(lambda x: x[None], clip_one(one))
            )
            self.assertLessEqual(float(norm[0]), l2_clip * (1 + 1e-6))

    @chex.variants(with_jit=True, without_jit=True)
    def test_examples_under_c_are_unchanged(self):
        grads = _random_grads(3, 4, scale=0.01)  # Norms well below C = 1.
        grad_sum, norms = self.variant(_clip_and_sum, static_argnums=1)(grads, 1.0)
        self.assertTrue(bool(jnp.all(norms < 1.0)))
        for name in grads:
            np.testing.assert_array_equal(grad_sum[name], jnp.sum(grads[name], 0))

    @chex.variants(with_jit=True, without_jit=True)
    def test_masked_rows_change_nothing(self):
        grads = _random_grads(4, 6)
        mask = jnp.array([1, 0, 1, 1, 0, 1])
        real_only = jax.tree_util.tree_map(lambda x: x[np.array([0, 2, 3, 5])], grads)
        # Garbage (huge, NaN) in masked rows must not leak into the sum.
        poisoned = jax.tree_util.tree_map(lambda x: x.at[1].set(1e30).at[4].set(jnp.nan), grads)
        clip = self.variant(_clip_and_sum, static_argnums=1)
        masked_sum, _ = clip(poisoned, 1.0, mask)
        real_sum, _ = clip(real_only, 1.0)
        chex.assert_trees_all_equal(masked_sum, real_sum)

    @chex.variants(with_jit=True, without_jit=True)
    def test_nonfinite_example_is_zeroed_and_counted(self):
        grads = _random_grads(5, 4)
        bad = jax.tree_util.tree_map(lambda x: x, grads)
        bad["w"] = bad["w"].at[2, 0, 0].set(jnp.inf)
        bad["b"] = bad["b"].at[3, 1].set(jnp.nan)
        mask = jnp.array([1, 1, 1, 0])
        clip = self.variant(_clip_and_sum, static_argnums=1)
        grad_sum, norms = clip(bad, 1.0, mask)
        expected, _ = clip(jax.tree_util.tree_map(lambda x: x[:2], grads), 1.0)
        chex.assert_trees_all_close(grad_sum, expected, rtol=1e-6)
        chex.assert_tree_all_finite(grad_sum)
        self.assertEqual(int(core.count_nonfinite(norms, mask)), 1)  # Row 3 is masked.
        self.assertEqual(int(core.count_nonfinite(norms)), 2)

    @chex.variants(with_jit=True, without_jit=True)
    def test_low_precision_gradients_are_summed_in_float32(self):
        grads = {"w": jnp.ones((3, 5), jnp.bfloat16)}
        grad_sum, norms = self.variant(_clip_and_sum, static_argnums=1)(grads, 1.0)
        self.assertEqual(grad_sum["w"].dtype, jnp.float32)
        self.assertEqual(norms.dtype, jnp.float32)

    def test_rejects_nonpositive_clip(self):
        for bad in (0.0, -1.0, float("nan")):
            with self.assertRaisesRegex(ValueError, "l2_clip"):
                _clip_and_sum(_random_grads(0, 2), bad)


@hypothesis.given(
    batch=hnp.arrays(
        np.float32,
        st.tuples(st.integers(2, 12), st.integers(1, 6)),
        elements=st.floats(-1.0, 1.0, width=32),
    ),
    log_scale=st.floats(-6.0, 6.0),
    l2_clip=st.floats(1e-3, 1e3),
    removed=st.integers(0, 11),
)
def test_sensitivity_of_removing_one_example_is_at_most_c(batch, log_scale, l2_clip, removed):
    """For D and D' = D minus one example, the clipped sums differ by <= C in L2."""
    grads = {"g": jnp.asarray(batch * 10.0**log_scale)}
    removed = removed % batch.shape[0]
    neighbour = {"g": jnp.delete(grads["g"], removed, axis=0)}
    full_sum, _ = _clip_and_sum(grads, l2_clip)
    neighbour_sum, _ = _clip_and_sum(neighbour, l2_clip)
    diff = np.asarray(full_sum["g"], np.float64) - np.asarray(neighbour_sum["g"], np.float64)
    # Float32 rounding of a sum of B terms each of norm <= C.
    tolerance = l2_clip * (1 + 1e-5) + 1e-6 * l2_clip * batch.shape[0]
    assert np.linalg.norm(diff) <= tolerance


class PrivateGradSumTest(parameterized.TestCase):
    def setUp(self):
        super().setUp()
        rng = np.random.default_rng(0)
        self.params = {"w": jnp.asarray(rng.normal(size=(4, 2)), jnp.float32)}
        self.batch = {
            "x": jnp.asarray(rng.normal(size=(6, 4)), jnp.float32),
            "y": jnp.asarray(rng.normal(size=(6, 2)), jnp.float32),
        }

    @staticmethod
    def loss_fn(params, example):
        return jnp.sum((example["x"] @ params["w"] - example["y"]) ** 2)

    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_clipping_explicit_per_example_grads(self):
        mask = jnp.array([1, 1, 0, 1, 1, 0])
        grad_sum, norms, mean_loss = self.variant(_private_grad_sum, static_argnums=(0, 4))(
            self.loss_fn, self.params, self.batch, mask, 0.7
        )
        per_example = jax.vmap(jax.grad(self.loss_fn), in_axes=(None, 0))(self.params, self.batch)
        expected, expected_norms = core.clip_and_sum(
            per_example, l2_clip=0.7, mask=mask, params=self.params
        )
        chex.assert_trees_all_close(grad_sum, expected, rtol=1e-5)
        np.testing.assert_allclose(norms, expected_norms, rtol=1e-5)
        losses = jax.vmap(self.loss_fn, in_axes=(None, 0))(self.params, self.batch)
        np.testing.assert_allclose(mean_loss, jnp.sum(losses * mask) / 4, rtol=1e-5)

    def test_returns_a_named_result_whose_norms_and_loss_are_flagged_private(self):
        result = core.private_grad_sum(
            self.loss_fn, self.params, self.batch, jnp.ones(6), l2_clip=0.7
        )
        self.assertIsInstance(result, core.PrivateGradSum)
        grad_sum, norms, mean_loss = result  # Still unpacks as the old tuple.
        self.assertIs(result.norms, norms)
        self.assertIs(result.mean_loss, mean_loss)
        chex.assert_shape(norms, (6,))
        doc = core.PrivateGradSum.__doc__
        for field in ("norms", "mean_loss"):
            entry = doc.split(f"{field}:")[1].split("\n      ")[0:6]
            self.assertIn("PRIVATE", " ".join(entry), field)
        self.assertIn("PRIVATE", core.private_grad_sum.__doc__.splitlines()[0])

    @chex.variants(with_jit=True, without_jit=True)
    def test_all_masked_batch_gives_zero(self):
        grad_sum, _, mean_loss = self.variant(_private_grad_sum, static_argnums=(0, 4))(
            self.loss_fn, self.params, self.batch, jnp.zeros(6), 1.0
        )
        chex.assert_trees_all_equal(grad_sum, jax.tree_util.tree_map(jnp.zeros_like, self.params))
        self.assertEqual(float(mean_loss), 0.0)

    def test_each_example_gets_its_own_key(self):
        def loss_with_key(params, example, key):
            del params
            return jax.random.uniform(key) + 0.0 * jnp.sum(example["x"])

        # The "loss" reveals the key: six different keys give six different values.
        def losses(key):
            keys = jax.random.split(key, 6)
            return jax.vmap(loss_with_key, in_axes=(None, 0, 0))(self.params, self.batch, keys)

        values = np.asarray(losses(jax.random.key(0)))
        self.assertLen(np.unique(values), 6)
        _, _, mean_loss = core.private_grad_sum(
            loss_with_key,
            self.params,
            self.batch,
            jnp.ones(6),
            l2_clip=1.0,
            dropout_key=jax.random.key(0),
        )
        np.testing.assert_allclose(mean_loss, values.mean(), rtol=1e-6)

    def test_accumulating_microbatches_equals_clipping_their_union(self):
        mask = jnp.array([1, 1, 1, 1, 1, 0])
        union_sum, _, _ = core.private_grad_sum(
            self.loss_fn, self.params, self.batch, mask, l2_clip=0.5
        )
        state = core.init_accumulator(self.params)
        for part in (slice(0, 2), slice(2, 4), slice(4, 6)):
            micro = jax.tree_util.tree_map(lambda x, part=part: x[part], self.batch)
            micro_sum, _, _ = core.private_grad_sum(
                self.loss_fn, self.params, micro, mask[part], l2_clip=0.5
            )
            state = core.accumulate(state, micro_sum, jnp.sum(mask[part]))
        chex.assert_trees_all_close(state.grad_sum, union_sum, rtol=1e-5, atol=1e-6)
        self.assertEqual(int(state.num_examples), 5)


class JaxPrivacyCrossCheckTest(absltest.TestCase):
    def test_clip_and_sum_matches_jax_privacy_clipped_grad(self):
        jax_privacy = __import__("jax_privacy")
        rng = np.random.default_rng(7)
        params = {"w": jnp.asarray(rng.normal(size=(5, 3)), jnp.float32)}
        x = jnp.asarray(rng.normal(size=(8, 5)) * rng.uniform(0.01, 10, size=(8, 1)), jnp.float32)
        y = jnp.asarray(rng.normal(size=(8, 3)), jnp.float32)

        def loss(params, x, y):
            return jnp.sum(jnp.tanh(x @ params["w"]) * y)

        def loss_one(params, example):
            return loss(params, example[0], example[1])

        for l2_clip in (0.1, 1.0, 10.0):
            theirs = jax_privacy.clipped_grad(
                lambda p, xb, yb: loss(p, xb[0], yb[0]),
                l2_clip_norm=l2_clip,
                batch_argnums=(1, 2),
            )(params, x, y)
            ours, _, _ = core.private_grad_sum(
                loss_one, params, (x, y), jnp.ones(8), l2_clip=l2_clip
            )
            chex.assert_trees_all_close(ours, theirs, rtol=1e-5, atol=1e-6)


if __name__ == "__main__":
    absltest.main()
