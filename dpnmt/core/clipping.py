"""Per-example gradient clipping: norms, clipping factors and clip-and-sum.

Every function here returns the *sum* of clipped per-example gradients. Its L2
sensitivity to adding or removing (or zeroing out) one example is `l2_clip`;
turning it into a private release is the job of `dpnmt.core.noise` and
`dpnmt.core.accumulation`.
"""

import math
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np

from dpnmt.core import deprecation, validation


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
      norms: float32 `[B]` per-example gradient norms (or upper bounds on them).
      l2_clip: clipping norm C > 0.
      mask: optional `[B]` (bool or 0/1); rows with 0 are padding.

    Returns:
      `(keep, scale)`, both `[B]`: `keep` is False for padding and non-finite
      rows; `scale` is exactly 0 where not kept, exactly 1 where `norm <= C`,
      and `min(1, C / norm)` rounded DOWN elsewhere: `scale * norm <= C` holds
      exactly (in real arithmetic on the float32 values), where a plain float32
      `C / norm` can round up and let the clipped row exceed C by an ulp.
    """
    keep = jnp.isfinite(norms)
    if mask is not None:
        validation.check_mask(mask, norms.shape[0])
        keep = keep & (mask.astype(jnp.float32) != 0)
    # The largest float32 <= C: float32(0.1) is above 0.1, and a factor relative to it would be too.
    clip32 = np.float32(l2_clip)
    if float(clip32) > l2_clip:
        clip32 = np.nextafter(clip32, np.float32(0.0))
    safe = jnp.where(keep, norms, 1.0)
    clipped = safe > clip32
    # fl(C / n) <= (C / n)(1 + u); times (1 - 2u), rounded: <= (C / n)(1 + u)^2 (1 - 2u) < C / n.
    quotient = (clip32 / jnp.where(clipped, safe, 1.0)) * np.float32(_ROUND_DOWN)
    scale = jnp.where(keep, jnp.where(clipped, quotient, 1.0), 0.0)
    return keep, scale


# float32 unit roundoff, and the factor that turns a rounded-to-nearest quotient into a lower bound.
_U = 2.0**-24
_ROUND_DOWN = 1.0 - 2 * _U


def norm_upper_bounds(norms: chex.Array, per_example_grads: chex.ArrayTree) -> chex.Array:
    """`per_example_l2_norms`' result raised by its rounding error: `[B]` upper bounds.

    `per_example_l2_norms` rounds: the squares, each leaf's sum of n
    non-negative terms, the sum over leaves and the square root. A norm
    computed a little low would let the clipped row exceed C. This multiplies
    by `1 + (⌈log2 n⌉ + leaves + 8) u` (u = 2**-24, n the largest leaf's
    per-example size).

    Assumed (as `ghost_norms.ghost_squared_norm` does): XLA sums a reduction
    pairwise or in blocks, so a float32 sum of n non-negative terms errs by at
    most `(⌈log2 n⌉ + 4) u` relative (measured on XLA CPU: 4e-8 for 2**22
    equal terms, where one sequential loop would err by ~0.1). The slack is
    ~1e-6 relative for realistic models: a row whose norm lies within it above C
    is scaled by slightly less than `C / norm`.

    Args:
      norms: float32 `[B]` from `per_example_l2_norms(per_example_grads)`.
      per_example_grads: the pytree the norms were computed from (only shapes read).

    Returns:
      float32 `[B]`: `norms * (1 + slack)`, upper bounds; non-finite stays non-finite.
    """
    leaves = jax.tree_util.tree_leaves(per_example_grads)
    widest = max(math.prod(leaf.shape[1:]) for leaf in leaves)
    return norms * norm_rounding_factor(widest, len(leaves))


def norm_rounding_factor(widest: int, terms: int) -> jax.Array:
    """`1 + (⌈log2 n⌉ + terms + 8) u`: raises a float32 norm to a bound (see `norm_upper_bounds`).

    Args:
      widest: n, the most float32 squares one reduction summed for an example.
      terms: how many per-leaf squared norms were added up.
    """
    slack = (math.ceil(math.log2(max(widest, 2))) + terms + 8) * _U
    # The + 8 covers the square root, this product and the rounding of 1 + slack.
    return jnp.float32(1.0 + slack)


@deprecation.deprecated_arguments(positional=("l2_clip", "mask"))
def clip_and_sum(
    per_example_grads: chex.ArrayTree,
    *,
    l2_clip: float,
    mask: chex.Array | None = None,
    params: chex.ArrayTree | None = None,
) -> tuple[chex.ArrayTree, chex.Array]:
    """Clips each example's gradient to L2 norm `l2_clip`, then sums over the batch.

    The per-example axis is explicit: with `params` (the parameters, or their
    `jax.ShapeDtypeStruct`s), every leaf must be `[B, *param.shape]`. Without
    it, the leading axis is taken on trust, and a batch gradient whose leaves
    all lead with the same size (an MLP of square kernels) would be clipped as
    rows, bounding nothing: that spelling is deprecated and warns.

    Example `i` is scaled by `min(1, l2_clip / norm_i)`, rounded down and from
    the norm raised by its float32 rounding bound (`norm_upper_bounds`), so no
    clipped row exceeds C; the sum is one contraction over the batch
    (`weighted_row_sum`). Rows with `mask == 0`
    (padding) and rows whose gradient is non-finite contribute exactly zero,
    so the sum stays finite and its sensitivity stays `l2_clip`.

    Args:
      per_example_grads: pytree, every leaf `[B, ...]`.
      l2_clip: clipping norm C > 0, a concrete number (close over it or mark
        it static under `jax.jit`).
      mask: optional `[B]` 0/1 indicator (bool or numeric; not weights: a
        traced mask counts any non-zero entry as 1); rows with 0 are ignored.
      params: the parameters the gradients are of (only shapes read); each
        gradient leaf must be `[B, *param.shape]`. Omitting it is deprecated.

    Returns:
      `(grad_sum, norms)`: `grad_sum` has the structure of one example's
      gradient (leaves without the `B` axis), in float32 or wider: a bfloat16
      sum would round by a whole ulp of the sum, far more than C, when one
      example is removed. `norms` is float32 `[B]`,
      the unclipped norms (non-finite where the example was dropped as
      non-finite; see `count_nonfinite`).

    Raises:
      ValueError: a gradient leaf is not `[B, *param.shape]` for `params`, the
        leaves' leading sizes differ, `l2_clip` <= 0 or a bad `mask`.
    """
    l2_clip = validation.check_positive("l2_clip", l2_clip)
    validation.check_batch_axis("per_example_grads", per_example_grads)
    if params is None:
        warnings.warn(
            "dpnmt.core: clip_and_sum() without params= is deprecated: the per-example axis "
            "is then unchecked, and a batch gradient whose leaves share a leading size is "
            "clipped as rows. Pass params= (the parameters or their shapes).",
            deprecation.ArgumentDeprecationWarning,
            stacklevel=3,  # past the deprecated_arguments wrapper, at the caller
        )
    else:
        validation.check_per_example_axis(per_example_grads, params, "params")
    norms = per_example_l2_norms(per_example_grads)
    keep, scale = clip_factors(norm_upper_bounds(norms, per_example_grads), l2_clip, mask)
    return jax.tree_util.tree_map(
        lambda leaf: weighted_row_sum(leaf, scale, keep), per_example_grads
    ), norms


def weighted_row_sum(rows: chex.Array, scale: chex.Array, keep: chex.Array) -> chex.Array:
    """`Σ_b scale_b · rows_b` as one contraction, rows with `keep == False` exactly zero.

    A `tensordot` over the batch axis (a matrix-vector product: ~50x faster on
    CPU than scaling every row and reducing over the leading axis). Rows not
    kept are zeroed first: their scale is 0, but 0 * NaN is NaN.

    Args:
      rows: `[B, ...]` per-example gradients of one parameter.
      scale: float32 `[B]` clipping factors (`clip_factors`), 0 where not kept.
      keep: bool `[B]`.

    Returns:
      `rows.shape[1:]`, in float32 or wider, summed at full float32 precision
      (never TF32/bfloat16 passes on GPU or TPU: their rounding could move one
      example's contribution by more than C's ulps).
    """
    dtype = jnp.promote_types(rows.dtype, jnp.float32)
    safe = jnp.where(keep.reshape((-1,) + (1,) * (rows.ndim - 1)), rows, 0)
    return jnp.tensordot(
        scale.astype(dtype), safe.astype(dtype), axes=1, precision=jax.lax.Precision.HIGHEST
    )


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
