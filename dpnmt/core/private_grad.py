"""`private_grad_sum`: the clipped per-example gradient sum of a loss, by either method.

It picks `"ghost"` (`dpnmt.core.ghost`) or `"vmap"` (per-example gradients and
`dpnmt.core.clipping.clip_and_sum`), checks the inputs at the boundary, and
optionally runs the batch in sequential chunks. The sum's L2 sensitivity to
adding or removing one example is `l2_clip`.
"""

import functools
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp

from dpnmt.core import accumulation, deprecation, ghost, ghost_trace, validation
from dpnmt.core.clipping import call_loss, clip_and_sum

CLIPPING_METHODS = ("ghost", "vmap")


class PrivateGradSum(NamedTuple):
    """What `private_grad_sum` returns; unpacks as `(grad_sum, norms, mean_loss)`.

    ALL THREE ARE PRIVATE. Only `grad_sum` is meant to leave, and only through
    one noisy release per lot (`noisy_average`, `dp_step.release`).

    Attributes:
      grad_sum: sum of clipped per-example gradients (structure of `params`,
        float32 or wider); L2 sensitivity C. PRIVATE until noised.
      norms: float32 `[B]`, each example's unclipped gradient norm (non-finite
        where the example was dropped). PRIVATE: each entry is a function of
        one example, neither clipped nor noised; never log or publish it (for
        debugging, `count_nonfinite`, or a DP mechanism of your own).
      mean_loss: float32 scalar, the mean loss of the unmasked finite rows (0
        when every row is masked). PRIVATE: a private run's training loss;
        never log or publish it.
    """

    grad_sum: chex.ArrayTree
    norms: chex.Array
    mean_loss: chex.Array


def _vmap_clipped_sum(loss_fn, params, batch, mask, l2_clip, keys, spmd_axis_name):
    """Clipped sum, norms and losses from materialised per-example gradients."""
    value_and_grad = jax.vmap(
        jax.value_and_grad(functools.partial(call_loss, loss_fn)),
        in_axes=(None, 0, None if keys is None else 0),
        spmd_axis_name=spmd_axis_name,
    )
    losses, per_example_grads = value_and_grad(params, batch, keys)
    grad_sum, norms = clip_and_sum(per_example_grads, l2_clip=l2_clip, mask=mask, params=params)
    return grad_sum, norms, losses


def _ghost_or_vmap(loss_fn, params, batch, mask, l2_clip, keys, spmd_axis_name):
    """Ghost clipping, or vmap (with a warning) where loss_fn's layers cannot be intercepted."""
    try:
        return ghost.ghost_clipped_sum(loss_fn, params, batch, mask, l2_clip, keys, spmd_axis_name)
    except ghost.UNINTERCEPTABLE as error:
        reason = ghost_trace.fallback_reason(
            error,
            "it uses nn.scan, nn.vmap or another lifted transform, or a jax.checkpoint "
            "closing over the parameters?",
        )
    warnings.warn(
        f"ghost clipping cannot intercept the layers of loss_fn ({reason}); "
        "falling back to per-example gradients "
        "for all parameters (as clipping='vmap': same sum, B copies of the gradient in "
        "memory). Pass clipping='vmap' to choose this explicitly.",
        ghost.GhostClippingWarning,
        stacklevel=4,
    )
    return _vmap_clipped_sum(loss_fn, params, batch, mask, l2_clip, keys, spmd_axis_name)


