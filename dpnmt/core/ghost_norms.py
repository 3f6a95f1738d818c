"""Per-layer norm rules of book-keeping ("ghost") clipping: see `dpnmt.core.ghost`.

For one trainable leaf, the per-example gradient is a sum of uses `X_bᵀ Y_b`
(a dense or conv kernel, as rows: the kernel's gradient is `[n, m]`, reshaped
to its own shape by the caller; an embedding lookup or an `attend`) or a direct
`[B, *shape]` gradient. This module gives, per leaf: the uses (`uses_of`), the static choice
between the ghost norm and materialising (`prefer_ghost`), the ghost squared norm
with its float32 error bound (`ghost_squared_norm`), the materialised gradients
(`materialise`) and the weighted clipped sum (`weighted_sum`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import chex
import jax
import jax.numpy as jnp

from dpnmt.core import clipping

# The recognised module calls.
DENSE, CONV, LOOKUP, ATTEND = "dense", "conv", "lookup", "attend"


# Full float32 for the norms and the clipped sum: on GPUs the default float32
# matmul may run in TF32, and a norm that undershoots lets an example's
# contribution to the sum exceed C.
_EXACT = jax.lax.Precision.HIGHEST


@dataclasses.dataclass(frozen=True)
class Use:
    """One use of a handled leaf: its per-example gradient is `Xᵀ Y` or `direct`."""

    kind: str  # "factor" | "ids" | "direct"
    x: chex.Array | None  # [B, T, n] dense rows, or [B, T] int ids (kind "ids")
    y: chex.Array  # [B, T, m]; for "direct" the per-example gradient [B, *shape]


def uses_of(kind: str, name: str, captured, grad, batch: int, shape, width: int) -> Use:
    """The use of leaf role `name` in one recognised call of `kind` (per-example `Xᵀ Y`).

    Dense and conv calls arrive as rows: `captured [B, T, n]` (the inputs, or the
    patches of a convolution) and `grad [B, ...]`, read as `[B, T, width]`.
    """
    g = grad.astype(jnp.float32).reshape(batch, -1, width)
    if kind in (DENSE, CONV) and name == "bias":
        return Use("direct", None, jnp.sum(g, axis=1))
    if kind in (DENSE, CONV):
        x = captured.astype(jnp.float32)
        return Use("factor", x.reshape(batch, -1, x.shape[-1]), g)
    if kind == LOOKUP:
        ids = jnp.broadcast_to(captured, (batch,) + captured.shape[1:]).reshape(batch, -1)
        ids, g = _normalise_ids(ids, g, shape[0])
        return Use("ids", ids, g)
    q = captured.astype(jnp.float32)
    return Use("factor", g, q.reshape(batch, -1, q.shape[-1]))


def _normalise_ids(ids: chex.Array, g: chex.Array, rows: int) -> tuple[chex.Array, chex.Array]:
    """Ids as the lookup reads them, and output gradients of the rows it reads.

    `jnp.take` (hence `nn.Embed`) wraps ids in [-V, 0) to id + V, and fills ids
    outside [-V, V) with NaN; its gradient drops those. Comparing raw ids would
    miss that -1 and V-1 hit the same row (a norm that undershoots); so negative
    ids are wrapped here, and out-of-range ids get a zero output gradient (the
    gradient they receive) and id 0.
    """
    ids = jnp.where(ids < 0, ids + rows, ids)
    valid = (ids >= 0) & (ids < rows)
    return jnp.where(valid, ids, 0), jnp.where(valid[..., None], g, 0.0)


def materialise(use: Use, shape: tuple[int, ...]) -> chex.Array:
    """Per-example gradients [B, *shape] of one use."""
    if use.kind == "direct":
        return use.y.reshape((use.y.shape[0],) + shape)
    if use.kind == "factor":
        return jnp.einsum("btn,btm->bnm", use.x, use.y, precision=_EXACT)

    def one(ids, y):
        return jnp.zeros(shape, jnp.float32).at[ids].add(y)

    return jax.vmap(one)(use.x, use.y)


def _gram_x(a: Use, b: Use) -> chex.Array:
    """[B, Ta, Tb] inner products of the X rows of two uses."""
    if a.kind == "ids" and b.kind == "ids":
        return (a.x[:, :, None] == b.x[:, None, :]).astype(jnp.float32)
    if a.kind == "ids":  # onehot(id_t) · X_s = X_s[id_t]
        return jnp.swapaxes(jax.vmap(lambda xb, ids: xb[:, ids])(b.x, a.x), 1, 2)
    if b.kind == "ids":
        return jax.vmap(lambda xa, ids: xa[:, ids])(a.x, b.x)
    return jnp.einsum("btn,bsn->bts", a.x, b.x, precision=_EXACT)


def ghost_squared_norm(uses: Sequence[Use], rows: int) -> chex.Array:
    """[B] squared norm of Σ_u X_uᵀ Y_u, cross terms included, never too small.

    The gram sum `S = Σ_{t,s} (X_t·X_s)(Y_t·Y_s)` can cancel: two tokens sharing
    a large input with nearly opposite output gradients have a small gradient
    that float32 computes as ~0 (or worse, a few percent low), while the clipped
    sum still adds it in full. Alongside S this computes
    `P = Σ_{t,s} |(X_t·X_s)(Y_t·Y_s)|` (the scale of S's rounding error) and
    `R = Σ_t ‖X_t‖‖Y_t‖` (no cancellation: R >= the norm, by the triangle
    inequality).

    Formal guarantee: with `ε = (⌈log2 T²⌉ + ⌈log2 d⌉ + 4) u` (u = 2**-24, T the
    tokens of all uses, d the widest X plus Y row), the result is

    - `(R (1 + γ))²` where `S < 64 ε P` (cancellation): a rigorous bound on
      the squared norm of what the clipped sum adds, `fl(Σ_t X_t ⊗ w Y_t) / w`,
      whatever the order of XLA's sums (each float32 sum of k terms lies within
      γ_k = k u / (1 - k u) of the sum of absolute values; k counts every
      rounding from the rows to the norm);
    - `S + ε P` elsewhere: an upper bound whenever the computed S errs by less
      than ε P, the error of pairwise or blocked float32 accumulation (XLA's) of
      the grams and of their sum. It exceeds S by at most 1/64 there, and by
      ε P / S (~1e-6 for non-adversarial inputs) typically.

    Args:
      uses: the uses of one parameter (none "direct").
      rows: B, the batch rows (the clipped sum runs over all of them).

    Returns:
      float32 `[B]`.
    """
    gram_sum, gram_abs, reach = 0.0, 0.0, 0.0
    for i, a in enumerate(uses):
        for j in range(i, len(uses)):
            b = uses[j]
            terms = _gram_x(a, b) * jnp.einsum("btm,bsm->bts", a.y, b.y, precision=_EXACT)
            weight = 1.0 if i == j else 2.0
            gram_sum = gram_sum + weight * jnp.sum(terms, axis=(1, 2))
            gram_abs = gram_abs + weight * jnp.sum(jnp.abs(terms), axis=(1, 2))
        x_norms = 1.0 if a.kind == "ids" else jnp.linalg.norm(a.x, axis=-1)
        reach = reach + jnp.sum(x_norms * jnp.linalg.norm(a.y, axis=-1), axis=1)
    tokens = sum(u.y.shape[1] for u in uses)
    width = max(u.y.shape[2] + (0 if u.kind == "ids" else u.x.shape[2]) for u in uses)
    slack = (math.ceil(math.log2(max(tokens * tokens, 2))) + math.ceil(math.log2(width)) + 4) * _U
    # Every rounding between the rows and R(1+γ): the B·T-term weighted sum, the
    # row norms, their T-term sum, the uses, the weights and the square root.
    gamma = _gamma(rows * tokens + width + tokens + 4 * len(uses) + 16)
    cancels = gram_sum < _CANCELLATION * slack * gram_abs
    bound = jnp.square(reach * (1.0 + gamma))
    return jnp.where(cancels, bound, gram_sum + slack * gram_abs)


# float32 unit roundoff; S below 64 ε P counts as cancelled (`ghost_squared_norm`).
_U = 2.0**-24
_CANCELLATION = 64.0


def _gamma(terms: int) -> float:
    """Higham's γ_k = k u / (1 - k u), with k doubled for headroom."""
    k = 2 * terms * _U
    if k >= 0.5:
        raise ValueError(f"ghost clipping: {terms} float32 terms per sum are too many to bound.")
    return k / (1.0 - k)


def prefer_ghost(uses: Sequence[Use], shape: tuple[int, ...]) -> bool:
    """Static choice: the ghost norm is cheaper than materialising [B, *shape]."""
    if any(use.kind == "direct" for use in uses):
        return False
    tokens = sum(use.y.shape[1] for use in uses)
    width = max(use.y.shape[2] + (0 if use.kind == "ids" else use.x.shape[2]) for use in uses)
    return tokens * tokens * width < tokens * math.prod(shape)


def weighted_sum(use: Use, weights: chex.Array, shape: tuple[int, ...]) -> chex.Array:
    """Σ_b w_b (X_bᵀ Y_b) for one use, rows with w_b = 0 contributing exactly zero."""
    keep = (weights != 0)[:, None, None]
    y = jnp.where(keep, use.y * weights[:, None, None], 0.0)
    if use.kind == "factor":
        return jnp.einsum("btn,btm->nm", jnp.where(keep, use.x, 0.0), y, precision=_EXACT)
    return jnp.zeros(shape, jnp.float32).at[use.x.reshape(-1)].add(y.reshape(-1, shape[-1]))


def clipped_sum(uses, fallback, fallback_grads, leaves, mask, l2_clip, prefer=prefer_ghost):
    """Per-example norms and the clip-weighted sums of a ghost pass (linen and NNX alike).

    Args:
      uses: leaf index -> its `Use`s, for every leaf handled by recognised calls.
      fallback: leaf indices that got per-example gradients instead.
      fallback_grads: their per-example gradients, `[B, *leaf shape]` each.
      leaves: the trainable leaves (their shapes and dtypes shape the sums).
      mask: `[B]` 0/1; padding rows get weight exactly 0.
      l2_clip: C.
      prefer: `prefer_ghost` or a replacement (tests force either norm rule).

    Returns:
      `(sums, norms)`: a float32-or-wider sum per leaf (list, in leaf order) and
      the float32 `[B]` norms, raised by the float32 rounding bound of the
      materialised and fallback sums of squares (the ghost norms carry their
      own allowance): a norm computed low would let a clipped row exceed C.
      Both PRIVATE.
    """
    batch_size = mask.shape[0]
    squared = jnp.zeros((batch_size,), jnp.float32)
    materialised = {}
    for index in sorted(uses):
        shape = tuple(leaves[index].shape)
        if prefer(uses[index], shape):
            squared = squared + ghost_squared_norm(uses[index], batch_size)
        else:
            grads = sum(materialise(u, shape) for u in uses[index])
            materialised[index] = grads
            squared = squared + jnp.sum(jnp.square(grads.reshape(batch_size, -1)), axis=1)
    for grads in fallback_grads:
        flat = grads.astype(jnp.float32).reshape(batch_size, -1)
        squared = squared + jnp.sum(jnp.square(flat), axis=1)
    summed = [math.prod(g.shape[1:]) for g in [*materialised.values(), *fallback_grads]]
    norms = jnp.sqrt(squared) * clipping.norm_rounding_factor(
        max(summed, default=1), len(uses) + len(fallback_grads)
    )
    keep, weights = clipping.clip_factors(norms, l2_clip, mask)

    sums = [None] * len(leaves)
    for index, grads in zip(fallback, fallback_grads, strict=True):
        sums[index] = clipping.weighted_row_sum(grads, weights, keep)
    for index in uses:
        shape = tuple(leaves[index].shape)
        if index in materialised:
            sums[index] = clipping.weighted_row_sum(materialised[index], weights, keep)
        else:
            sums[index] = sum(weighted_sum(u, weights, shape) for u in uses[index])
    sums = [
        s.reshape(v.shape).astype(jnp.promote_types(v.dtype, jnp.float32))
        for s, v in zip(sums, leaves, strict=True)
    ]
    return sums, norms
