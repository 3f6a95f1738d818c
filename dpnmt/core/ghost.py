"""Book-keeping ("ghost") per-example clipping for losses built from Flax modules.

Each example's gradient norm is assembled layer by layer from what one forward
and one backward pass already compute, without materialising B copies of the
gradient (Li et al. 2022, "ghost clipping"; Bu et al. 2023, "book-keeping"):

- `nn.Dense` and `nn.DenseGeneral` kernels (any `axis` and `features` tuples;
  no `batch_dims`, no custom `dot_general`; flax's `MultiHeadDotProductAttention`
  projects with them): per-example gradient `A_bᵀ G_b`, the input rows
  `A_b [T, d_in]` (contracted axes flattened, T all other axes) and output
  gradient rows `G_b [T, d_out]` (features flattened); squared norm either
  `Σ_{t,s} (A_t·A_s)(G_t·G_s)` (cost `T²(d_in+d_out)`) or the materialised
  `[d_in, d_out]` gradient, whichever is cheaper for the static shapes; the
  clipped sum is reshaped to the kernel. Bias: `Σ_t G_t`.
- `nn.Einsum` when it is a DenseGeneral: kernel axes = contracted input axes,
  then features, output = the input's other axes, then the features, in order
  (`"btd,dhk->bthk"`, `"...hk,hkf->...f"`). Other equations fall back.
- `nn.Conv` (any rank, 1-D and 2-D tested; any strides, padding, input or
  kernel dilation; `feature_group_count=1`, no `mask`, no custom conv), by the
  unfold (im2col) view: `A_b` is the patches `[T_out, window·C_in]` in the
  kernel's `[*window, C_in, C_out]` layout, built by padding and strided slices
  only (exact on every backend, unlike an identity-filter conv that a GPU may
  run in TF32), then as for Dense. Bias: `Σ_t G_t`.
- Subclasses of these modules that keep the base class's `__call__` (and, for
  `nn.Embed`, `setup` and `attend`; for `nn.Conv`, `shared_weights`) are
  recognised too; ones that override it fall back (the rules recompute the
  base call, not the override).
- `nn.Embed` lookups: `onehot(ids)ᵀ G` (the gram of the one-hot rows is
  `[id_t == id_s]`); `nn.Embed.attend` (tied LM heads): `G_logitsᵀ query`.
- A parameter used several times (tied embeddings, shared encoder/decoder
  tables) has the SUM of its uses as per-example gradient; its norm includes
  the cross terms between uses, exactly.
- Every other trainable parameter (`nn.LayerNorm`/`nn.RMSNorm` scales and
  biases, custom modules, any parameter also read outside a recognised call)
  gets ordinary per-example gradients from the same backward pass
  ("fallback"). For vectors (norm scales and biases) that is also the cheapest
  exact method and passes silently; parameters with two or more axes are named
  once in a warning, since they cost B copies.

The output gradients `G` come from one `vmap`-ed backward pass with respect to
zero "perturbations" added to each recognised call's output, so the weights'
own gradients are never formed. The clipped sum is then `Σ_b w_b A_bᵀ G_b`
with `w_b = min(1, C/‖g_b‖)`: one einsum (or scatter-add) per use, no second
backward pass. Recognised calls are found with `flax.linen.intercept_methods`
while `loss_fn` runs: parameters are matched by identity, so `loss_fn` must
hand the trainable leaves to `module.apply` unchanged (merging them with frozen
ones is fine; casting them is not, and only makes them fall back). `loss_fn`
must trace the same way in the analysis and the per-example pass: a handled
leaf read outside a recognised call (`checked_pass`), or a recognised call
whose output shape or dtype is not the analysed one (`check_output`), raises
`PlanMismatchError`.

This module finds the calls and drives the passes; `ghost_layers` recomputes a
recognised call and gives its input rows (or patches); `ghost_norms` holds the
per-layer norm rules and the weighted sums; `ghost_trace` checks the
per-example trace and runs it.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import chex
import jax
import jax.numpy as jnp

from dpnmt.core import clipping

try:  # flax is the optional `ghost` extra: without it, dpnmt.core imports and runs "vmap".
    import flax.linen as nn
except ImportError as error:
    nn, _FLAX_MISSING = None, error
else:
    _FLAX_MISSING = None

# The per-layer norm rules live in ghost_norms; their old private names stay here
# (tests patch `ghost._prefer_ghost`).
from dpnmt.core.ghost_layers import as_tuple as _as_tuple
from dpnmt.core.ghost_layers import dense_axes as _dense_axes
from dpnmt.core.ghost_layers import einsum_axes as _einsum_axes
from dpnmt.core.ghost_layers import forward as _forward
from dpnmt.core.ghost_layers import rows as _rows
from dpnmt.core.ghost_norms import ATTEND as _ATTEND
from dpnmt.core.ghost_norms import CONV as _CONV
from dpnmt.core.ghost_norms import DENSE as _DENSE
from dpnmt.core.ghost_norms import LOOKUP as _LOOKUP
from dpnmt.core.ghost_norms import Use as _Use
from dpnmt.core.ghost_norms import clipped_sum as _clipped_sum
from dpnmt.core.ghost_norms import ghost_squared_norm as _ghost_squared_norm  # noqa: F401
from dpnmt.core.ghost_norms import materialise as _materialise  # noqa: F401
from dpnmt.core.ghost_norms import prefer_ghost as _prefer_ghost
from dpnmt.core.ghost_norms import uses_of as _uses_of
from dpnmt.core.ghost_norms import weighted_sum as _weighted_sum  # noqa: F401
from dpnmt.core.ghost_trace import (
    LeakedInputError,
    NothingToFactoriseError,
    PlanMismatchError,
    abstract_values,
    check_output,
    checked_pass,
    handled_plan,
)
from dpnmt.core.ghost_trace import used_leaves as _used_leaves


class GhostClippingWarning(UserWarning):
    """Ghost clipping falls back to per-example gradients (B copies) for some parameters."""


# Raised while tracing a loss whose module calls cannot be intercepted and
# captured (calls inside `nn.scan`, `nn.vmap` or other lifted transforms, or a
# `jax.checkpoint` closing over the parameters, leak their traced inputs), or
# that traces differently from its analysis: `private_grad.private_grad_sum`
# then falls back to vmap.
UNINTERCEPTABLE = (jax.errors.UnexpectedTracerError, LeakedInputError, PlanMismatchError)
_warned: set[tuple[str, ...]] = set()


def has_flax() -> bool:
    """Whether flax (the `ghost` extra) imports, so that ghost clipping can run."""
    return nn is not None


def require_flax() -> None:
    """Raises ImportError, naming the fix, when flax (the `ghost` extra) cannot be imported."""
    if nn is None:
        raise ImportError(
            'clipping="ghost" needs flax, which `pip install dpnmt` does not '
            'install: run `pip install "dpnmt[ghost]"`, or pass clipping="vmap" (or "auto", '
            "the default, which picks vmap without flax): the same clipped sum from "
            "per-example gradients, all a loss without Flax layers gets from ghost clipping. "
            f"(import flax.linen: {type(_FLAX_MISSING).__name__}: {_FLAX_MISSING})",
            name="flax",
        ) from _FLAX_MISSING


@dataclasses.dataclass(frozen=True)
class _Call:
    """One recognised module call, as seen while tracing one example."""

    path: str
    kind: str  # _DENSE | _CONV | _LOOKUP | _ATTEND
    roles: tuple[tuple[str, int], ...]  # (parameter name, trainable leaf index)
    out_shape: tuple[int, ...]
    out_dtype: Any
    width: int  # Output features per row: the output gradient is [rows, width].


def _params_of(kind: str, module: nn.Module) -> tuple[str, ...]:
    if kind in (_DENSE, _CONV):
        return ("kernel", "bias") if module.use_bias else ("kernel",)
    return ("embedding",)


def _inherits(module: nn.Module, base: type, *methods: str) -> bool:
    """`module` is a `base` whose class keeps `base`'s own `methods`.

    A subclass that overrides them falls back: the rules recompute `base`'s call.
    """
    return isinstance(module, base) and all(
        getattr(type(module), name) is getattr(base, name) for name in methods
    )


def _recognise(context: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
    module, method = context.module, context.method_name
    if method == "__call__" and _inherits(module, nn.Einsum, "__call__"):
        if len(args) == 1 and not kwargs and _einsum_axes(module, jnp.shape(args[0])) is not None:
            return _DENSE
        return None
    if method == "__call__" and _inherits(module, nn.Dense, "__call__"):
        if module.dot_general is None and module.dot_general_cls is None:
            return _DENSE
    if method == "__call__" and _inherits(module, nn.DenseGeneral, "__call__"):
        if (
            module.dot_general is None
            and module.dot_general_cls is None
            and not _as_tuple(module.batch_dims)
        ):
            return _DENSE
    if method == "__call__" and _inherits(module, nn.Conv, "__call__", "shared_weights"):
        if (
            module.feature_group_count == 1
            and module.mask is None
            and module.conv_general_dilated is None
            and module.conv_general_dilated_cls is None
        ):
            return _CONV
    if method in ("__call__", "attend") and _inherits(module, nn.Embed, method, "setup"):
        if module.num_embeddings > 1:
            return _LOOKUP if method == "__call__" else _ATTEND
    return None


class _Interceptor:
    """Runs recognised calls: records them (analysis) or perturbs and captures them."""

    def __init__(
        self,
        leaf_index: dict[int, int] | None = None,
        shadows: Sequence[chex.Array] | None = None,
        plan: Sequence[_Call] | None = None,
        perturbations: Sequence[chex.Array | None] = (),
        leaves: Sequence[chex.Array] = (),
    ):
        self.leaf_index, self.shadows = leaf_index, shadows
        self.plan, self.perturbations, self.leaves = plan, perturbations, leaves
        self.calls: list[_Call] = []
        self.captured: list[chex.Array | None] = []

    def __call__(self, next_fun, args, kwargs, context):
        kind = _recognise(context, args, kwargs)
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
            width = y.shape[-1] if kind != _DENSE else math.prod(_dense_axes(module, x.shape)[1])
            self.calls.append(_Call(path, kind, roles, tuple(y.shape), y.dtype, width))
            return y
        number = len(self.captured)
        if number >= len(self.plan) or self.plan[number].path != path:
            raise PlanMismatchError(
                f"ghost clipping: module call {path!r} does not match the traced plan; "
                "loss_fn must run the same modules in the same order for every example."
            )
        for name, index in self.plan[number].roles:
            if values[name] is not self.leaves[index]:
                raise PlanMismatchError(
                    f"ghost clipping: module {path!r} read other {name!r} values than when it "
                    "was analysed; loss_fn must hand the same parameters to apply each time."
                )
            values[name] = self.shadows[index]
        y = _forward(kind, module, x, values)
        check_output(path, y, self.plan[number].out_shape, self.plan[number].out_dtype)
        perturbation = self.perturbations[number]
        if perturbation is None:
            self.captured.append(None)
            return y
        if kind in (_DENSE, _CONV):
            x = _rows(kind, module, x) if _has_role(self.plan[number], "kernel") else None
        self.captured.append(x)
        return y + perturbation.astype(y.dtype)

    def check_complete(self) -> None:
        if len(self.captured) != len(self.plan):
            raise PlanMismatchError(
                f"ghost clipping: {len(self.captured)} module calls, the plan has {len(self.plan)}."
            )


def _has_role(call: _Call, name: str) -> bool:
    return any(role == name for role, _ in call.roles)


def _analyse(loss_fn, leaves, treedef, example, key) -> tuple[list[_Call], frozenset[int]]:
    """Traces one example: the recognised calls, and the leaves they cover alone."""
    calls: list[_Call] = []

    def traced(leaves, shadows, example, key):
        interceptor = _Interceptor({id(v): i for i, v in enumerate(leaves)}, shadows)
        with nn.intercept_methods(interceptor):
            loss = clipping.call_loss(loss_fn, treedef.unflatten(leaves), example, key)
        calls.extend(interceptor.calls)
        return loss

    abstract = abstract_values(leaves)
    closed = jax.make_jaxpr(traced)(abstract, abstract, example, key)
    read_elsewhere = _used_leaves(closed.jaxpr, len(leaves))
    in_calls = {index for call in calls for _, index in call.roles}
    return calls, frozenset(in_calls - read_elsewhere)


def _warn_fallback(names: Sequence[str]) -> None:
    key = tuple(names)
    if names and key not in _warned:
        _warned.add(key)
        warnings.warn(
            f"ghost clipping: per-example gradients (B copies) for {len(names)} parameter(s) "
            "with two or more axes that it cannot factorise (not used only through nn.Dense, "
            "nn.DenseGeneral, dense-like nn.Einsum, nn.Conv (feature_group_count=1) or "
            f"nn.Embed calls whose class keeps flax's __call__): {', '.join(names)}",
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
    *,
    require_layers: bool = False,
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
      require_layers: raise `NothingToFactoriseError` (after the analysis, before
        any per-example pass) when no parameter is used only through recognised
        calls: `clipping="auto"` then takes the vmap path, which gives that sum.

    Returns:
      `(grad_sum, norms, losses)`: float32 clipped sum (structure of `params`),
      `[B]` unclipped norms (non-finite for non-finite examples), `[B]` losses.

    Raises:
      ImportError: flax is not installed (`pip install "dpnmt[ghost]"`).
    """
    require_flax()
    leaves, treedef = jax.tree_util.tree_flatten(params)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    batch_size = mask.shape[0]
    first, first_key = abstract_values((batch, keys), 1)
    plan, handled = _analyse(loss_fn, leaves, treedef, first, first_key)
    if require_layers and not handled:
        raise NothingToFactoriseError("no parameter is used only through recognised calls")
    fallback = [i for i in range(len(leaves)) if i not in handled]
    plan, zeros = handled_plan(plan, handled)

    def run(full, shadows, perturbations, example, key):
        interceptor = _Interceptor(None, shadows, plan, perturbations, full)
        with nn.intercept_methods(interceptor):
            loss = clipping.call_loss(loss_fn, treedef.unflatten(full), example, key)
        interceptor.check_complete()
        return loss, interceptor.captured

    losses, captured, fallback_grads, out_grads = checked_pass(
        run, leaves, handled, zeros, paths, batch, keys, spmd_axis_name
    )
    # Warned only once the checked pass succeeded (if refused, the caller falls back for all).
    _warn_fallback([paths[i] for i in fallback if leaves[i].ndim >= 2])
    uses: dict[int, list[_Use]] = {i: [] for i in handled}
    for call, x, g in zip(plan, captured, out_grads, strict=True):
        for name, index in call.roles:
            uses[index].append(
                _uses_of(call.kind, name, x, g, batch_size, tuple(leaves[index].shape), call.width)
            )

    sums, norms = _clipped_sum(
        uses, fallback, fallback_grads, leaves, mask, l2_clip, prefer=_prefer_ghost
    )
    return treedef.unflatten(sums), norms, losses
