"""The one DP-SGD lot step: clipped micro-batches in, one noisy release per lot, an update.

Every DP update in dpnmt goes through these pure functions: the trainer
(`dpnmt.training.steps.make_lot_step`), `private_lot_gradient` and the optax
forms (`dp_accumulate_aggregate`, `dp_multi_steps`) are thin users of them.

    lot = dp_step.init(params)                           # PRIVATE until released
    for k, (batch, mask) in enumerate(micro_batches):    # any number, even 0
        lot, _ = dp_step.add_microbatch(lot, loss_fn, params, batch, mask,
                                        l2_clip=C, dropout_key=dropout_key(base, t, k))
    state = dp_step.apply_lot(state, lot, noise_base, tx=tx, l2_clip=C,
                              noise_multiplier=σ, expected_lot_size=L)

`release` adds N(0, σ²C²) ONCE to the lot's sum of clipped per-example
gradients and divides by the fixed expected lot size L (never the realised
size); padding rows (mask 0) add exactly zero; an empty lot still releases
noise (the accountant counted the step).

Key schedule. The run holds two secret base keys (never in any state here):
the noise base and the dropout base. Lot t's noise key is
`noise_key_for_step(noise_base, t)` and micro-batch k of lot t gets the
dropout key `fold_in(fold_in(dropout_base, t), k)`, whose example i uses
`split(·, b)[i]` (`private_grad_sum`). The public part of the schedule is the
step t, which `TrainState` carries; a resumed run derives the same keys.
"""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp
import optax

from dpnmt.core import (
    accumulation,
    clipping,
    deprecation,
    group_clipping,
    noise,
    private_grad,
    validation,
)

# The lot's running clipped sum and real-example count: PRIVATE until `release`.
LotState = accumulation.AccumulatorState


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["step", "params", "opt_state"],
    meta_fields=[],
)
@dataclasses.dataclass(frozen=True)
class TrainState:
    """What a DP-SGD run carries from lot to lot: public, safe to checkpoint and publish.

    A pytree. Holds no key: the noise and dropout keys of lot `step` derive
    from the run's secret base keys and `step` (see the module docstring).
    Everything here is a function of released noisy gradients and public
    values (post-processing), so it reveals nothing beyond the accounted ε.

    Attributes:
      step: int32 scalar, lots applied so far; the public part of the key schedule.
      params: the trainable parameters.
      opt_state: the optimizer's state for `params`.
    """

    step: chex.Array
    params: chex.ArrayTree
    opt_state: Any


def init_train_state(params: chex.ArrayTree, tx: optax.GradientTransformation) -> TrainState:
    """Step 0, `params` and `tx.init(params)`."""
    return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))


def noise_key(noise_base: chex.PRNGKey, step) -> chex.PRNGKey:
    """Lot `step`'s noise key: `fold_in(noise_base, step)` (`noise_key_for_step`)."""
    return noise.noise_key_for_step(noise_base, step)


def dropout_key(dropout_base: chex.PRNGKey, step, index) -> chex.PRNGKey:
    """Micro-batch `index` of lot `step`: `fold_in(fold_in(dropout_base, step), index)`.

    Secret like its base: an example's key follows its row in the lot, and
    public keys would let adding one example change the others' known dropout
    masks (moving the clipped sum by more than C). `step` and `index` must be
    integers (`validation.check_step`): a float would be truncated and reuse a key.
    """
    step = validation.check_step("step", step)
    index = validation.check_step("index", index)
    return jax.random.fold_in(jax.random.fold_in(dropout_base, step), index)


def init(params: chex.ArrayTree) -> LotState:
    """An empty lot: float32 (or wider) zeros like `params`, zero examples."""
    return accumulation.init_accumulator(params)


@deprecation.deprecated_arguments(renamed={"key": "dropout_key"})
def add_microbatch(
    lot: LotState,
    loss_fn: Callable[..., chex.Array],
    params: chex.ArrayTree,
    batch: Any,
    mask: chex.Array,
    *,
    l2_clip: float,
    dropout_key: chex.PRNGKey | None = None,
    clipping: str = private_grad.AUTO,
    microbatch_size: int | None = None,
) -> tuple[LotState, chex.Array]:
    """Adds one masked micro-batch's sum of clipped per-example gradients to the lot.

    Args:
      lot: the lot so far (`init`).
      loss_fn: `loss_fn(params, example[, key]) -> scalar` for ONE example
        (see `private_grad_sum`).
      params: the trainable parameters.
      batch: pytree, every leaf `[b, ...]`.
      mask: `[b]` 0/1, 1 for real rows; padding rows contribute exactly zero.
      l2_clip: C > 0, concrete.
      dropout_key: this micro-batch's dropout key (`dropout_key(dropout_base,
        step, index)`), or None.
      clipping: "auto" (default: ghost where it applies and flax is installed,
        else vmap), "ghost" or "vmap": cost, not result.
      microbatch_size: rows per sequential clipping chunk (None: all at once).

    Returns:
      `(lot, loss_sum)`: the lot with this micro-batch added, and the float32
      sum of its real rows' losses. Both are PRIVATE: never log or publish them.
    """
    grad_sum, _, mean_loss = private_grad.private_grad_sum(
        loss_fn,
        params,
        batch,
        mask,
        l2_clip=l2_clip,
        dropout_key=dropout_key,
        clipping=clipping,
        microbatch_size=microbatch_size,
    )
    real = jnp.sum(jnp.asarray(mask) != 0).astype(jnp.int32)
    return accumulation.accumulate(lot, grad_sum, real), mean_loss * real


