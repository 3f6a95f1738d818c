"""DP-SGD as optax `GradientTransformation`s over per-example gradients.

For projects that already have an optax chain and compute per-example
gradients themselves:

    tx = optax.chain(dp_aggregate(l2_clip=1.0, noise_multiplier=1.1,
                                  expected_lot_size=256, seed=fresh_seed()),
                     optax.adam(1e-3))
    updates, state = tx.update(per_example_grads, state, params, mask=mask)

One `dp_aggregate` update releases one lot. To build a lot from fixed-shape
micro-batches, use `dp_accumulate_aggregate`: each update adds one masked
micro-batch and only the one with `release=True` noises and releases, so a
lot of any size runs the same compiled program.

Why not `optax.MultiSteps` for Poisson lots: it applies an update after a
FIXED number `every_k_schedule` of micro-steps, while a Poisson lot's number
of micro-batches is random; it averages the micro-steps' updates (dividing by
the realised count), where DP-SGD divides the sum by the fixed expected lot
size L; and wrapped around a noising transformation it noises every
micro-step, adding K times the variance the accountant assumed. Unlike
`optax.contrib.differentially_private_aggregate`, the sums here are divided by
the fixed L, not the realised batch size, as Poisson sampling requires.
"""

from typing import NamedTuple

import chex
import jax
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


def _num_real(per_example_grads: chex.ArrayTree, mask: chex.Array | None) -> chex.Array:
    if mask is None:
        return jnp.asarray(jax.tree_util.tree_leaves(per_example_grads)[0].shape[0], jnp.int32)
    return jnp.sum(jnp.asarray(mask) != 0, dtype=jnp.int32)


class DpAccumulateState(NamedTuple):
    """State of `dp_accumulate_aggregate`.

    Attributes:
      base_key: the run's noise key.
      count: int32 scalar, lots released so far (the step).
      accumulator: the current lot's clipped sum so far. Its `num_examples` is
        private: never log it.
    """

    base_key: chex.PRNGKey
    count: chex.Array
    accumulator: accumulation.AccumulatorState


def dp_accumulate_aggregate(
    l2_clip: float,
    noise_multiplier: float,
    expected_lot_size: float,
    seed: int,
) -> optax.GradientTransformationExtraArgs:
    """Accumulate clipped micro-batches; noise once and divide by L when the lot ends.

    Call `update` once per micro-batch of the lot (the micro-batch shape is
    fixed, their number may vary from lot to lot) with `release=False`, and
    with `release=True` on the lot's last one: that call returns
    `noisy_average` of the lot's accumulated clipped sum with the key
    `noise_key_for_step(key_from_seed(seed), k)` for lot k, and resets the
    accumulator; the other calls return zeros (so a following optimizer must
    only be stepped on release, e.g. apply the updates only then). An empty
    Poisson lot is one call with an all-zero mask and `release=True`: it
    releases noise only, as the accountant assumed a step.

    Formal guarantee: as `noisy_average`, provided each example of the lot
    appears in at most one micro-batch and padding rows have mask 0.

    Args:
      l2_clip: clipping norm C > 0.
      noise_multiplier: σ >= 0.
      expected_lot_size: L, the fixed divisor (q·N under Poisson sampling), > 0.
      seed: integer seed of the noise key sequence; `fresh_seed()` for a release.

    Returns:
      A transformation whose `update(per_example_grads, state, params=None, *,
      mask=None, release)` takes one micro-batch's gradients `[b, ...]`, an
      optional `[b]` mask and a bool scalar `release` (may be traced).
    """
    validation.check_positive("l2_clip", l2_clip)
    validation.check_positive("noise_multiplier", noise_multiplier, allow_zero=True)
    validation.check_positive("expected_lot_size", expected_lot_size)

    def init_fn(params):
        return DpAccumulateState(
            noise.key_from_seed(seed),
            jnp.zeros((), jnp.int32),
            accumulation.init_accumulator(params),
        )

    def update_fn(updates, state, params=None, *, mask=None, release, **extra_args):
        del params, extra_args
        grad_sum, _ = clipping.clip_and_sum(updates, l2_clip, mask)
        lot = accumulation.accumulate(state.accumulator, grad_sum, _num_real(updates, mask))
        empty = accumulation.init_accumulator(lot.grad_sum)

        def emit(lot):
            key = noise.noise_key_for_step(state.base_key, state.count)
            return accumulation.noisy_average(
                lot, key, noise_multiplier, l2_clip, expected_lot_size
            )

        def hold(lot):
            return jax.tree_util.tree_map(jnp.zeros_like, lot.grad_sum)

        release = jnp.asarray(release, bool)
        out = jax.lax.cond(release, emit, hold, lot)
        kept = jax.tree_util.tree_map(lambda e, a: jnp.where(release, e, a), empty, lot)
        count = state.count + release.astype(jnp.int32)
        return out, DpAccumulateState(state.base_key, count, kept)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)
