"""Book-keeping ("ghost") per-example clipping for losses built from Flax modules.

Each example's gradient norm is assembled layer by layer from what one forward
and one backward pass already compute, without materialising B copies of the
gradient (Li et al. 2022, "ghost clipping"; Bu et al. 2023, "book-keeping"):

- `nn.Dense` kernel: per-example gradient `A_bᵀ G_b` (inputs `A_b [T, d_in]`,
  output gradients `G_b [T, d_out]`); squared norm either
  `Σ_{t,s} (A_t·A_s)(G_t·G_s)` (cost `T²(d_in+d_out)`) or the materialised
  `[d_in, d_out]` gradient, whichever is cheaper for the static shapes.
  Bias: `Σ_t G_t`.
- `nn.Embed` lookups: `onehot(ids)ᵀ G` (the gram of the one-hot rows is
  `[id_t == id_s]`); `nn.Embed.attend` (tied LM heads): `G_logitsᵀ query`.
- A parameter used several times (tied embeddings, shared encoder/decoder
  tables) has the SUM of its uses as per-example gradient; its norm includes
  the cross terms between uses, exactly.
- Every other trainable parameter (layer-norm scales and biases, custom
  modules, any parameter also read outside a recognised call) gets ordinary
  per-example gradients from the same backward pass ("fallback"). For vectors
  (norm scales) that is also the cheapest exact method; parameters with two or
  more axes are named once in a warning, since they cost B copies.

The output gradients `G` come from one `vmap`-ed backward pass with respect to
zero "perturbations" added to each recognised call's output, so the weights'
own gradients are never formed. The clipped sum is then `Σ_b w_b A_bᵀ G_b`
with `w_b = min(1, C/‖g_b‖)`: one einsum (or scatter-add) per use, no second
backward pass. Recognised calls are found with `flax.linen.intercept_methods`
while `loss_fn` runs: parameters are matched by identity, so `loss_fn` must
hand the trainable leaves to `module.apply` unchanged (merging them with frozen
ones is fine; casting them is not, and only makes them fall back).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.extend import core as jax_core

from dpnmt.core import clipping

_DENSE, _LOOKUP, _ATTEND = "dense", "lookup", "attend"


class GhostClippingWarning(UserWarning):
    """Ghost clipping falls back to per-example gradients (B copies) for some parameters."""


class PlanMismatchError(RuntimeError):
    """`loss_fn` ran other module calls than those found when it was analysed."""


# Raised while tracing a loss whose module calls cannot be intercepted and
# captured (calls inside `nn.scan`, `nn.vmap` or other lifted transforms leak
# their traced inputs): `private_grad.private_grad_sum` then falls back to vmap.
UNINTERCEPTABLE = (jax.errors.UnexpectedTracerError, PlanMismatchError)
_warned: set[tuple[str, ...]] = set()


@dataclasses.dataclass(frozen=True)
class _Call:
    """One recognised module call, as seen while tracing one example."""

    path: str
    kind: str  # _DENSE | _LOOKUP | _ATTEND
    roles: tuple[tuple[str, int], ...]  # (parameter name, trainable leaf index)
    out_shape: tuple[int, ...]
    out_dtype: Any


def _params_of(kind: str, module: nn.Module) -> tuple[str, ...]:
    if kind == _DENSE:
        return ("kernel", "bias") if module.use_bias else ("kernel",)
    return ("embedding",)


def _recognise(context: Any) -> str | None:
    module, method = context.module, context.method_name
    if type(module) is nn.Dense and method == "__call__":
        if module.dot_general is None and module.dot_general_cls is None:
            return _DENSE
    if type(module) is nn.Embed and module.num_embeddings > 1:
        if method == "__call__":
            return _LOOKUP
        if method == "attend":
            return _ATTEND
    return None


def _forward(kind: str, module: nn.Module, x: chex.Array, params: dict[str, chex.Array]):
    """The recognised call's output, computed as flax computes it."""
    if kind == _DENSE:
        x, kernel, bias = module.promote_dtype(
            x, params["kernel"], params.get("bias"), dtype=module.dtype
        )
        y = jax.lax.dot_general(
            x, kernel, (((x.ndim - 1,), (0,)), ((), ())), precision=module.precision
        )
        if bias is not None:
            y = y + jnp.reshape(bias, (1,) * (y.ndim - 1) + (-1,))
        return y
    if kind == _LOOKUP:
        if not jnp.issubdtype(x.dtype, jnp.integer):
            raise ValueError("Input type must be an integer or unsigned integer.")
        (embedding,) = module.promote_dtype(params["embedding"], dtype=module.dtype, inexact=False)
        return jnp.take(embedding, x, axis=0)
    x, embedding = module.promote_dtype(x, params["embedding"], dtype=module.dtype)
    return jnp.dot(x, embedding.T)


