"""Group-level ("user-level") clipping: one clipped contribution per group of examples.

`group_clipped_sum` takes rows arranged `[G groups, k rows]` with a row mask
`[G, k]` and returns `Σ_g clip_C(Σ_j mask_gj ∇ℓ(row_gj))`: each group's
gradient is the sum of its rows' gradients, clipped to C as ONE contribution.
With noise N(0, σ²C²) on this sum and groups sampled (Poisson, rate q), DP-SGD
protects a whole group (a user, a patient's case, a document) with the ε that
the accountant gives for (q, σ, T) over the groups (`compute_epsilon` with
q = L_groups / N_groups).

Formal guarantee: for any parameters and any other groups, removing one whole
group from the batch (or replacing every row of it, or masking them all) moves
the returned sum by a vector of L2 norm at most C, whatever the group's size
(up to k rows) and contents: its gradient enters the sum only as
`scale_g · Σ_j mask_gj ∇ℓ_gj` with `scale_g · ‖Σ_j mask_gj ∇ℓ_gj‖ <= C` (the
norm raised by its float32 rounding bound, the factor rounded down, as
`clipping.clip_and_sum` does per example), or not at all when the group is
empty or its gradient is non-finite. Rows with mask 0 and groups with no row
contribute exactly zero. Holds for `clipping="vmap"` and `"ghost"`; requires
that `loss_fn` of one row depends on that row alone, and that padding rows hold
finite inputs (their zero cotangent times a NaN intermediate would be NaN, and
the whole group would then be dropped, never leaked).

The ghost method treats a group as one example whose tokens are its rows'
tokens concatenated: each Flax layer's inputs `A_g` and output gradients `G_g`
are its rows' `A`/`G` stacked, and the ghost norm includes the cross terms
between rows exactly. It runs the rows of a group one after another in the
traced loss (k calls of `loss_fn`), so its compile time grows with k.
"""

import warnings
from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp

from dpnmt.core import ghost, ghost_trace, validation
from dpnmt.core.clipping import call_loss, clip_and_sum
from dpnmt.core.private_grad import AUTO, PrivateGradSum, check_clipping, checked_scalar_loss


def _check_groups(batch: Any, row_mask: chex.Array) -> tuple[int, int]:
    """`(G, k)` of a `[G, k, ...]` batch and its `[G, k]` row mask; ValueError naming the fix."""
    groups = validation.check_batch_axis("batch", batch)
    shape = tuple(getattr(row_mask, "shape", ()))
    if len(shape) != 2 or shape[0] != groups:
        raise ValueError(
            f"row_mask has shape {shape}; it must be [G, k] = [{groups}, k], one 0/1 entry per "
            "row of each group (batch leaves are [G, k, ...])."
        )
    k = shape[1]
    for leaf in jax.tree_util.tree_leaves(batch):
        if leaf.ndim < 2 or leaf.shape[1] != k:
            raise ValueError(
                f"batch leaf of shape {tuple(leaf.shape)}: every leaf must be [G, k, ...] = "
                f"[{groups}, {k}, ...], the rows of each group on axis 1 (pad groups to k rows "
                "and mask the padding with row_mask)."
            )
    if k < 1:
        raise ValueError("row_mask has k = 0 rows per group: use k >= 1 (the group cap).")
    validation.check_mask(jnp.reshape(row_mask, (-1,)), groups * k)
    return groups, k


def _group_loss(loss_fn, has_key: bool, unrolled: bool):
    """`(params, rows [k, ...], mask [k], keys [k] | None) -> Σ_j mask_j ℓ(row_j)`."""

    def row_loss(params, row, key):
        return call_loss(loss_fn, params, row, key if has_key else None)

    def group_loss(params, rows, mask, keys):
        live = mask.astype(jnp.float32) != 0
        if unrolled:  # Ghost: no vmap inside, so every Flax call of every row is intercepted.
            k = mask.shape[0]
            losses = jnp.stack(
                [
                    row_loss(
                        params,
                        jax.tree_util.tree_map(lambda v, j=j: v[j], rows),
                        None if keys is None else keys[j],
                    )
                    for j in range(k)
                ]
            )
        else:
            losses = jax.vmap(row_loss, in_axes=(None, 0, None if keys is None else 0))(
                params, rows, keys
            )
        losses = losses.astype(jnp.float32)
        # Masked rows get a zero cotangent, hence exactly zero gradient.
        return jnp.sum(jnp.where(live, losses, 0.0))

    return group_loss


