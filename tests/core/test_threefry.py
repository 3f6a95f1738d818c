"""core.threefry: jax.random's Threefry bits and normals, bit for bit, under jit and vmap."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpnmt.core import threefry

SHAPES = [(), (1,), (7,), (3, 5), (2, 3, 4, 5), (4, 1, 8, 64), (512, 33)]


@pytest.mark.parametrize("shape", SHAPES)
def test_bits_and_normals_equal_jax_random(shape):
    for seed in (0, 1, 2**31 + 5):
        key = jax.random.key(seed)
        bits = jax.jit(threefry.random_bits, static_argnums=1)(key, shape)
        np.testing.assert_array_equal(bits, jax.random.bits(key, shape, jnp.uint32))
        raw = jax.random.key_data(key)
        np.testing.assert_array_equal(threefry.random_bits(raw, shape), bits)
        normal = jax.jit(threefry.normal, static_argnums=1)(key, shape)
        assert normal.dtype == jnp.float32
        np.testing.assert_array_equal(normal, jax.random.normal(key, shape, jnp.float32))


@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_normals_equal_jax_random_for_any_key_words(high, low):
    key = jax.random.wrap_key_data(jnp.array([high, low], jnp.uint32), impl="threefry2x32")
    np.testing.assert_array_equal(
        threefry.normal(key, (64, 3)), jax.random.normal(key, (64, 3), jnp.float32)
    )


def test_per_key_draws_under_vmap():
    keys = jax.random.split(jax.random.key(7), 5)
    ours = jax.vmap(lambda k: threefry.normal(k, (9, 2)))(keys)
    theirs = jax.vmap(lambda k: jax.random.normal(k, (9, 2)))(keys)
    np.testing.assert_array_equal(ours, theirs)


def test_other_keys_are_declined():
    assert threefry.random_bits(jax.random.key(0, impl="rbg"), (4,)) is None
    assert threefry.normal(jax.random.key(0, impl="rbg"), (4,)) is None
    assert threefry.normal(jax.random.split(jax.random.key(0), 2), (4,)) is None  # not one key
    assert threefry.random_bits(jnp.zeros((3,), jnp.uint32), (4,)) is None


def test_normal_moments():
    # 2**20 draws: mean ~ N(0, 2**-20), variance ~ 1 ± sqrt(2 / 2**20) (6 sigma bounds).
    sample = threefry.normal(jax.random.key(11), (1024, 1024))
    assert abs(float(jnp.mean(sample))) < 6 * 2**-10
    assert abs(float(jnp.var(sample)) - 1.0) < 6 * (2 / 2**20) ** 0.5


def test_zero_size_and_too_large_shapes():
    key = jax.random.key(4)
    for shape in [(0,), (3, 0), (0, 5)]:
        np.testing.assert_array_equal(threefry.normal(key, shape), jax.random.normal(key, shape))
    assert threefry.random_bits(key, (2**16, 2**16)) is None  # Declined before allocating.


def test_declines_when_jax_would_draw_otherwise():
    key = jax.random.key(5)
    with jax.threefry_partitionable(False):  # Another counter layout.
        assert threefry.normal(key, (4,)) is None
    raw = jax.random.key_data(key)
    with jax.legacy_prng_key("error"):  # jax refuses raw keys.
        assert threefry.random_bits(raw, (4,)) is None
    with jax.default_prng_impl("rbg"):  # A raw key would be an rbg key.
        assert threefry.random_bits(jnp.zeros((2,), jnp.uint32), (4,)) is None


@pytest.mark.parametrize("size", [0, 1, 2, 7, 1001])
def test_normal_vector_equals_jax_random(size):
    """The two-iteration loop (issue 30 item 3) hashes every index once, odd sizes included."""
    for seed in (0, 2**31 + 5):
        key = jax.random.key(seed)
        ours = jax.jit(threefry.normal_vector, static_argnums=1)(key, size)
        np.testing.assert_array_equal(ours, jax.random.normal(key, (size,), jnp.float32))
        raw = jax.random.key_data(key)
        np.testing.assert_array_equal(threefry.normal_vector(raw, size), ours)
    assert threefry.normal_vector(jax.random.key(0, impl="rbg"), 4) is None
    assert threefry.normal_vector(jax.random.key(0), 2**31) is None  # Declined before allocating.