class _Interceptor:
    """Runs recognised calls: records them (analysis) or perturbs and captures them."""

    def __init__(
        self,
        leaf_index: dict[int, int] | None = None,
        shadows: Sequence[chex.Array] | None = None,
        plan: Sequence[_Call] | None = None,
        perturbations: Sequence[chex.Array | None] = (),
    ):
        self.leaf_index, self.shadows = leaf_index, shadows
        self.plan, self.perturbations = plan, perturbations
        self.calls: list[_Call] = []
        self.captured: list[chex.Array | None] = []

    def __call__(self, next_fun, args, kwargs, context):
        kind = _recognise(context)
        if kind is None:
            return next_fun(*args, **kwargs)
        (x,) = tuple(args) + tuple(kwargs.values())
        module = context.module
        values = {name: module.get_variable("params", name) for name in _params_of(kind, module)}
        path = "/".join(module.path) + ("" if kind != _ATTEND else ".attend")
        if self.plan is None:  # Analysis: find trainable leaves, compute with shadows.
            roles = tuple(
                (name, self.leaf_index[id(v)])
                for name, v in values.items()
                if id(v) in self.leaf_index
            )
            for name, index in roles:
                values[name] = self.shadows[index]
            y = _forward(kind, module, x, values)
            self.calls.append(_Call(path, kind, roles, tuple(y.shape), y.dtype))
            return y
        number = len(self.captured)
        if number >= len(self.plan) or self.plan[number].path != path:
            raise PlanMismatchError(
                f"ghost clipping: module call {path!r} does not match the traced plan; "
                "loss_fn must run the same modules in the same order for every example."
            )
        y = _forward(kind, module, x, values)
        perturbation = self.perturbations[number]
        if perturbation is None:
            self.captured.append(None)
            return y
        self.captured.append(
            x if kind != _DENSE or _has_role(self.plan[number], "kernel") else None
        )
        return y + perturbation.astype(y.dtype)

    def check_complete(self) -> None:
        if len(self.captured) != len(self.plan):
            raise PlanMismatchError(
                f"ghost clipping: {len(self.captured)} module calls, the plan has {len(self.plan)}."
            )


def _has_role(call: _Call, name: str) -> bool:
    return any(role == name for role, _ in call.roles)


def _used_leaves(jaxpr: Any, count: int) -> set[int]:
    """Indices of the first `count` inputs that `jaxpr` reads (conservatively)."""
    invars = {v: i for i, v in enumerate(jaxpr.invars[:count])}
    used = set()
    for eqn in jaxpr.eqns:
        used.update(invars[v] for v in eqn.invars if isinstance(v, jax_core.Var) and v in invars)
    used.update(invars[v] for v in jaxpr.outvars if isinstance(v, jax_core.Var) and v in invars)
    return used


def _analyse(loss_fn, leaves, treedef, example, key) -> tuple[list[_Call], frozenset[int]]:
    """Traces one example: the recognised calls, and the leaves they cover alone."""
    calls: list[_Call] = []

    def traced(leaves, shadows, example, key):
        interceptor = _Interceptor({id(v): i for i, v in enumerate(leaves)}, shadows)
        with nn.intercept_methods(interceptor):
            loss = clipping.call_loss(loss_fn, treedef.unflatten(leaves), example, key)
        calls.extend(interceptor.calls)
        return loss

    abstract = [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in leaves]
    closed = jax.make_jaxpr(traced)(abstract, abstract, example, key)
    read_elsewhere = _used_leaves(closed.jaxpr, len(leaves))
    in_calls = {index for call in calls for _, index in call.roles}
    return calls, frozenset(in_calls - read_elsewhere)


# Full float32 for the norms and the clipped sum: on GPUs the default float32
# matmul may run in TF32, and a norm that undershoots lets an example's
# contribution to the sum exceed C.
_EXACT = jax.lax.Precision.HIGHEST


@dataclasses.dataclass(frozen=True)
class _Use:
    """One use of a handled leaf: its per-example gradient is `Xᵀ Y` or `direct`."""

    kind: str  # "factor" | "ids" | "direct"
    x: chex.Array | None  # [B, T, n] dense rows, or [B, T] int ids (kind "ids")
    y: chex.Array  # [B, T, m]; for "direct" the per-example gradient [B, *shape]


