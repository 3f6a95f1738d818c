"""The DP lot gradient under `data` sharding: clip, sum, accumulate, noise once, average.

Global-view `jax.jit`: micro-batches are sharded `P('data')`; params, the
accumulator and the noise key are replicated. The batch-axis sum of clipped
gradients makes XLA all-reduce across devices, so the accumulator holds the
global sum and `noisy_average` draws the noise once, on that replicated sum,
from a replicated key: the same noise, and the same update, as on one device
(never one draw per device, which would give σC√D).
"""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import chex
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from dpnmt import core
from dpnmt.bridge.microbatch import EXAMPLE_INDEX, MASK
from dpnmt.bridge.sharding import batch_sharding, replicated_sharding


@dataclasses.dataclass(frozen=True)
class DpLotStep:
    """Jitted, sharded pieces of one DP-SGD lot gradient.

    Attributes:
      add_microbatch: `(state, params, microbatch) -> (state, mean_loss)`: adds
        the clipped gradient sum of one sharded micro-batch (with `mask`) to the
        accumulator. `mean_loss` is over the micro-batch's real rows (private).
      release: `(state, key) -> noisy mean gradient` (structure of params):
        `(sum + N(0, (σC)²)) / L`, noise drawn once.
    """

    add_microbatch: Callable[..., tuple[core.AccumulatorState, jax.Array]]
    release: Callable[[core.AccumulatorState, chex.PRNGKey], chex.ArrayTree]


def make_dp_lot_step(
    loss_fn: Callable[[chex.ArrayTree, Any], chex.Array],
    mesh: Mesh,
    *,
    l2_clip: float,
    noise_multiplier: float,
    expected_lot_size: int,
) -> DpLotStep:
    """Builds the jitted micro-batch and release functions for `mesh`.

    Args:
      loss_fn: `loss_fn(params, example) -> scalar` for ONE example (a dict of
        the micro-batch fields without the batch axis; `mask` and
        `example_index` are removed).
      mesh: the data mesh (`make_data_mesh`).
      l2_clip: clipping norm C > 0.
      noise_multiplier: σ >= 0.
      expected_lot_size: L, the constant divisor (the lot source's
        `expected_lot_size`).

    Returns:
      A `DpLotStep`; compiled once per micro-batch shape.
    """
    replicated = replicated_sharding(mesh)
    data = batch_sharding(mesh)

    def add_microbatch(state, params, microbatch):
        mask = microbatch[MASK]
        batch = {k: v for k, v in microbatch.items() if k not in (MASK, EXAMPLE_INDEX)}
        grad_sum, _, mean_loss = core.private_grad_sum(loss_fn, params, batch, mask, l2_clip)
        num_examples = jnp.sum(mask != 0, dtype=jnp.int32)
        return core.accumulate(state, grad_sum, num_examples), mean_loss

    def release(state, key):
        return core.noisy_average(state, key, noise_multiplier, l2_clip, expected_lot_size)

    return DpLotStep(
        add_microbatch=jax.jit(
            add_microbatch,
            in_shardings=(replicated, replicated, data),
            out_shardings=(replicated, replicated),
            donate_argnums=0,
        ),
        release=jax.jit(release, in_shardings=(replicated, replicated), out_shardings=replicated),
    )


def dp_lot_gradient(
    step: DpLotStep,
    params: chex.ArrayTree,
    microbatches: Sequence[dict[str, jax.Array]],
    key: chex.PRNGKey,
) -> chex.ArrayTree:
    """The noisy mean gradient of one lot (any number of micro-batches, even 0).

    Args:
      step: from `make_dp_lot_step`.
      params: replicated parameters.
      microbatches: the lot's sharded micro-batches (`shard_microbatch`); an
        empty lot has none and still gets a (noise-only) gradient.
      key: this step's noise key; never reuse it.

    Returns:
      Pytree like `params`: `(Σ clipped grads + N(0, (σC)²)) / L`.
    """
    state = core.init_accumulator(params)
    for microbatch in microbatches:
        state, _ = step.add_microbatch(state, params, microbatch)
    return step.release(state, key)