def group_clipped_sum(
    loss_fn: Callable[..., chex.Array],
    params: chex.ArrayTree,
    batch: Any,
    row_mask: chex.Array,
    *,
    l2_clip: float,
    dropout_key: chex.PRNGKey | None = None,
    clipping: str = "vmap",
) -> PrivateGradSum:
    """Sum over groups of each group's clipped gradient sum (ALL outputs PRIVATE).

    Group g's gradient is `Σ_j row_mask[g, j] · ∇ℓ(params, batch[g, j])`, clipped
    to L2 norm `l2_clip` as one contribution; the result sums them over g.
    Sensitivity to adding or removing one whole group: `l2_clip` (see the
    module's Formal guarantee). Cap each group at k rows BEFORE calling (which
    rows, chosen from secret randomness): rows beyond k do not fit the shape.

    Args:
      loss_fn: `loss_fn(params, row) -> scalar` for ONE row (a slice of `batch`
        without its two leading axes), or `loss_fn(params, row, key)` when `dropout_key`
        is given. The loss must depend on that row alone.
      params: the parameters to differentiate.
      batch: pytree, every leaf `[G, k, ...]`: G groups (padded groups allowed),
        k rows each (the cap; padding rows allowed).
      row_mask: `[G, k]` 0/1, 1 for real rows; a group whose row_mask is all 0
        is padding and contributes exactly zero.
      l2_clip: clipping norm C > 0, a concrete number.
      dropout_key: optional PRNG key; row (g, j) gets
        `jax.random.split(dropout_key, G*k)[g*k+j]`.
      clipping: `"vmap"` (default: per-group gradients, G copies in memory),
        `"ghost"` (book-keeping over the group's stacked rows; needs flax;
        compile time grows with k, since it unrolls the k rows; where the
        layers cannot be factorised, it warns and falls back to `"vmap"`) or
        `"auto"` (ghost where flax is installed and the loss has layers it
        factorises, vmap otherwise, silently).

    Returns:
      `PrivateGradSum(grad_sum, norms, mean_loss, clipping)`: the clipped sum
      (structure of `params`, float32 or wider), float32 `[G]` unclipped
      group-gradient norms (non-finite where the group was dropped), and the
      float32 mean loss over the real rows of the kept groups: ALL PRIVATE
      (release the sum only through one noisy release per lot; never log the
      norms or the loss); `clipping`, public, the method that ran.

    Raises:
      ValueError: bad `clipping`, `l2_clip`, shapes (batch leaves not
        `[G, k, ...]`, row_mask not `[G, k]`), mask entries other than 0/1, or
        a `loss_fn` that does not return a scalar for one row.
      ImportError: `clipping="ghost"` without flax (`pip install "dpnmt[ghost]"`).
    """
    check_clipping(clipping)
    if clipping == "ghost":
        ghost.require_flax()
    elif clipping == AUTO and not ghost.has_flax():
        clipping = "vmap"
    l2_clip = validation.check_positive("l2_clip", l2_clip)
    groups, k = _check_groups(batch, row_mask)
    row_mask = jnp.asarray(row_mask)
    group_mask = jnp.any(row_mask.astype(jnp.float32) != 0, axis=1)
    keys = None
    if dropout_key is not None:
        flat = jax.random.split(dropout_key, groups * k)
        keys = flat.reshape((groups, k) + flat.shape[1:])
    group_batch = (batch, row_mask, keys)

    def group_loss_fn(unrolled: bool):
        group_loss = _group_loss(checked_scalar_loss(loss_fn), dropout_key is not None, unrolled)

        def one_group(params, group):
            rows, mask, group_keys = group
            return group_loss(params, rows, mask, group_keys)

        return one_group

    ghosted = None
    if clipping != "vmap":
        try:
            ghosted = ghost.ghost_clipped_sum(
                group_loss_fn(True), params, group_batch, group_mask, l2_clip, None,
                require_layers=clipping == AUTO,
            )  # fmt: skip
        except ghost.NothingToFactoriseError:
            pass  # "auto" with nothing to factorise: vmap, silently (the same sum).
        except ghost.UNINTERCEPTABLE as error:
            warnings.warn(
                "ghost clipping cannot factorise loss_fn's layers here "
                f"({ghost_trace.fallback_reason(error, '')}); falling back to "
                "per-group gradients (as clipping='vmap': the same sum, G copies of the "
                "gradient in memory).",
                ghost.GhostClippingWarning,
                stacklevel=2,
            )
    if ghosted is not None:
        grad_sum, norms, sums = ghosted
    else:
        sums, grads = jax.vmap(jax.value_and_grad(group_loss_fn(False)), in_axes=(None, 0))(
            params, group_batch
        )
        grad_sum, norms = clip_and_sum(grads, l2_clip=l2_clip, mask=group_mask, params=params)
    counted = group_mask & jnp.isfinite(norms) & jnp.isfinite(sums)
    rows = jnp.sum(jnp.where(counted, jnp.sum(row_mask.astype(jnp.float32) != 0, axis=1), 0))
    total = jnp.sum(jnp.where(counted, sums, 0.0))
    mean_loss = total / jnp.maximum(rows.astype(jnp.float32), 1.0)
    return PrivateGradSum(grad_sum, norms, mean_loss, "vmap" if ghosted is None else "ghost")
