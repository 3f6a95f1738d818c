"""Per-example gradient clipping: norms, clip-and-sum, and `private_grad_sum`.

Every function here returns the *sum* of clipped per-example gradients. Its L2
sensitivity to adding or removing (or zeroing out) one example is `l2_clip`;
turning it into a private release is the job of `dpnmt.core.noise` and
`dpnmt.core.accumulation`.
"""

import functools
from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp

from dpnmt.core import accumulation, validation


def per_example_l2_norms(per_example_grads: chex.ArrayTree) -> chex.Array:
    """Global L2 norm of each example's gradient pytree.

    Args:
      per_example_grads: pytree whose every leaf has a leading batch axis `B`.

    Returns:
      float32 array `[B]`: for each example, the L2 norm over all its leaves.
      A non-finite entry (NaN or inf) means that example's gradient is
      non-finite, or its squared norm overflows float32 (norm > ~1.8e19).
    """
    leaves = jax.tree_util.tree_leaves(per_example_grads)
    if not leaves:
        raise ValueError("per_example_grads has no leaves.")
    batch_size = leaves[0].shape[0]
    squared = jnp.zeros((batch_size,), jnp.float32)
    for leaf in leaves:
        chex.assert_axis_dimension(leaf, 0, batch_size)
        leaf = leaf.astype(jnp.float32).reshape(batch_size, -1)
        squared = squared + jnp.sum(jnp.square(leaf), axis=1)
    return jnp.sqrt(squared)


def clip_factors(
    norms: chex.Array, l2_clip: float, mask: chex.Array | None = None
) -> tuple[chex.Array, chex.Array]:
    """Which rows count, and each row's clipping factor.

    Args:
      norms: float32 `[B]` per-example gradient norms.
      l2_clip: clipping norm C > 0.
      mask: optional `[B]` (bool or 0/1); rows with 0 are padding.

    Returns:
      `(keep, scale)`, both `[B]`: `keep` is False for padding and non-finite
      rows; `scale` is `min(1, C / norm)` where kept and exactly 0 elsewhere.
    """
    keep = jnp.isfinite(norms)
    if mask is not None:
        chex.assert_shape(mask, norms.shape)
        keep = keep & (mask.astype(jnp.float32) != 0)
    # C / max(norm, C) == min(1, C / norm), without dividing by zero.
    scale = jnp.where(keep, l2_clip / jnp.maximum(jnp.where(keep, norms, 1.0), l2_clip), 0.0)
    return keep, scale


def clip_and_sum(
    per_example_grads: chex.ArrayTree,
    l2_clip: float,
    mask: chex.Array | None = None,
) -> tuple[chex.ArrayTree, chex.Array]:
    """Clips each example's gradient to L2 norm `l2_clip`, then sums over the batch.

    Example `i` is scaled by `min(1, l2_clip / norm_i)`. Rows with `mask == 0`
    (padding) and rows whose gradient is non-finite contribute exactly zero,
    so the sum stays finite and its sensitivity stays `l2_clip`.

    Args:
      per_example_grads: pytree, every leaf `[B, ...]`.
      l2_clip: clipping norm C > 0.
      mask: optional `[B]` (bool or 0/1); rows with 0 are ignored.

    Returns:
      `(grad_sum, norms)`: `grad_sum` has the structure of one example's
      gradient (leaves without the `B` axis), in float32 or wider: a bfloat16
      sum would round by a whole ulp of the sum, far more than C, when one
      example is removed. `norms` is float32 `[B]`,
      the unclipped norms (non-finite where the example was dropped as
      non-finite; see `count_nonfinite`).
    """
    validation.check_positive("l2_clip", l2_clip)
    norms = per_example_l2_norms(per_example_grads)
    keep, scale = clip_factors(norms, l2_clip, mask)

    def _sum(leaf):
        row_scale = scale.reshape((-1,) + (1,) * (leaf.ndim - 1))
        row_keep = keep.reshape(row_scale.shape)
        # `where`, not only multiply: 0 * NaN is NaN.
        compute_dtype = jnp.promote_types(leaf.dtype, jnp.float32)
        clipped = jnp.where(row_keep, leaf.astype(compute_dtype) * row_scale, 0.0)
        return jnp.sum(clipped, axis=0)

    return jax.tree_util.tree_map(_sum, per_example_grads), norms