def _uses_of(call: _Call, name: str, captured, grad, batch: int, shape) -> _Use:
    g = grad.astype(jnp.float32).reshape(batch, -1, grad.shape[-1])
    if call.kind == _DENSE and name == "bias":
        return _Use("direct", None, jnp.sum(g, axis=1))
    if call.kind == _DENSE:
        x = captured.astype(jnp.float32)
        return _Use("factor", x.reshape(batch, -1, x.shape[-1]), g)
    if call.kind == _LOOKUP:
        ids = jnp.broadcast_to(captured, (batch,) + captured.shape[1:]).reshape(batch, -1)
        ids, g = _normalise_ids(ids, g, shape[0])
        return _Use("ids", ids, g)
    q = captured.astype(jnp.float32)
    return _Use("factor", g, q.reshape(batch, -1, q.shape[-1]))


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


def _materialise(use: _Use, shape: tuple[int, ...]) -> chex.Array:
    """Per-example gradients [B, *shape] of one use."""
    if use.kind == "direct":
        return use.y.reshape((use.y.shape[0],) + shape)
    if use.kind == "factor":
        return jnp.einsum("btn,btm->bnm", use.x, use.y, precision=_EXACT)

    def one(ids, y):
        return jnp.zeros(shape, jnp.float32).at[ids].add(y)

    return jax.vmap(one)(use.x, use.y)


def _gram_x(a: _Use, b: _Use) -> chex.Array:
    """[B, Ta, Tb] inner products of the X rows of two uses."""
    if a.kind == "ids" and b.kind == "ids":
        return (a.x[:, :, None] == b.x[:, None, :]).astype(jnp.float32)
    if a.kind == "ids":  # onehot(id_t) · X_s = X_s[id_t]
        return jnp.swapaxes(jax.vmap(lambda xb, ids: xb[:, ids])(b.x, a.x), 1, 2)
    if b.kind == "ids":
        return jax.vmap(lambda xa, ids: xa[:, ids])(a.x, b.x)
    return jnp.einsum("btn,bsn->bts", a.x, b.x, precision=_EXACT)


def _ghost_squared_norm(uses: Sequence[_Use], rows: int) -> chex.Array:
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


# float32 unit roundoff; S below 64 ε P counts as cancelled (`_ghost_squared_norm`).
_U = 2.0**-24
_CANCELLATION = 64.0


def _gamma(terms: int) -> float:
    """Higham's γ_k = k u / (1 - k u), with k doubled for headroom."""
    k = 2 * terms * _U
    if k >= 0.5:
        raise ValueError(f"ghost clipping: {terms} float32 terms per sum are too many to bound.")
    return k / (1.0 - k)


def _prefer_ghost(uses: Sequence[_Use], shape: tuple[int, ...]) -> bool:
    """Static choice: the ghost norm is cheaper than materialising [B, *shape]."""
    if any(use.kind == "direct" for use in uses):
        return False
    tokens = sum(use.y.shape[1] for use in uses)
    width = max(use.y.shape[2] + (0 if use.kind == "ids" else use.x.shape[2]) for use in uses)
    return tokens * tokens * width < tokens * math.prod(shape)


def _weighted_sum(use: _Use, weights: chex.Array, shape: tuple[int, ...]) -> chex.Array:
    """Σ_b w_b (X_bᵀ Y_b) for one use, rows with w_b = 0 contributing exactly zero."""
    keep = (weights != 0)[:, None, None]
    y = jnp.where(keep, use.y * weights[:, None, None], 0.0)
    if use.kind == "factor":
        return jnp.einsum("btn,btm->nm", jnp.where(keep, use.x, 0.0), y, precision=_EXACT)
    return jnp.zeros(shape, jnp.float32).at[use.x.reshape(-1)].add(y.reshape(-1, shape[-1]))


def _warn_fallback(names: Sequence[str]) -> None:
    key = tuple(names)
    if names and key not in _warned:
        _warned.add(key)
        warnings.warn(
            f"ghost clipping: per-example gradients (B copies) for {len(names)} parameter(s) "
            f"with two or more axes that it cannot factorise (not used only through nn.Dense "
            f"or nn.Embed calls): {', '.join(names)}",
            GhostClippingWarning,
            stacklevel=4,
        )


