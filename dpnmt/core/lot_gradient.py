"""One private gradient per lot from fixed-shape micro-batches, in one compiled program.

A view of the core's one lot step (`dpnmt.core.dp_step`): `init`, `add_microbatch`
per micro-batch in a `while_loop`, `release`.
"""

from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp

from dpnmt.core import deprecation, dp_step, sampling


@deprecation.deprecated_arguments(
    renamed={"key": "noise_key", "clipping_method": "clipping", "example_key": "dropout_key"}
)
def private_lot_gradient(
    loss_fn: Callable[..., chex.Array],
    params: chex.ArrayTree,
    examples: Any,
    lot: sampling.MicroBatches,
    noise_key: chex.PRNGKey,
    *,
    l2_clip: float,
    noise_multiplier: float,
    expected_lot_size: float,
    clipping: str = "auto",
    dropout_key: chex.PRNGKey | None = None,
    noise_mode: str = "float",
) -> chex.ArrayTree:
    """Clips and sums a lot micro-batch by micro-batch, then noises once and divides by L.

    A `lax.while_loop` runs `dp_step.add_microbatch` over the lot's first
    `lot.num_microbatches` micro-batches (the rest are all padding and are
    skipped), gathering each one's rows from `examples`; then `dp_step.release`
    adds N(0, σ²C²) once and divides by L. Under `jax.jit` a lot of any size
    runs the same program: only the loop's trip count depends on it.

    Formal guarantee: that of `noisy_average`, for a lot from `poisson_lot`
    or `shuffled_lots` (each example at most once, padding masked). A lot that
    overflowed its capacity (`lot.overflow`, from `on_overflow="flag"`) was
    truncated: it is neither Poisson nor of sensitivity C, so its gradient is
    all NaN, never a releasable value (choose `lot_capacity` so that overflow
    has probability far below δ).

    Args:
      loss_fn: `loss_fn(params, example) -> scalar` for ONE example.
      params: trainable parameters.
      examples: pytree of the whole data set, every leaf `[N, ...]` with N =
        `lot.num_examples`.
      lot: the lot's `MicroBatches` (indices and mask `[K, b]`).
      noise_key: this step's noise key (`noise_key_for_step`); never reuse it.
      l2_clip: clipping norm C > 0.
      noise_multiplier: σ >= 0.
      expected_lot_size: L = q·N, the fixed divisor.
      clipping: `"auto"` (default), `"ghost"` or `"vmap"` (see `private_grad_sum`).
      dropout_key: optional key for the loss (e.g. dropout); micro-batch k gets
        `fold_in(dropout_key, k)`, passed as `private_grad_sum`'s `dropout_key`, and
        `loss_fn` is then called as `loss_fn(params, example, key)`. Use a new
        one every step; never the noise key.
      noise_mode: "float" or "secure" (see `noisy_average`).

    Returns:
      Pytree like `params`: the noisy average gradient of the lot (NaN if the
      lot overflowed).

    Raises:
      ValueError: the leaves of `examples` differ in their leading axis, or it
        is not the N the lot was drawn for (`lot.num_examples`): JAX clamps
        out-of-range indices, so a lot drawn for a larger N would count the
        last row many times (sensitivity far above C).
    """

    def body(k, lot_state):
        rows = lot.gather(examples, k)  # Refuses data of another N while tracing.
        key_k = None if dropout_key is None else jax.random.fold_in(dropout_key, k)
        lot_state, _ = dp_step.add_microbatch(
            lot_state,
            loss_fn,
            params,
            rows,
            lot.mask[k],
            l2_clip=l2_clip,
            dropout_key=key_k,
            clipping=clipping,
        )
        return lot_state

    lot_state = jax.lax.fori_loop(0, lot.num_microbatches, body, dp_step.init(params))
    grad = dp_step.release(
        lot_state,
        noise_key,
        noise_multiplier=noise_multiplier,
        l2_clip=l2_clip,
        expected_lot_size=expected_lot_size,
        noise_mode=noise_mode,
    )
    return jax.tree_util.tree_map(lambda g: jnp.where(lot.overflow, jnp.nan, g), grad)
