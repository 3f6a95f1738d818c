"""Gradient accumulation over micro-batches, then one noisy release per lot.

A lot (the examples Poisson sampling picked for one step) is processed as
several fixed-shape micro-batches. Each contributes its clipped sum to an
`AccumulatorState`; `noisy_average` then adds N(0, σ²C²) ONCE to the
accumulated sum and divides by the fixed expected lot size L (Abadi et al.
2016, Algorithm 1). Dividing by the realised lot size instead would make the
update depend on a private count; noising per micro-batch would add K times
the variance the accountant assumed.
"""

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from dpnmt.core import deprecation, noise, validation


class AccumulatorState(NamedTuple):
    """Running sums over the micro-batches of one lot.

    Attributes:
      grad_sum: pytree like `params`, sum of clipped per-example gradients.
      num_examples: int32 scalar, real examples accumulated. Private (it is the
        realised lot size): never log it or use it to normalise the update.
    """

    grad_sum: chex.ArrayTree
    num_examples: chex.Array


def init_accumulator(params: chex.ArrayTree) -> AccumulatorState:
    """An empty accumulator: zeros shaped like `params`, zero examples.

    Args:
      params: pytree of (trainable) parameters.

    Returns:
      `AccumulatorState` with zeros shaped like each parameter, in float32 (or
      wider): low-precision sums would break the sensitivity bound C.
    """
    return AccumulatorState(
        grad_sum=jax.tree_util.tree_map(
            lambda p: jnp.zeros(jnp.shape(p), jnp.promote_types(jnp.result_type(p), jnp.float32)),
            params,
        ),
        num_examples=jnp.zeros((), jnp.int32),
    )


def accumulate(state: AccumulatorState, grad_sum: chex.ArrayTree, num_examples) -> AccumulatorState:
    """Adds one micro-batch's clipped gradient sum to the accumulator.

    Args:
      state: the lot's accumulator so far.
      grad_sum: clipped gradient sum of the micro-batch (structure of params).
      num_examples: real (unmasked) examples in the micro-batch, int scalar.

    Returns:
      The updated `AccumulatorState`.
    """
    return AccumulatorState(
        grad_sum=jax.tree_util.tree_map(jnp.add, state.grad_sum, grad_sum),
        num_examples=state.num_examples + jnp.asarray(num_examples, jnp.int32),
    )


@deprecation.deprecated_arguments(
    renamed={"key": "noise_key"},
    positional=("noise_multiplier", "l2_clip", "expected_lot_size"),
)
def noisy_average(
    state: AccumulatorState,
    noise_key: chex.PRNGKey,
    *,
    l2_clip: float,
    noise_multiplier: float,
    expected_lot_size: float,
    noise_mode: str = noise.FLOAT,
) -> chex.ArrayTree:
    """Releases the lot's gradient: (sum + N(0, (σC)²)) / L.

    Noise is drawn once per call, on the accumulated sum. Call it once per lot,
    also for an empty lot (zero micro-batches): the accountant assumed a step.

    Formal guarantee: if every accumulated micro-batch sum has L2 sensitivity
    C to adding/removing one example and each example appears in at most one
    micro-batch of the lot, the release is the Gaussian mechanism with noise
    multiplier σ (sensitivity C, stddev σC); division by the public constant L
    is post-processing.

    Args:
      state: accumulator of the whole lot.
      noise_key: noise key of this step (`noise_key_for_step`); never reuse it.
      l2_clip: the clipping norm C used for every micro-batch, > 0.
      noise_multiplier: σ >= 0. σ = 0 gives no privacy (non-private baselines
        only); the accountant refuses to report an ε for it.
      expected_lot_size: L = q·N, the public constant divisor, > 0.
      noise_mode: "float" (default: float32 Gaussian draws; the raw noisy sum
        is exposed to floating-point attacks, see `noise.add_gaussian_noise`) or
        "secure" (a discrete Gaussian on a grid with sensitivity C, noise at
        most 0.4 % larger: `core.secure_noise` states its guarantee).

    σ, C and L must be concrete numbers (Python, NumPy or concrete JAX
    scalars): under `jax.jit` close over them or mark them static; traced
    values cannot be checked and are refused with a TypeError.

    Returns:
      Pytree like `state.grad_sum`: the noisy average gradient.
    """
    noise_multiplier = validation.check_positive(
        "noise_multiplier", noise_multiplier, allow_zero=True
    )
    l2_clip = validation.check_positive("l2_clip", l2_clip)
    expected_lot_size = validation.check_positive("expected_lot_size", expected_lot_size)
    noisy_sum = noise.add_gaussian_noise(
        state.grad_sum,
        noise_multiplier * l2_clip,
        noise_key,
        noise_mode=noise_mode,
        l2_sensitivity=l2_clip,
    )
    return jax.tree_util.tree_map(lambda g: g / expected_lot_size, noisy_sum)
