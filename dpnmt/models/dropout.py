"""Dropout whose mask is `flax.linen.Dropout`'s, bit for bit, computed without XLA loops.

JAX lowers its Threefry-2x32 hash on CPU as a rolled loop (5 iterations over
the whole mask, each reading and writing every word), which took about a third
of a tiny T5's training step here. This module computes the same hash with
straight-line uint32 arithmetic that XLA fuses into the code around it, for
the same key stream (`make_rng('dropout')`, so per-example keys under `vmap`
are kept) and the same bits as `jax.random.bits` with
`jax_threefry_partitionable` (JAX's default); tests compare masks with
`flax.linen.Dropout`'s. Keys of another PRNG implementation, or with the
partitionable flag off, take flax's own path.
"""

from __future__ import annotations

import math

import chex
import flax.linen as nn
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


def _threefry_key_data(rng: chex.Array) -> chex.Array | None:
    """The uint32 `[2]` words of a Threefry key (typed or raw), else None."""
    if not jax.config.jax_threefry_partitionable:
        return None
    if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
        if str(jax.random.key_impl(rng)) != "threefry2x32":
            return None
        return jax.random.key_data(rng)
    if rng.dtype == jnp.uint32 and rng.shape == (2,):
        return rng
    return None


def random_bits(rng: chex.Array, shape: tuple[int, ...]) -> chex.Array | None:
    """`jax.random.bits(rng, shape, uint32)` for a Threefry key; None for other keys.

    Args:
      rng: a single PRNG key (typed, or raw uint32 `[2]`).
      shape: static output shape, fewer than 2**32 elements.

    Returns:
      uint32 array of `shape`, or None when `rng` is not a Threefry key.
    """
    words = _threefry_key_data(rng)
    size = math.prod(shape)
    if words is None or size >= 2**32:
        return None
    counter = lax.iota(np.uint32, size).reshape(shape)
    high, low = threefry2x32(words, jnp.zeros(shape, np.uint32), counter)
    return high ^ low


def keep_mask(rng: chex.Array, keep_prob: float, shape: tuple[int, ...]) -> chex.Array:
    """`jax.random.bernoulli(rng, keep_prob, shape)`: boolean mask of `shape`."""
    bits = random_bits(rng, shape)
    if bits is None:
        return jax.random.bernoulli(rng, p=keep_prob, shape=shape)
    # bernoulli keeps where uniform = (bits >> 9) * 2**-23 < float32(keep_prob):
    # the same test on the integer mantissa.
    threshold = math.ceil(float(np.float32(keep_prob)) * 2**23)
    return lax.shift_right_logical(bits, np.uint32(9)) < np.uint32(threshold)


class Dropout(nn.Module):
    """`flax.linen.Dropout` (same fields, same rng stream, same masks), faster on CPU.

    Attributes:
      rate: probability of dropping an element.
      broadcast_dims: axes along which the mask is shared.
      deterministic: if True, returns the inputs unchanged.
      rng_collection: the rng stream the mask's key is drawn from.
    """

    rate: float
    broadcast_dims: tuple[int, ...] = ()
    deterministic: bool | None = None
    rng_collection: str = "dropout"

    @nn.compact
    def __call__(
        self, inputs: chex.Array, deterministic: bool | None = None, rng: chex.Array | None = None
    ) -> chex.Array:
        """Masks `inputs` (any shape) and scales what is kept by 1 / (1 - rate)."""
        deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
        if self.rate == 0.0 or deterministic:
            return inputs
        if self.rate == 1.0:
            return jnp.zeros_like(inputs)
        keep_prob = 1.0 - self.rate
        if rng is None:
            rng = self.make_rng(self.rng_collection)
        shared = {dim % inputs.ndim for dim in self.broadcast_dims}
        shape = tuple(1 if i in shared else d for i, d in enumerate(inputs.shape))
        mask = jnp.broadcast_to(keep_mask(rng, keep_prob, shape), inputs.shape)
        return lax.select(mask, inputs / keep_prob, jnp.zeros_like(inputs))
