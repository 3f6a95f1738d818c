"""Dropout whose mask bits come from Philox, a counter-based generator XLA fuses on CPU.

`flax.linen.Dropout` draws its mask from the rng's own generator, by default
Threefry, which JAX lowers on CPU as a rolled loop: every dropout site then
runs a `while` over its whole mask and keeps the raw bits alive from the
forward to the backward pass (the t5-small-sized step of `benchmarks/dp_step`
held about 0.36 GiB more XLA temporary memory). Philox4x32 is lowered
unrolled, so the mask fuses into the elementwise code around it. The key is
the same per-site, per-example flax rng, reinterpreted: masks stay independent
across sites and examples, with the same keep probability. Dropout is no part
of the privacy analysis (noise keys are separate).
"""

from __future__ import annotations

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

_PHILOX = "philox4x32"


def _philox_key(rng: chex.Array) -> chex.Array:
    """The Philox key with the bits of a Threefry key (other generators: `rng` itself)."""
    if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
        if str(jax.random.key_impl(rng)) != "threefry2x32":
            return rng
        data = jax.random.key_data(rng)
    elif rng.shape != (2,):
        return rng  # A raw key of another generator (jax_default_prng_impl).
    else:
        data = rng  # A raw uint32[2] Threefry key.
    return jax.random.wrap_key_data(data, impl=_PHILOX)


class Dropout(nn.Module):
    """Inverted dropout (`flax.linen.Dropout` without `broadcast_dims`), Philox bits.

    Attributes:
        rate: Probability of zeroing an element.
    """

    rate: float

    @nn.compact
    def __call__(self, inputs: chex.Array, deterministic: bool) -> chex.Array:
        """`inputs` with elements zeroed at `rate` and the rest scaled by 1/(1 - rate).

        Args:
            inputs: Any shape.
            deterministic: Returns `inputs` unchanged when True; otherwise needs
                a 'dropout' rng.
        """
        if self.rate == 0.0 or deterministic:
            return inputs
        keep = 1.0 - self.rate
        if keep == 0.0:
            return jnp.zeros_like(inputs)
        mask = jax.random.bernoulli(_philox_key(self.make_rng("dropout")), keep, inputs.shape)
        return jax.lax.select(mask, inputs / keep, jnp.zeros_like(inputs))
