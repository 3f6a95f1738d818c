"""DP-SGD as an optax `GradientTransformation` over per-example gradients.

For projects that already have an optax chain and compute per-example
gradients themselves:

    tx = optax.chain(dp_aggregate(l2_clip=1.0, noise_multiplier=1.1,
                                  expected_lot_size=256, seed=fresh_seed()),
                     optax.adam(1e-3))
    updates, state = tx.update(per_example_grads, state, params, mask=mask)

One `update` call releases one lot. Do not wrap it in `optax.MultiSteps`
(that would noise every micro-batch); to build a lot from micro-batches use
`init_accumulator`/`accumulate`/`noisy_average` instead. Unlike
`optax.contrib.differentially_private_aggregate`, the sum is divided by the
fixed expected lot size, not the realised batch size, as Poisson sampling
requires.
"""

from typing import NamedTuple

import chex
import jax.numpy as jnp
import optax

from dpnmt.core import accumulation, clipping, noise, validation


class DpAggregateState(NamedTuple):
    """State of `dp_aggregate`: the run's noise key and the number of lots released."""

    base_key: chex.PRNGKey
    count: chex.Array  # int32 scalar: lots released so far (the step).


def dp_aggregate(
    l2_clip: float,
    noise_multiplier: float,
    expected_lot_size: float,
    seed: int,
) -> optax.GradientTransformationExtraArgs:
    """Clip per-example gradients, sum, add N(0, σ²C²) once, divide by L.

    Args:
      l2_clip: clipping norm C > 0.
      noise_multiplier: σ >= 0.
      expected_lot_size: L, the fixed divisor (q·N under Poisson sampling), > 0.
      seed: integer seed of the noise key sequence. The key of release k is
        `noise_key_for_step(key_from_seed(seed), k)`, so restoring the state resumes
        the sequence. Use `fresh_seed()` for a release run.

    Returns:
      A transformation whose `update(per_example_grads, state, params=None,
      mask=None)` takes gradients with a leading batch axis `[B, ...]` and an
      optional `[B]` mask, and returns the noisy average gradient.
    """
    validation.check_positive("l2_clip", l2_clip)
    validation.check_positive("noise_multiplier", noise_multiplier, allow_zero=True)
    validation.check_positive("expected_lot_size", expected_lot_size)

    def init_fn(params):
        del params
        return DpAggregateState(noise.key_from_seed(seed), jnp.zeros((), jnp.int32))

    def update_fn(updates, state, params=None, *, mask=None, **extra_args):
        del params, extra_args
        grad_sum, _ = clipping.clip_and_sum(updates, l2_clip, mask)
        lot = accumulation.AccumulatorState(grad_sum, jnp.zeros((), jnp.int32))
        step_key = noise.noise_key_for_step(state.base_key, state.count)
        noisy = accumulation.noisy_average(
            lot, step_key, noise_multiplier, l2_clip, expected_lot_size
        )
        return noisy, DpAggregateState(state.base_key, state.count + 1)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)
