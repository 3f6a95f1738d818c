"""dpnmt's Dropout draws flax.linen.Dropout's masks, bit for bit, from the same keys."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpnmt.models import dropout


def test_other_key_implementations_take_jax_random():
    key = jax.random.key(0, impl="rbg")
    mask = dropout.keep_mask(key, 0.9, (64, 64))
    np.testing.assert_array_equal(mask, jax.random.bernoulli(key, 0.9, (64, 64)))


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.3, 1e-7, 0.999])
@pytest.mark.parametrize("broadcast_dims", [(), (0,), (-1,), (1, 2)])
def test_masks_equal_flax_dropout_under_vmap(rate, broadcast_dims):
    x = jax.random.normal(jax.random.key(1), (6, 5, 8, 16)) + 3.0  # no zeros in the input
    keys = jax.random.split(jax.random.key(2), x.shape[0])

    def apply(module_cls):
        module = module_cls(rate, broadcast_dims=broadcast_dims)

        def one(row, key):
            return module.apply({}, row, deterministic=False, rngs={"dropout": key})

        return jax.jit(jax.vmap(one))(x, keys)

    ours, theirs = apply(dropout.Dropout), apply(nn.Dropout)
    np.testing.assert_array_equal(ours, theirs)
    if rate < 0.5:  # The mask is not trivial: something is kept and, at 0.1+, dropped.
        assert jnp.any(ours != 0)
    if rate >= 0.1:
        assert jnp.any(ours == 0)


def test_deterministic_and_extreme_rates():
    x = jnp.arange(1.0, 9.0)
    key = jax.random.key(0)
    kept = dropout.Dropout(0.5).apply({}, x, deterministic=True)
    np.testing.assert_array_equal(kept, x)
    zero = dropout.Dropout(0.0).apply({}, x, deterministic=False, rngs={"dropout": key})
    np.testing.assert_array_equal(zero, x)
    gone = dropout.Dropout(1.0).apply({}, x, deterministic=False, rngs={"dropout": key})
    np.testing.assert_array_equal(gone, jnp.zeros_like(x))


def test_keep_fraction_matches_rate():
    # 2**20 Bernoulli(0.9) draws: the standard deviation of the kept fraction is 3e-4.
    mask = dropout.keep_mask(jax.random.key(3), 0.9, (1024, 1024))
    assert abs(float(jnp.mean(mask)) - 0.9) < 6 * (0.9 * 0.1 / 2**20) ** 0.5


def test_threshold_agrees_with_bernoulli_on_every_mantissa(monkeypatch):
    # Random masks would miss an off-by-one in the threshold (probability 2**-23
    # per element): feed every 23-bit mantissa through keep_mask instead.
    mantissas = np.arange(2**23, dtype=np.uint32)
    monkeypatch.setattr(
        dropout.threefry, "random_bits", lambda rng, shape: jnp.asarray(mantissas << 9)
    )
    uniform = mantissas.astype(np.float64) * 2.0**-23  # What bernoulli compares, exactly.
    for keep_prob in (0.9, 0.5, 0.7, 1 - 1e-7, 1e-7, 0.3, 2.0**-23, 1 - 2.0**-24):
        mask = np.asarray(dropout.keep_mask(jax.random.key(0), keep_prob, mantissas.shape))
        np.testing.assert_array_equal(mask, uniform < np.float32(keep_prob))


def test_x64_masks_equal_flax():
    # With x64, flax's bernoulli samples a float64 uniform: keep_mask must follow it.
    with jax.enable_x64(True):
        x = jnp.ones((64, 64), jnp.float32)
        rngs = {"dropout": jax.random.key(6)}
        ours = dropout.Dropout(0.3).apply({}, x, deterministic=False, rngs=rngs)
        theirs = nn.Dropout(0.3).apply({}, x, deterministic=False, rngs=rngs)
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize(
    "rate, dims, match", [(1.5, (), "rate"), (-0.1, (), "rate"), (0.1, (2,), "broadcast_dims")]
)
def test_invalid_rate_or_broadcast_dims_are_refused(rate, dims, match):
    module = dropout.Dropout(rate, broadcast_dims=dims)
    with pytest.raises(ValueError, match=match):
        module.apply({}, jnp.ones((3, 4)), deterministic=False, rngs={"dropout": jax.random.key(0)})
