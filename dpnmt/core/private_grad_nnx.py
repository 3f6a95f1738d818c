"""`private_grad_sum_nnx`: `private_grad_sum` for Flax NNX models, by either method.

It checks the inputs at the boundary (as `private_grad.private_grad_sum`
does), then runs ghost clipping (`dpnmt.core.ghost_nnx`) or per-example
gradients and `clipping.clip_and_sum` on the model's trainable state; the sum's
L2 sensitivity to adding or removing one example is `l2_clip`.
"""

import warnings
from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp

from dpnmt.core import clipping, ghost, ghost_trace, validation
from dpnmt.core.ghost_nnx import ghost_clipped_sum_nnx, split_model
from dpnmt.core.private_grad import AUTO, PrivateGradSum, check_clipping, checked_scalar_loss

try:  # flax is the optional `ghost` extra.
    from flax import nnx
except ImportError:  # pragma: no cover - exercised by the packaging tests
    nnx = None


def _vmap_clipped_sum_nnx(loss_fn, model, batch, mask, l2_clip, keys, spmd_axis_name, wrt):
    """The same sum from materialised per-example gradients (`clipping="vmap"`)."""
    graphdef, state, rest = split_model(model, wrt)

    def on_state(state, example, key):
        return clipping.call_loss(loss_fn, nnx.merge(graphdef, state, *rest), example, key)

    losses, grads = jax.vmap(
        jax.value_and_grad(on_state),
        in_axes=(None, 0, None if keys is None else 0),
        spmd_axis_name=spmd_axis_name,
    )(state, batch, keys)
    grad_sum, norms = clipping.clip_and_sum(grads, l2_clip=l2_clip, mask=mask, params=state)
    return grad_sum, norms, losses


def private_grad_sum_nnx(
    loss_fn: Callable[..., chex.Array],
    model: Any,
    batch: Any,
    mask: chex.Array,
    *,
    l2_clip: float,
    dropout_key: chex.PRNGKey | None = None,
    wrt: Any = None,
    spmd_axis_name: str | None = None,
    clipping: str = AUTO,
) -> PrivateGradSum:
    """`private_grad_sum` for a Flax NNX model: clipped per-example gradient sum (all PRIVATE).

    `"ghost"` computes each example's norm from the inputs and output
    gradients of the model's `nnx.Linear` / `nnx.Embed` calls
    (`dpnmt.core.ghost_nnx`), with per-example gradients only for the other
    parameters; `"vmap"` materialises every example's gradient; `"auto"` (the
    default) runs ghost where some parameter is used only through such calls,
    and vmap, silently, where none is (the result's `clipping` says which). Both give the
    same sum up to float32 rounding, with L2 sensitivity `l2_clip`. Layers
    lifted by `nnx.scan` / `nnx.vmap` fall back to per-example gradients (named
    in a `ghost.GhostClippingWarning`); a loss that calls layers inside a jax
    transform closing over the model (`jax.checkpoint`, a `jax.lax.scan` body)
    cannot be captured and gets the vmap result, with a warning saying why.

    Args:
      loss_fn: `loss_fn(model, example) -> scalar` for ONE example (a slice of
        `batch` without the leading axis), or `loss_fn(model, example, key)`
        when `dropout_key` is given. It must call the model it is given (a private copy
        with the traced parameters), never one it closes over, and its loss
        must depend on that example alone. Changes it makes to the model are
        discarded; draw per-example randomness from its `key`, not from an
        `nnx.Rngs` inside the model (flax then raises `TraceContextError`).
        It is traced twice and must trace the same way both times (else
        ghost clipping refuses it and this falls back to vmap; `ghost_nnx`).
      model: an `nnx.Module`, or the `(graphdef, *states)` of `nnx.split` (e.g.
        inside `jax.jit`). Not modified.
      batch: pytree, every leaf `[B, ...]`.
      mask: `[B]` 0/1 indicator, 0 for padding rows (they add exactly zero).
      l2_clip: clipping norm C > 0, a concrete number.
      dropout_key: optional PRNG key; example i gets
        `jax.random.split(dropout_key, B)[i]`.
      wrt: NNX filter of the trainable variables (default `nnx.Param`); the
        others are held fixed.
      spmd_axis_name: passed to `jax.vmap`.
      clipping: `"auto"` (default), `"ghost"` or `"vmap"`.

    Returns:
      `PrivateGradSum(grad_sum, norms, mean_loss, clipping)`: the float32 clipped sum as
      an `nnx.State` shaped like `nnx.state(model, wrt)` (what
      `nnx.Optimizer.update(model, grads)` takes once noised), float32 `[B]`
      unclipped norms, and the float32 mean loss of the unmasked finite rows.
      ALL PRIVATE: release the sum only through one noisy release per lot
      (`noisy_average`); never log the norms or the loss. `clipping` (public)
      is the method that ran.

    Raises:
      ImportError: flax is not installed (`pip install "dpnmt[ghost]"`).
      TypeError: `model` is not an NNX module or split, or `l2_clip` is traced.
      ValueError: bad `clipping`, `l2_clip` or `mask`, batch leaves of
        different lengths, an empty batch, or a loss that is not a scalar.
    """
    check_clipping(clipping)
    ghost.require_flax()
    wrt = nnx.Param if wrt is None else wrt
    l2_clip = validation.check_positive("l2_clip", l2_clip)
    batch_size = validation.check_batch_axis("batch", batch)
    validation.check_mask(mask, batch_size)
    mask = jnp.asarray(mask)
    graphdef, state, rest = split_model(model, wrt)
    loss_fn = checked_scalar_loss(loss_fn)
    keys = None if dropout_key is None else jax.random.split(dropout_key, batch_size)
    args = (loss_fn, (graphdef, state, *rest), batch, mask, l2_clip, keys, spmd_axis_name)
    ghosted = None
    if clipping != "vmap":
        try:
            ghosted = ghost_clipped_sum_nnx(*args, wrt=wrt, require_layers=clipping == AUTO)
        except ghost.NothingToFactoriseError:
            pass  # "auto" with nothing to factorise: vmap, silently (the same sum).
        except ghost.UNINTERCEPTABLE as error:
            reason = ghost_trace.fallback_reason(
                error,
                "called inside a jax transform that closes over the model, such as "
                "jax.checkpoint or a jax.lax.scan body?",
            )
            warnings.warn(
                f"ghost clipping cannot capture the layers of loss_fn ({reason}); "
                "falling back to per-example gradients "
                "for all parameters (as clipping='vmap': same sum, B copies of the gradient).",
                ghost.GhostClippingWarning,
                stacklevel=2,
            )
    ran = "vmap" if ghosted is None else "ghost"
    grad_sum, norms, losses = ghosted or _vmap_clipped_sum_nnx(*args, wrt)
    counted = (mask.astype(jnp.float32) != 0) & jnp.isfinite(norms) & jnp.isfinite(losses)
    total = jnp.sum(jnp.where(counted, losses.astype(jnp.float32), 0.0))
    mean_loss = total / jnp.maximum(jnp.sum(counted.astype(jnp.float32)), 1.0)
    return PrivateGradSum(grad_sum, norms, mean_loss, ran)
