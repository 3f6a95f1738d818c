"""`jax.random.bits` and `jax.random.normal` for Threefry keys, bit for bit, hash unrolled.

JAX lowers its Threefry-2x32 hash on CPU as a rolled loop (5 iterations, each
reading and writing every word of the output), which made the Gaussian noise
of a t5-small-sized model (60M draws) take about 0.7 s here, and the dropout
masks a third of a tiny T5's training step. The functions below compute the
same hash with straight-line uint32 arithmetic that XLA fuses into the code
around it. For a Threefry key and `jax_threefry_partitionable` on (JAX's
default) they return exactly what `jax.random.bits` / `jax.random.normal`
return (tests compare them bit for bit): the noise distribution, and every
argument made about it, is JAX's. For other keys they return None, and
callers use `jax.random`.
"""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

# Threefry-2x32, 20 rounds (Salmon et al. 2011, "Parallel random numbers: as
# easy as 1, 2, 3"): rotation constants of the two alternating round groups and
# the key-schedule parity constant.
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def _rotate_left(x: chex.Array, bits: int) -> chex.Array:
    return lax.shift_left(x, np.uint32(bits)) | lax.shift_right_logical(x, np.uint32(32 - bits))


def threefry2x32(key: chex.Array, x0: chex.Array, x1: chex.Array) -> tuple[chex.Array, chex.Array]:
    """The Threefry-2x32 block function, unrolled.

    Args:
      key: uint32 `[2]` key words.
      x0: uint32 first counter words, any shape.
      x1: uint32 second counter words, shaped as `x0`.

    Returns:
      The two uint32 output words, shaped as the counters.
    """
    schedule = (key[0], key[1], key[0] ^ key[1] ^ _PARITY)
    x0, x1 = x0 + schedule[0], x1 + schedule[1]
    for group in range(5):
        for rotation in _ROTATIONS[group % 2]:
            x0 = x0 + x1
            x1 = _rotate_left(x1, rotation) ^ x0
        x0 = x0 + schedule[(group + 1) % 3]
        x1 = x1 + schedule[(group + 2) % 3] + np.uint32(group + 1)
    return x0, x1


def _key_words(key: chex.Array) -> chex.Array | None:
    """The uint32 `[2]` words of a single Threefry key (typed or raw), else None."""
    if not jax.config.jax_threefry_partitionable:
        return None
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != () or str(jax.random.key_impl(key)) != "threefry2x32":
            return None
        return jax.random.key_data(key)
    # A raw key means the default implementation, as in jax.random.
    default_is_threefry = jax.config.jax_default_prng_impl == "threefry2x32"
    if key.dtype == jnp.uint32 and key.shape == (2,) and default_is_threefry:
        if jax.config.jax_legacy_prng_key != "error":
            return key
    return None


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(math.prod(shape[axis + 1 :]) for axis in range(len(shape)))


def random_bits(key: chex.Array, shape: tuple[int, ...]) -> chex.Array | None:
    """`jax.random.bits(key, shape, jnp.uint32)`, or None if `key` is not a Threefry key.

    Args:
      key: one PRNG key, typed or raw uint32 `[2]`.
      shape: static output shape, fewer than 2**32 elements.

    Returns:
      uint32 array of `shape`, or None.
    """
    words = _key_words(key)
    size = math.prod(shape)
    if words is None or size >= 2**32:
        return None
    # jax's partitionable Threefry hashes the 64-bit element index (high, low
    # words) and XORs the two output words.
    counter = jnp.zeros(shape, np.uint32)  # Row-major element index, as SPMD-partitionable iotas.
    for axis, stride in enumerate(_strides(shape)):
        counter = counter + lax.broadcasted_iota(np.uint32, shape, axis) * np.uint32(stride)
    high, low = threefry2x32(words, jnp.zeros(shape, np.uint32), counter)
    return high ^ low


def normal(key: chex.Array, shape: tuple[int, ...]) -> chex.Array | None:
    """`jax.random.normal(key, shape, jnp.float32)`, or None if `key` is not a Threefry key.

    The same transform as JAX: 23 random mantissa bits give u uniform on
    [nextafter(-1, 0), 1), and the sample is sqrt(2) erfinv(u).

    Args:
      key: one PRNG key, typed or raw uint32 `[2]`.
      shape: static output shape.

    Returns:
      float32 array of `shape`, or None.
    """
    bits = random_bits(key, shape)
    return None if bits is None else _normal_from_bits(bits)


def normal_vector(key: chex.Array, size: int) -> chex.Array | None:
    """`jax.random.normal(key, (size,), jnp.float32)`, computed once however it is sliced.

    The same values as `normal(key, (size,))`, from a loop of two iterations, each
    hashing half the indices. XLA copies a straight-line hash into the fusion of
    every consumer, so a vector sliced into n pieces compiled n hashes; a loop's
    result is stored once, so one hash is compiled and the slices read it.

    Args:
      key: one PRNG key, typed or raw uint32 `[2]`.
      size: static number of draws.

    Returns:
      float32 array `[size]`, or None if `key` is not a Threefry key or `size`
      is 2**31 or more (the loop's int32 offsets).
    """
    words = _key_words(key)
    if words is None or size >= 2**31:
        return None
    half = -(-size // 2)

    def draw_half(i, out):
        counter = lax.iota(np.uint32, half) + i.astype(np.uint32) * np.uint32(half)
        high, low = threefry2x32(words, jnp.zeros_like(counter), counter)
        return lax.dynamic_update_slice(out, _normal_from_bits(high ^ low), (i * half,))

    out = lax.fori_loop(0, 2, draw_half, jnp.zeros((2 * half,), jnp.float32))
    return out[:size]


def _normal_from_bits(bits: chex.Array) -> chex.Array:
    """JAX's float32 normal from uint32 words: sqrt(2) erfinv(u), u from 23 mantissa bits."""
    one = np.float32(1.0)
    mantissa = lax.shift_right_logical(bits, np.uint32(9)) | np.array(one).view(np.uint32)
    floats = lax.bitcast_convert_type(mantissa, jnp.float32) - one
    low = np.nextafter(np.float32(-1.0), np.float32(0.0))
    uniform = lax.max(low, floats * (one - low) + low)
    return np.float32(np.sqrt(2)) * lax.erf_inv(uniform)