def count_nonfinite(norms: chex.Array, mask: chex.Array | None = None) -> chex.Array:
    """Number of (unmasked) examples dropped by `clip_and_sum` as non-finite.

    The count depends on private data: use it for debugging, do not publish it.

    Args:
      norms: `[B]` norms returned by `clip_and_sum` or `private_grad_sum`.
      mask: optional `[B]`; masked rows are not counted.

    Returns:
      int32 scalar.
    """
    bad = ~jnp.isfinite(norms)
    if mask is not None:
        bad = bad & (mask.astype(jnp.float32) != 0)
    return jnp.sum(bad.astype(jnp.int32))


CLIPPING_METHODS = ("ghost", "vmap")


def call_loss(loss_fn, params, example, key):
    """`loss_fn(params, example[, key])`: the key is passed only when there is one."""
    return loss_fn(params, example) if key is None else loss_fn(params, example, key)


def _vmap_clipped_sum(loss_fn, params, batch, mask, l2_clip, keys, spmd_axis_name):
    """Clipped sum, norms and losses from materialised per-example gradients."""
    value_and_grad = jax.vmap(
        jax.value_and_grad(functools.partial(call_loss, loss_fn)),
        in_axes=(None, 0, None if keys is None else 0),
        spmd_axis_name=spmd_axis_name,
    )
    losses, per_example_grads = value_and_grad(params, batch, keys)
    grad_sum, norms = clip_and_sum(per_example_grads, l2_clip, mask)
    return grad_sum, norms, losses


def private_grad_sum(
    loss_fn: Callable[..., chex.Array],
    params: chex.ArrayTree,
    batch: Any,
    mask: chex.Array,
    l2_clip: float,
    *,
    key: chex.PRNGKey | None = None,
    spmd_axis_name: str | None = None,
    clipping: str = "ghost",
    microbatch_size: int | None = None,
) -> tuple[chex.ArrayTree, chex.Array, chex.Array]:
    """Sum of clipped per-example gradients.

    Both methods return the same sum (up to float32 rounding):
    `"vmap"` materialises every example's gradient with `vmap(grad)` (memory
    B × parameters); `"ghost"` (`dpnmt.core.ghost`) computes each example's
    norm layer by layer from the inputs and output gradients of the Flax
    `nn.Dense` / `nn.Embed` calls inside `loss_fn`, and falls back to
    per-example gradients only for the parameters it cannot factorise. A
    `loss_fn` that uses no Flax module gets the `vmap` result either way.

    Args:
      loss_fn: `loss_fn(params, example) -> scalar` for ONE example (a slice of
        `batch` without the leading axis), or `loss_fn(params, example, key)`
        when `key` is given. The loss must depend on that example alone (e.g.
        the example's own mean token loss), never on batch statistics.
      params: the parameters to differentiate (pass only trainable ones; frozen
        parameters can be closed over by `loss_fn` and then cost no
        per-example memory). For `"ghost"`, `loss_fn` must pass these leaves
        to `module.apply` unchanged (merging with frozen ones is fine).
      batch: pytree, every leaf `[B, ...]`.
      mask: `[B]`, 1 for real examples, 0 for padding rows.
      l2_clip: clipping norm C > 0.
      key: optional PRNG key; each example gets its own key
        `jax.random.split(key, B)[i]` (e.g. for dropout), whatever the method
        and micro-batching. Use a different key for every batch.
      spmd_axis_name: passed to `jax.vmap` for batches sharded over a mesh axis.
      clipping: `"ghost"` (default) or `"vmap"`.
      microbatch_size: if set, the batch is processed in sequential chunks of
        this many examples (B must be a multiple of it) to bound peak memory;
        the result is the same.

    Returns:
      `(grad_sum, norms, mean_loss)`: the clipped sum (structure of `params`),
      float32 `[B]` unclipped norms, and the float32 mean loss over unmasked,
      finite rows (0 when every row is masked).
    """
    if clipping not in CLIPPING_METHODS:
        raise ValueError(f"clipping={clipping!r}: use one of {CLIPPING_METHODS}.")
    validation.check_positive("l2_clip", l2_clip)
    mask = jnp.asarray(mask)
    batch_size = mask.shape[0]
    keys = None if key is None else jax.random.split(key, batch_size)
    from dpnmt.core import ghost  # Here: ghost builds on this module's helpers.

    method = ghost.ghost_clipped_sum if clipping == "ghost" else _vmap_clipped_sum

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
    return grad_sum, norms, mean_loss