def ghost_clipped_sum(
    loss_fn: Callable[..., chex.Array],
    params: chex.ArrayTree,
    batch: Any,
    mask: chex.Array,
    l2_clip: float,
    keys: chex.Array | None,
    spmd_axis_name: str | None = None,
) -> tuple[chex.ArrayTree, chex.Array, chex.Array]:
    """Clipped sum, norms and losses of one batch by book-keeping.

    Args:
      loss_fn: as for `private_grad.private_grad_sum`; it must compute its loss by
        applying Flax modules to the parameters it is given.
      params: trainable parameters (pytree).
      batch: pytree, every leaf `[B, ...]`.
      mask: `[B]`, 0 for padding rows.
      l2_clip: clipping norm C > 0.
      keys: `[B]` per-example keys, or None (then `loss_fn` takes no key).
      spmd_axis_name: passed to `jax.vmap`.

    Returns:
      `(grad_sum, norms, losses)`: float32 clipped sum (structure of `params`),
      `[B]` unclipped norms (non-finite for non-finite examples), `[B]` losses.
    """
    leaves, treedef = jax.tree_util.tree_flatten(params)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    batch_size = mask.shape[0]
    first = jax.tree_util.tree_map(lambda v: jax.ShapeDtypeStruct(v.shape[1:], v.dtype), batch)
    first_key = None if keys is None else jax.ShapeDtypeStruct(keys.shape[1:], keys.dtype)
    plan, handled = _analyse(loss_fn, leaves, treedef, first, first_key)
    fallback = [i for i in range(len(leaves)) if i not in handled]
    _warn_fallback([paths[i] for i in fallback if leaves[i].ndim >= 2])
    plan = [
        dataclasses.replace(call, roles=tuple(r for r in call.roles if r[1] in handled))
        for call in plan
    ]
    zeros = [jnp.zeros(c.out_shape, c.out_dtype) if c.roles else None for c in plan]

    def per_example(diff, example, key):
        fallback_leaves, perturbations = diff
        full = list(leaves)
        for index, leaf in zip(fallback, fallback_leaves, strict=True):
            full[index] = leaf
        interceptor = _Interceptor(plan=plan, perturbations=perturbations)
        with nn.intercept_methods(interceptor):
            loss = clipping.call_loss(loss_fn, treedef.unflatten(full), example, key)
        interceptor.check_complete()
        return loss, interceptor.captured

    grad_fn = jax.value_and_grad(per_example, has_aux=True)
    in_axes = (None, 0, None if keys is None else 0)
    diff = ([leaves[i] for i in fallback], zeros)
    (losses, captured), (fallback_grads, out_grads) = jax.vmap(
        grad_fn, in_axes=in_axes, spmd_axis_name=spmd_axis_name
    )(diff, batch, keys)

    uses: dict[int, list[_Use]] = {i: [] for i in handled}
    for call, x, g in zip(plan, captured, out_grads, strict=True):
        for name, index in call.roles:
            uses[index].append(_uses_of(call, name, x, g, batch_size, tuple(leaves[index].shape)))

    squared = jnp.zeros((batch_size,), jnp.float32)
    materialised = {}
    for index in sorted(handled):
        shape = tuple(leaves[index].shape)
        if _prefer_ghost(uses[index], shape):
            squared = squared + _ghost_squared_norm(uses[index], batch_size)
        else:
            grads = sum(_materialise(u, shape) for u in uses[index])
            materialised[index] = grads
            squared = squared + jnp.sum(jnp.square(grads.reshape(batch_size, -1)), axis=1)
    for grads in fallback_grads:
        flat = grads.astype(jnp.float32).reshape(batch_size, -1)
        squared = squared + jnp.sum(jnp.square(flat), axis=1)
    norms = jnp.sqrt(squared)

    keep, weights = clipping.clip_factors(norms, l2_clip, mask)

    def weighted(grads):
        row = keep.reshape((-1,) + (1,) * (grads.ndim - 1))
        scaled = grads.astype(jnp.float32) * weights.reshape(row.shape)
        return jnp.sum(jnp.where(row, scaled, 0.0), axis=0)

    sums = [None] * len(leaves)
    for index, grads in zip(fallback, fallback_grads, strict=True):
        sums[index] = weighted(grads)
    for index in handled:
        shape = tuple(leaves[index].shape)
        if index in materialised:
            sums[index] = weighted(materialised[index])
        else:
            sums[index] = sum(_weighted_sum(u, weights, shape) for u in uses[index])
    sums = [
        s.astype(jnp.promote_types(v.dtype, jnp.float32)) for s, v in zip(sums, leaves, strict=True)
    ]
    return treedef.unflatten(sums), norms, losses
