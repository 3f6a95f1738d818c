"""Per-example gradient clipping: norms, clipping factors and clip-and-sum.

Every function here returns the *sum* of clipped per-example gradients. Its L2
sensitivity to adding or removing (or zeroing out) one example is `l2_clip`;
turning it into a private release is the job of `dpnmt.core.noise` and
`dpnmt.core.accumulation`.
"""

import chex
import jax
import jax.numpy as jnp

from dpnmt.core import validation


def per_example_l2_norms(per_example_grads: chex.ArrayTree) -> chex.Array:
    """Global L2 norm of each example's gradient pytree.

    Args:
      per_example_grads: pytree whose every leaf has a leading batch axis `B`.

    Returns:
      float32 array `[B]`: for each example, the L2 norm over all its leaves.
      A non-finite entry (NaN or inf) means that example's gradient is
      non-finite, or its squared norm overflows float32 (norm > ~1.8e19).

    Raises:
      ValueError: no leaves, a leaf without the batch axis, leaves with
        different leading sizes, or B = 0.
    """
    leaves = jax.tree_util.tree_leaves(per_example_grads)
    if not leaves:
        raise ValueError("per_example_grads has no leaves.")
    batch_size = validation.check_batch_axis("per_example_grads", per_example_grads)
    squared = jnp.zeros((batch_size,), jnp.float32)
    for leaf in leaves:
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
        validation.check_mask(mask, norms.shape[0])
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
      l2_clip: clipping norm C > 0, a concrete number (close over it or mark
        it static under `jax.jit`).
      mask: optional `[B]` 0/1 indicator (bool or numeric; not weights: a
        traced mask counts any non-zero entry as 1); rows with 0 are ignored.

    Returns:
      `(grad_sum, norms)`: `grad_sum` has the structure of one example's
      gradient (leaves without the `B` axis), in float32 or wider: a bfloat16
      sum would round by a whole ulp of the sum, far more than C, when one
      example is removed. `norms` is float32 `[B]`,
      the unclipped norms (non-finite where the example was dropped as
      non-finite; see `count_nonfinite`).
    """
    l2_clip = validation.check_positive("l2_clip", l2_clip)
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


def call_loss(loss_fn, params, example, key):
    """`loss_fn(params, example[, key])`: the key is passed only when there is one."""
    return loss_fn(params, example) if key is None else loss_fn(params, example, key)
