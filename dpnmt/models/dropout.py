"""Dropout whose mask is `flax.linen.Dropout`'s, bit for bit, computed without XLA loops.

JAX lowers its Threefry-2x32 hash on CPU as a rolled loop, which took about a
third of a tiny T5's training step here. The mask's bits come from
`dpnmt.core.threefry` (the same hash, unrolled, fused by XLA into the code
around it) for the same key stream (`make_rng('dropout')`, so per-example keys
under `vmap` are kept); tests compare masks with `flax.linen.Dropout`'s. Keys
of another PRNG implementation take flax's own path (`jax.random.bernoulli`).
"""

from __future__ import annotations

import math

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from dpnmt.core import threefry


def keep_mask(rng: chex.Array, keep_prob: float, shape: tuple[int, ...]) -> chex.Array:
    """`jax.random.bernoulli(rng, keep_prob, shape)`: boolean mask of `shape`."""
    # flax passes a Python float, which x64 mode samples as float64 from 64 bits.
    bits = None if jax.config.jax_enable_x64 else threefry.random_bits(rng, shape)
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
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"Dropout rate must be in [0, 1], got {self.rate}.")
        for dim in self.broadcast_dims:
            if not -inputs.ndim <= dim < inputs.ndim:
                raise ValueError(
                    f"Dropout broadcast_dims {self.broadcast_dims} out of range for an input "
                    f"of rank {inputs.ndim}."
                )
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