def from_batched_loss(batched_loss_fn: Callable[..., chex.Array]) -> Callable[..., chex.Array]:
    """Adapts a loss written for a batch of one (jax_privacy's convention) to ONE example.

    dpnmt.core calls `loss_fn(params, example[, key])` with one example without
    its batch axis and vmaps it; jax_privacy's `clipped_grad` (and most
    training code) calls a loss on a batch and slices it into batches of one.
    The adaptor adds a leading axis of size 1 to every leaf of the example,
    calls `batched_loss_fn(params, batch[, key])` and returns its one value as
    a scalar (a mean or sum over a batch of one is that example's loss).

        loss_fn = core.from_batched_loss(jax_privacy_style_loss)
        core.private_grad_sum(loss_fn, params, batch, mask, l2_clip=1.0)

    Args:
      batched_loss_fn: `batched_loss_fn(params, batch) -> loss` (or with a
        third argument, the example's key, when a `dropout_key` is given),
        where every leaf of `batch` is `[1, ...]` and `loss` holds one value
        (shape `()` or `(1,)`). It must not mix examples (no batch statistics).

    Returns:
      `loss_fn(params, example[, key]) -> scalar` for ONE example, to pass as
      `loss_fn` to `private_grad_sum`, `private_lot_gradient`, `dp_multi_steps`
      or `dp_step.add_microbatch`.
    """

    @functools.wraps(batched_loss_fn)
    def loss_fn(params, example, *key):
        batch = jax.tree.map(lambda leaf: jnp.asarray(leaf)[None], example)
        loss = jnp.asarray(batched_loss_fn(params, batch, *key))
        if loss.size != 1:
            raise ValueError(
                f"from_batched_loss: the batched loss returned shape {loss.shape} for a "
                "batch of one; return one value (the batch's mean or sum) or a [1] vector."
            )
        return loss.reshape(())

    return loss_fn


def checked_scalar_loss(loss_fn):
    """`loss_fn`, raising ValueError at trace time unless it returns a scalar for one example.

    Checked on the trace the clipping makes anyway: a separate `eval_shape`
    traced the whole model once more per compiled shape (a fifth of the
    start-up's tracing of a T5 training step).
    """

    @functools.wraps(loss_fn)
    def checked(*args):
        out = loss_fn(*args)
        shapes = [jnp.shape(leaf) for leaf in jax.tree.leaves(out)]
        if shapes != [()]:
            raise ValueError(
                f"loss_fn must return a scalar loss for ONE example (batch sliced without its "
                f"leading axis), but returned shape(s) {shapes}: compute each example's own "
                "loss (e.g. its mean token loss); the clipping code vmaps it over the batch."
            )
        return out

    return checked