def add_group_microbatch(
    lot: LotState,
    loss_fn: Callable[..., chex.Array],
    params: chex.ArrayTree,
    batch: Any,
    row_mask: chex.Array,
    *,
    l2_clip: float,
    dropout_key: chex.PRNGKey | None = None,
    clipping: str = private_grad.AUTO,
) -> tuple[LotState, chex.Array]:
    """Adds one micro-batch of whole groups, each group's gradient clipped to C once.

    The group-level ("user-level") form of `add_microbatch`: the lot's sum
    gains `Σ_g clip_C(Σ_j row_mask[g, j] ∇ℓ(batch[g, j]))`
    (`group_clipping.group_clipped_sum`), so removing one whole group moves
    it by at most C; `release` then noises it once and divides by the fixed
    expected number of groups per lot, L_groups.

    Args:
      lot: the lot so far (`init`).
      loss_fn: `loss_fn(params, row[, key]) -> scalar` for ONE row.
      params: the trainable parameters.
      batch: pytree, every leaf `[G, k, ...]`: G groups of k rows.
      row_mask: `[G, k]` 0/1; unused slots and padding groups add exactly zero.
      l2_clip: C > 0, concrete.
      dropout_key: this micro-batch's dropout key (`dropout_key`), or None.
      clipping: "auto" (default), "ghost" or "vmap" (see `group_clipped_sum`).

    Returns:
      `(lot, loss_sum)`: the lot with the groups added (its count grows by
      the real rows), and the float32 loss sum of the kept groups' rows. Both
      PRIVATE.
    """
    grad_sum, norms, mean_loss = group_clipping.group_clipped_sum(
        loss_fn,
        params,
        batch,
        row_mask,
        l2_clip=l2_clip,
        dropout_key=dropout_key,
        clipping=clipping,
    )
    rows = jnp.sum(jnp.asarray(row_mask) != 0, axis=1)  # [G] real rows per group.
    real = jnp.sum(rows).astype(jnp.int32)
    # mean_loss is over the kept groups' rows: a dropped (non-finite) group's rows are not.
    kept_rows = jnp.sum(jnp.where(jnp.isfinite(norms), rows, 0)).astype(jnp.float32)
    return accumulation.accumulate(lot, grad_sum, real), mean_loss * kept_rows


def add_per_example_grads(
    lot: LotState,
    per_example_grads: chex.ArrayTree,
    mask: chex.Array | None = None,
    *,
    l2_clip: float,
) -> LotState:
    """Adds gradients computed elsewhere (every leaf `[b, *param.shape]`), clipped to C.

    Rows with mask 0 (padding) add exactly zero; `mask=None` counts all b rows.
    The result is PRIVATE until `release`. Each leaf's per-example axis is
    checked against the lot's (the parameters') shapes: a batch gradient is a
    `ValueError`, never clipped as rows.
    """
    grad_sum, _ = clipping.clip_and_sum(
        per_example_grads, l2_clip=l2_clip, mask=mask, params=lot.grad_sum
    )
    if mask is None:
        real = jnp.asarray(jax.tree_util.tree_leaves(per_example_grads)[0].shape[0], jnp.int32)
    else:
        real = jnp.sum(jnp.asarray(mask) != 0, dtype=jnp.int32)
    return accumulation.accumulate(lot, grad_sum, real)


def release(
    lot: LotState,
    noise_key: chex.PRNGKey,
    *,
    noise_multiplier: float,
    l2_clip: float,
    expected_lot_size: float,
    noise_mode: str = noise.FLOAT,
) -> chex.ArrayTree:
    """The lot's gradient `(Σ clipped + N(0, σ²C²)) / L`, noise drawn once (`noisy_average`).

    Call it once per lot, an empty one included. Public once returned (the
    Gaussian mechanism; ÷ the public L is post-processing), if `noise_key` is
    secret and used for this lot only. σ, C, L concrete; `noise_mode` "float"
    or "secure" (see `noisy_average`).
    """
    return accumulation.noisy_average(
        lot,
        noise_key,
        l2_clip=l2_clip,
        noise_multiplier=noise_multiplier,
        expected_lot_size=expected_lot_size,
        noise_mode=noise_mode,
    )


def apply_gradient(
    state: TrainState, gradient: chex.ArrayTree, tx: optax.GradientTransformation
) -> TrainState:
    """One optimizer step on a released gradient; `step` + 1."""
    updates, opt_state = tx.update(gradient, state.opt_state, state.params)
    return TrainState(state.step + 1, optax.apply_updates(state.params, updates), opt_state)


def apply_lot(
    state: TrainState,
    lot: LotState,
    noise_base: chex.PRNGKey,
    *,
    tx: optax.GradientTransformation,
    noise_multiplier: float,
    l2_clip: float,
    expected_lot_size: float,
    noise_mode: str = noise.FLOAT,
) -> TrainState:
    """Releases lot `state.step` with its own noise key, then applies `tx`.

    Never apply two lots to the same state: the noise key is
    `fold_in(noise_base, state.step)`, so reusing a state reuses the key, and
    the two releases' difference cancels the noise (their sums leak exactly).

    Args:
      state: the run so far.
      lot: this lot's accumulated clipped sum.
      noise_base: the run's SECRET noise base key (never saved with the state);
        the lot's key is `noise_key(noise_base, state.step)`.
      tx: the optimizer.
      noise_multiplier: σ >= 0 (as `release`).
      l2_clip: C > 0.
      expected_lot_size: L > 0, the fixed divisor.
      noise_mode: "float" or "secure".

    Returns:
      The next `TrainState` (public).
    """
    gradient = release(
        lot,
        noise_key(noise_base, state.step),
        noise_multiplier=noise_multiplier,
        l2_clip=l2_clip,
        expected_lot_size=expected_lot_size,
        noise_mode=noise_mode,
    )
    return apply_gradient(state, gradient, tx)
