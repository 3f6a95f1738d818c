"""The models' Philox dropout keeps flax's semantics: rate, scaling, keys, determinism."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpnmt.models.dropout import Dropout


def _apply(rate, x, key, deterministic=False):
    return Dropout(rate).apply({}, x, deterministic, rngs={"dropout": key})


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_drops_at_rate_and_scales_the_kept(rate):
    n = 200_000
    out = np.asarray(_apply(rate, jnp.ones((n,)), jax.random.key(0)))
    kept = out != 0
    np.testing.assert_allclose(out[kept], 1.0 / (1.0 - rate), rtol=1e-6)
    # Kept count ~ Binomial(n, 1 - rate): 5 standard deviations.
    sd = math.sqrt(n * rate * (1 - rate))
    assert abs(kept.sum() - n * (1 - rate)) < 5 * sd


def test_masks_depend_on_the_key_only_and_keys_of_either_kind_work():
    x = jnp.ones((4096,))
    a = _apply(0.5, x, jax.random.key(1))
    np.testing.assert_array_equal(a, _apply(0.5, x, jax.random.key(1)))
    np.testing.assert_array_equal(a, _apply(0.5, x, jax.random.PRNGKey(1)))
    b = _apply(0.5, x, jax.random.key(2))
    # Independent masks agree on about half the elements (5 sd of Binomial(4096, 1/2)).
    assert abs(int(jnp.sum((a != 0) == (b != 0))) - 2048) < 5 * 32


def test_per_example_keys_under_vmap_give_independent_masks():
    keys = jax.random.split(jax.random.key(3), 2)
    out = jax.vmap(lambda k: _apply(0.5, jnp.ones((4096,)), k))(keys)
    assert abs(int(jnp.sum((out[0] != 0) == (out[1] != 0))) - 2048) < 5 * 32


def test_deterministic_and_zero_rate_are_the_identity():
    x = jax.random.normal(jax.random.key(4), (8, 16))
    np.testing.assert_array_equal(_apply(0.5, x, jax.random.key(5), deterministic=True), x)
    np.testing.assert_array_equal(Dropout(0.0).apply({}, x, False), x)
