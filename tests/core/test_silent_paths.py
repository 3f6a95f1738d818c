"""Issue 64 item 3: the core's last silent paths are checked or refused.

- A lot's rows are gathered by `MicroBatches.gather`, checked against the
  lot's N (`data[lot.indices[k]]` on data of another size clamps out-of-range
  indices onto the last row, counting it many times), and the examples and
  the core docs use it.
- `noise_key_for_step` and `dp_step.dropout_key` refuse a step that is not an
  integer in [0, 2**32): `fold_in` truncates 1.5 to 1, so a float step counter
  reuses step 1's noise key.
- `poisson_lot`, `poisson_mask` and `shuffled_lots` take N = 100.0 as 100 and
  refuse 100.5 naming `num_examples` (a float N reached JAX as a shape).
- `clip_and_sum(..., params=)` checks the per-example axis against the
  parameters' shapes: batch gradients whose leaves share a leading size were
  taken as per-example rows.
"""

import pathlib
import re
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

from dpnmt import core
from dpnmt.core import dp_step

ROOT = pathlib.Path(__file__).resolve().parents[2]
BASE = jax.random.key(7)


def _data(num_rows):
    return {
        "x": jnp.arange(num_rows * 3, dtype=jnp.float32).reshape(num_rows, 3),
        "y": jnp.arange(num_rows, dtype=jnp.int32),
    }


class GatherTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_gather_gives_each_microbatch_its_rows(self):
        data = _data(100)

        def rows(key):
            lot = core.poisson_lot(key, 100, 0.2, microbatch_size=8, max_microbatches=6)
            return lot, [lot.gather(data, k) for k in range(6)]

        lot, gathered = self.variant(rows)(jax.random.key(1))
        for k in range(6):
            want = jax.tree.map(lambda leaf, k=k: leaf[lot.indices[k]], data)
            chex.assert_trees_all_equal(gathered[k], want)

    def test_a_traced_microbatch_index_works_in_a_loop(self):
        data = _data(40)
        lot = core.poisson_lot(jax.random.key(2), 40, 0.5, microbatch_size=4, max_microbatches=10)

        @jax.jit
        def total(lot):
            def body(k, acc):
                return acc + jnp.sum(lot.gather(data, k)["y"] * lot.mask[k])

            return jax.lax.fori_loop(0, lot.num_microbatches, body, 0.0)

        real = np.asarray(lot.indices)[np.asarray(lot.mask) == 1]
        self.assertEqual(float(total(lot)), float(real.sum()))

    def test_data_of_another_size_is_refused_before_any_gather(self):
        lot = core.poisson_lot(jax.random.key(3), 100, 0.2, microbatch_size=8, max_microbatches=6)
        with self.assertRaisesRegex(
            ValueError, "drawn for num_examples = 100 but examples has 50 rows"
        ):
            lot.gather(_data(50), 0)
        with self.assertRaisesRegex(ValueError, "same leading"):
            lot.gather({"x": jnp.zeros((100, 2)), "y": jnp.zeros(99)}, 0)
        with self.assertRaisesRegex(ValueError, "micro-batch index 6 is outside"):
            lot.gather(_data(100), 6)
        with self.assertRaisesRegex(ValueError, r"index must lie in \[0, 2\*\*32\)"):
            lot.gather(_data(100), -1)
        with self.assertRaisesRegex(TypeError, "index must be an integer"):
            lot.gather(_data(100), 1.0)

    def test_an_out_of_range_traced_index_never_copies_a_real_row(self):
        """Traced indices given to `to_microbatches` cannot be checked; a clamping
        gather would turn index 7 of 5 rows into the last row (counted twice)."""
        data = {"x": jnp.arange(5, dtype=jnp.float32)[:, None] + 1.0}
        lot = jax.jit(lambda i: core.to_microbatches(i, jnp.ones(4, bool), 4, 1, num_examples=5))(
            jnp.array([0, 7, 2, 9])
        )
        rows = np.asarray(lot.gather(data, 0)["x"][:, 0])
        np.testing.assert_array_equal(rows[[0, 2]], [1.0, 3.0])
        self.assertTrue(np.all(np.isnan(rows[[1, 3]])), rows)

    def test_a_traced_microbatch_index_past_the_end_never_copies_a_microbatch(self):
        """A clamping gather of micro-batch 7 (or -1) of 3 would repeat micro-batch 2's rows."""
        data = {"x": jnp.arange(6, dtype=jnp.float32)[:, None] + 1.0}
        lot = core.to_microbatches(jnp.arange(6), jnp.ones(6, bool), 2, 3, num_examples=6)
        gather = jax.jit(lambda k: lot.gather(data, k)["x"][:, 0])
        np.testing.assert_array_equal(np.asarray(gather(2)), [5.0, 6.0])
        for past in (3, 7, -1):
            self.assertTrue(np.all(np.isnan(np.asarray(gather(past)))), past)

    def test_examples_and_core_docs_gather_through_the_lot(self):
        """No example or core docs page indexes data with a lot's indices by hand."""
        hand = re.compile(r"\[\s*(lot\.)?indices(\[[^\]]*\])?\s*\]")
        code = {path.name: path.read_text() for path in sorted((ROOT / "examples").glob("*.py"))}
        for path in sorted((ROOT / "docs").glob("core*.md")):
            blocks = re.findall(r"```python\n(.*?)```", path.read_text(), re.S)
            code[path.name] = "\n".join(blocks)
        offenders = [
            f"{name}: {line.strip()}"
            for name, text in code.items()
            for line in text.splitlines()
            if hand.search(line)
        ]
        self.assertEqual(offenders, [])
        for name in ("dp_nnx_lm.py", "core.md"):
            self.assertIn(".gather(", code[name])