@deprecation.deprecated_arguments(renamed={"key": "dropout_key"}, positional=("l2_clip",))
def private_grad_sum(
    loss_fn: Callable[..., chex.Array],
    params: chex.ArrayTree,
    batch: Any,
    mask: chex.Array,
    *,
    l2_clip: float,
    dropout_key: chex.PRNGKey | None = None,
    spmd_axis_name: str | None = None,
    clipping: str = "ghost",
    microbatch_size: int | None = None,
) -> PrivateGradSum:
    """Sum of clipped per-example gradients, with per-example norms and the mean loss (all PRIVATE).

    Both methods return the same sum (up to float32 rounding):
    `"vmap"` materialises every example's gradient with `vmap(grad)` (memory
    B × parameters); `"ghost"` (`dpnmt.core.ghost`) computes each example's
    norm layer by layer from the inputs and output gradients of the Flax
    `nn.Dense` / `nn.Embed` calls inside `loss_fn`, and falls back to
    per-example gradients only for the parameters it cannot factorise. A
    `loss_fn` that uses no Flax module gets the `vmap` result either way, and
    so does one whose layers cannot be intercepted (`nn.scan`, `nn.vmap`), with
    a `ghost.GhostClippingWarning` saying why. `"ghost"` needs flax (the
    `ghost` extra): without it, it raises rather than switching to `"vmap"`.

    Args:
      loss_fn: `loss_fn(params, example) -> scalar` for ONE example (a slice of
        `batch` without the leading axis), or `loss_fn(params, example, key)`
        when `dropout_key` is given (a loss written for a batch of one, as
        jax_privacy's: wrap it in `from_batched_loss`). The loss must depend
        on that example alone (e.g. the example's own mean token loss), never
        on batch statistics.
      params: the parameters to differentiate (pass only trainable ones; frozen
        parameters can be closed over by `loss_fn` and then cost no
        per-example memory). For `"ghost"`, `loss_fn` must pass these leaves
        to `module.apply` unchanged (merging with frozen ones is fine).
      batch: pytree, every leaf `[B, ...]`.
      mask: `[B]` 0/1 indicator, 1 for real examples, 0 for padding rows (not
        weights; a traced mask counts any non-zero entry as 1).
      l2_clip: clipping norm C > 0, a concrete number: close over it or mark it
        static under `jax.jit` (a traced C is refused: it cannot be checked).
      dropout_key: optional PRNG key; each example gets its own key
        `jax.random.split(dropout_key, B)[i]` (e.g. for dropout), whatever the
        method and micro-batching. Use a different key for every batch
        (`dropout_key(dropout_base, step, index)`), never the noise key.
      spmd_axis_name: passed to `jax.vmap` for batches sharded over a mesh axis.
      clipping: `"ghost"` (default; needs flax, `pip install "dpnmt[ghost]"`)
        or `"vmap"`.
      microbatch_size: if set, the batch is processed in sequential chunks of
        this many examples (B must be a multiple of it) to bound peak memory;
        the result is the same.

    Raises:
      ImportError: `clipping="ghost"` without flax installed (the `ghost` extra).
      TypeError: `l2_clip` is traced (an argument of `jax.jit`).
      ValueError: bad `clipping`, `microbatch_size`, `l2_clip`, `mask` (shape
        other than `[B]`, or concrete entries other than 0/1), batch leaves of
        different lengths, an empty batch (B = 0), or a `loss_fn` that does not return a scalar.

    Returns:
      `PrivateGradSum(grad_sum, norms, mean_loss)`: the clipped sum (structure
      of `params`), float32 `[B]` unclipped norms, and the float32 mean loss
      over unmasked, finite rows (0 when every row is masked). ALL PRIVATE: the
      norms and the loss are un-noised functions of the examples; never log or
      publish them, and release the sum only through one noisy release per lot.
    """
    if clipping not in CLIPPING_METHODS:
        raise ValueError(f"clipping={clipping!r}: use one of {CLIPPING_METHODS}.")
    if clipping == "ghost":
        ghost.require_flax()
    l2_clip = validation.check_positive("l2_clip", l2_clip)
    batch_size = validation.check_batch_axis("batch", batch)
    validation.check_mask(mask, batch_size)
    mask = jnp.asarray(mask)
    loss_fn = checked_scalar_loss(loss_fn)
    keys = None if dropout_key is None else jax.random.split(dropout_key, batch_size)
    method = _ghost_or_vmap if clipping == "ghost" else _vmap_clipped_sum

    def run(chunk, chunk_mask, chunk_keys):
        return method(loss_fn, params, chunk, chunk_mask, l2_clip, chunk_keys, spmd_axis_name)

    if microbatch_size is None or microbatch_size >= batch_size:
        grad_sum, norms, losses = run(batch, mask, keys)
    else:
        if microbatch_size <= 0 or batch_size % microbatch_size:
            raise ValueError(
                f"microbatch_size={microbatch_size} must be a positive divisor of the batch "
                f"size {batch_size}; pick a divisor or leave it unset."
            )
        chunks = batch_size // microbatch_size

        def split(v):
            return v.reshape((chunks, microbatch_size) + v.shape[1:])

        def body(total, xs):
            chunk_sum, chunk_norms, chunk_losses = run(*xs)
            total = jax.tree_util.tree_map(jnp.add, total, chunk_sum)
            return total, (chunk_norms, chunk_losses)

        zeros = accumulation.init_accumulator(params).grad_sum
        xs = (
            jax.tree_util.tree_map(split, batch),
            split(mask),
            None if keys is None else split(keys),
        )
        grad_sum, (norms, losses) = jax.lax.scan(body, zeros, xs)
        norms, losses = norms.reshape(batch_size), losses.reshape(batch_size)
    counted = (mask.astype(jnp.float32) != 0) & jnp.isfinite(norms) & jnp.isfinite(losses)
    total = jnp.sum(jnp.where(counted, losses.astype(jnp.float32), 0.0))
    mean_loss = total / jnp.maximum(jnp.sum(counted.astype(jnp.float32)), 1.0)
    return PrivateGradSum(grad_sum, norms, mean_loss)