class StepKeyTest(parameterized.TestCase):
    @parameterized.parameters(
        (1.5,), (1.0,), (np.float32(2.0),), (np.float64(3.0),), (True,), (np.bool_(False),)
    )
    def test_non_integer_steps_are_refused(self, step):
        with self.assertRaisesRegex(TypeError, "step must be an integer"):
            core.noise_key_for_step(BASE, step)
        with self.assertRaisesRegex(TypeError, "step must be an integer"):
            dp_step.dropout_key(BASE, step, 0)
        with self.assertRaisesRegex(TypeError, "index must be an integer"):
            dp_step.dropout_key(BASE, 0, step)

    def test_a_jax_or_traced_float_step_is_refused(self):
        with self.assertRaisesRegex(TypeError, "step must be an integer"):
            core.noise_key_for_step(BASE, jnp.float32(3.0))
        with self.assertRaisesRegex(TypeError, "step must be an integer"):
            jax.jit(lambda s: core.noise_key_for_step(BASE, s))(1.5)

    @parameterized.parameters((-1,), (2**32,), (np.int64(2**32),), (np.int64(-3),))
    def test_steps_outside_32_bits_are_refused(self, step):
        with self.assertRaisesRegex(ValueError, r"step must lie in \[0, 2\*\*32\)"):
            core.noise_key_for_step(BASE, step)

    def test_integer_steps_concrete_or_traced_give_the_same_key(self):
        def data(key):
            return np.asarray(jax.random.key_data(key))

        want = data(jax.random.fold_in(BASE, 5))
        for step in (5, np.int32(5), np.uint32(5), jnp.int32(5)):
            np.testing.assert_array_equal(data(core.noise_key_for_step(BASE, step)), want)
        traced = jax.jit(lambda s: core.noise_key_for_step(BASE, s))(jnp.int32(5))
        np.testing.assert_array_equal(data(traced), want)
        with self.assertRaisesRegex(ValueError, "scalar"):
            core.noise_key_for_step(BASE, jnp.arange(2))


class FloatNumExamplesTest(parameterized.TestCase):
    def test_an_integral_float_n_is_that_integer(self):
        key = jax.random.key(4)
        want = core.poisson_lot(key, 100, 0.2, microbatch_size=8, max_microbatches=6)
        got = core.poisson_lot(key, 100.0, 0.2, microbatch_size=8.0, max_microbatches=6)
        chex.assert_trees_all_equal(got, want)
        self.assertIs(type(got.num_examples), int)
        np.testing.assert_array_equal(
            core.poisson_mask(key, np.float64(100.0), 0.2), core.poisson_mask(key, 100, 0.2)
        )
        np.testing.assert_array_equal(
            core.shuffled_lots(key, 20.0, 5.0), core.shuffled_lots(key, 20, 5)
        )

    @parameterized.parameters(100.5, "100", -4.0)
    def test_a_non_integral_n_is_refused_naming_it(self, n):
        with self.assertRaisesRegex((ValueError, TypeError), "num_examples must be a positive"):
            core.poisson_lot(jax.random.key(0), n, 0.2, microbatch_size=8, max_microbatches=6)
        with self.assertRaisesRegex((ValueError, TypeError), "num_examples must be a positive"):
            core.shuffled_lots(jax.random.key(0), n, 5)


class PerExampleAxisTest(parameterized.TestCase):
    def setUp(self):
        super().setUp()
        self.params = {"w": jnp.zeros((4, 4)), "b": jnp.zeros((4,))}

    def test_a_batch_gradient_is_refused_when_params_are_given(self):
        """Both leaves lead with 4: without the parameters' shapes this batch
        gradient looked like 4 per-example rows."""
        batch_grad = {"w": jnp.ones((4, 4)), "b": jnp.ones((4,))}
        with self.assertRaisesRegex(ValueError, r"needs a leading per-example axis, \[B, \*\(4,"):
            core.clip_and_sum(batch_grad, l2_clip=1.0, params=self.params)

    def test_per_example_gradients_with_params_equal_the_old_sum(self):
        grads = {"w": jax.random.normal(BASE, (6, 4, 4)), "b": jnp.ones((6, 4))}
        shapes = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), self.params)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            want = core.clip_and_sum(grads, l2_clip=1.0)
        for params in (self.params, shapes):
            chex.assert_trees_all_equal(core.clip_and_sum(grads, l2_clip=1.0, params=params), want)

    def test_without_params_it_warns_that_the_axis_is_unchecked(self):
        grads = {"w": jnp.ones((6, 4, 4))}
        with self.assertWarnsRegex(
            DeprecationWarning, r"dpnmt\.core: clip_and_sum\(\) without params="
        ):
            core.clip_and_sum(grads, l2_clip=1.0)

    def test_add_per_example_grads_checks_the_axis_against_the_lot(self):
        lot = dp_step.init(self.params)
        with self.assertRaisesRegex(ValueError, "leading per-example axis"):
            dp_step.add_per_example_grads(
                lot, {"w": jnp.ones((4, 4)), "b": jnp.ones(4)}, l2_clip=1.0
            )


if __name__ == "__main__":
    absltest.main()
