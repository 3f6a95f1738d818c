"""Book-keeping ("ghost") per-example clipping for losses of Flax NNX models.

The NNX counterpart of `dpnmt.core.ghost` (Flax linen), with the same norm
rules (`dpnmt.core.ghost_norms`), rounding allowances and fallback:

- `nnx.Linear` kernel `A_bᵀ G_b` and bias `Σ_t G_t`; `nnx.Embed` lookups
  `onehot(ids)ᵀ G` and `nnx.Embed.attend` (tied LM heads) `G_logitsᵀ query`.
  A parameter used several times (a tied table) has the sum of its uses as
  per-example gradient, cross terms included.
- Every other trainable parameter (layer-norm scales, `nnx.Einsum`, subclasses
  of `nnx.Linear`, a parameter also read outside a recognised call) gets
  ordinary per-example gradients from the same backward pass; those with two or
  more axes are named once in a `ghost.GhostClippingWarning`.

Finding the calls. NNX has no `intercept_methods`, and patching
`nnx.Linear.__call__` on the class would change every model in the process
(other threads included) while a trace runs. Instead, each trace works on its
own copy of the model (`nnx.merge` of the split state, as `nnx.grad` does), and
the nodes of that copy whose type is exactly `nnx.Linear` (default
`dot_general`) or `nnx.Embed` are re-classed to subclasses whose methods report
to the recorder of the current trace (a context variable). Nothing outside the
private copy changes; `isinstance` still holds inside `loss_fn` (but
`type(layer) is nnx.Linear` does not). Parameters are matched by identity: a
recognised call counts for a parameter only if it reads the very array that
was merged in (an `nnx.Param` that `loss_fn` reassigns or that stores a
`Ref` simply falls back).

Stateful randomness: `loss_fn` runs on a fresh copy per trace, so mutations it
makes to the model (batch statistics) are discarded; an `nnx.Dropout` drawing
from an `nnx.Rngs` held by the model fails with flax's `TraceContextError`
(its counter cannot be mutated there). Pass `dropout_key=` and build
per-example randomness from the key `loss_fn` receives instead (e.g.
`model.dropout(x, rngs=nnx.Rngs(dropout=key))`).

`loss_fn` is traced twice (the analysis, then the per-example pass) and must
trace the same way both times; this is enforced (`ghost_trace.checked_pass`,
shared with linen). The per-example pass is traced once, for one example, with
each handled parameter (read only through recognised calls in the analysis) as
two explicit jaxpr inputs: the "real" one the model holds and the "shadow" the
recognised calls compute with. If the jaxpr reads a real one, say because
Python state (a call counter, a cache) made `loss_fn` read a kernel directly
this time, whose gradient term would be missing from the norm and the sum,
`PlanMismatchError` names the parameter (`private_grad_sum_nnx` then falls
back to vmap clipping); so does a recognised call whose output shape or
dtype is not the analysed one (`ghost_trace.check_output`). Otherwise that
same checked jaxpr is what runs under `jax.vmap(jax.value_and_grad(...))`: no
third trace that could differ.
"""

from __future__ import annotations

import contextvars
import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import chex
import jax
import jax.numpy as jnp

from dpnmt.core import clipping, ghost, ghost_trace
from dpnmt.core.ghost import GhostClippingWarning, PlanMismatchError
from dpnmt.core.ghost_norms import (
    ATTEND,
    DENSE,
    LOOKUP,
    clipped_sum,
    prefer_ghost,
    uses_of,
)
from dpnmt.core.ghost_norms import Use as _Use

try:  # flax is the optional `ghost` extra.
    from flax import nnx
except ImportError:  # pragma: no cover - exercised by the packaging tests
    nnx = None

# The recorder of the trace now running, read by the re-classed layers.
_RECORDER: contextvars.ContextVar[_Recorder | None] = contextvars.ContextVar(
    "dpnmt_ghost_nnx_recorder", default=None
)
_warned: set[tuple[str, ...]] = set()


@dataclasses.dataclass(frozen=True)
class _Call:
    """One recognised layer call, as seen while tracing one example."""

    path: str
    kind: str  # DENSE | LOOKUP | ATTEND
    roles: tuple[tuple[str, int], ...]  # (parameter name, trainable leaf index)
    out_shape: tuple[int, ...]
    out_dtype: Any


def _forward(kind: str, layer: Any, x: chex.Array, values: dict[str, chex.Array]) -> chex.Array:
    """The recognised call's output, computed as flax 0.12 computes it; `x` already promoted."""
    if kind == DENSE:
        extra = {}
        if layer.preferred_element_type is not None:
            extra["preferred_element_type"] = layer.preferred_element_type
        y = jax.lax.dot_general(
            x,
            values["kernel"],
            (((x.ndim - 1,), (0,)), ((), ())),
            precision=layer.precision,
            **extra,
        )
        if "bias" in values:
            y = y + jnp.reshape(values["bias"], (1,) * (y.ndim - 1) + (-1,))
        return y
    if kind == LOOKUP:
        return jnp.take(values["embedding"], x, axis=0)
    return jnp.dot(x, values["embedding"].T)


def _promote(kind: str, layer: Any, x: chex.Array, values: dict[str, chex.Array]):
    """(x, values) after the layer's own `promote_dtype`, as its method does."""
    if kind == DENSE:
        x, kernel, bias = layer.promote_dtype(
            (x, values["kernel"], values.get("bias")), dtype=layer.dtype
        )
        return x, {"kernel": kernel} | ({} if bias is None else {"bias": bias})
    if kind == LOOKUP:
        if not jnp.issubdtype(x.dtype, jnp.integer):
            raise ValueError("Input type must be an integer or unsigned integer.")
        (table,) = layer.promote_dtype((values["embedding"],), dtype=layer.dtype, inexact=False)
        return x, {"embedding": table}
    x, table = layer.promote_dtype((x, values["embedding"]), dtype=layer.dtype)
    return x, {"embedding": table}


class _Recorder:
    """Runs recognised calls: records them (analysis) or perturbs and captures them."""

    def __init__(
        self,
        paths: dict[int, str],
        leaf_index: dict[int, int] | None = None,
        shadows: Sequence[chex.Array] | None = None,
        plan: Sequence[_Call] | None = None,
        perturbations: Sequence[chex.Array | None] = (),
        leaves: Sequence[chex.Array] = (),
    ):
        self.paths, self.leaf_index, self.shadows = paths, leaf_index, shadows
        self.plan, self.perturbations, self.leaves = plan, perturbations, leaves
        self.calls: list[_Call] = []
        self.inputs: list[chex.Array] = []  # analysis: each call's input, an output of the trace
        self.captured: list[chex.Array | None] = []

    def run(self, kind: str, layer: Any, x: chex.Array) -> chex.Array:
        if kind == DENSE:
            variables = {"kernel": layer.kernel, "bias": layer.bias}
        else:
            variables = {"embedding": layer.embedding}
        values = {name: v.get_value() for name, v in variables.items() if v is not None}
        path = self.paths.get(id(layer), "?") + (".attend" if kind == ATTEND else "")
        if self.plan is None:  # Analysis: find trainable leaves, compute with shadows.
            roles = tuple(
                (name, self.leaf_index[id(value)])
                for name, value in values.items()
                if id(value) in self.leaf_index
            )
            for name, index in roles:
                values[name] = self.shadows[index]
            x, values = _promote(kind, layer, x, values)
            y = _forward(kind, layer, x, values)
            self.calls.append(_Call(path, kind, roles, tuple(y.shape), y.dtype))
            if roles:  # only these inputs are captured later
                self.inputs.append(x)
            return y
        number = len(self.captured)
        if number >= len(self.plan) or self.plan[number].path != path:
            raise PlanMismatchError(
                f"ghost clipping: layer call {path!r} does not match the traced plan; "
                "loss_fn must run the same layers in the same order for every example."
            )
        call = self.plan[number]
        if any(values[name] is not self.leaves[index] for name, index in call.roles):
            raise PlanMismatchError(
                f"ghost clipping: layer {path!r} read other parameter values than when it was "
                "analysed; loss_fn must not reassign the model's parameters."
            )
        for name, index in call.roles:
            values[name] = self.shadows[index]
        x, values = _promote(kind, layer, x, values)
        y = _forward(kind, layer, x, values)
        ghost_trace.check_output(path, y, call.out_shape, call.out_dtype)
        perturbation = self.perturbations[number]
        if perturbation is None:
            self.captured.append(None)
            return y
        has_kernel = any(name == "kernel" for name, _ in call.roles)
        self.captured.append(x if kind != DENSE or has_kernel else None)
        return y + perturbation.astype(y.dtype)

    def check_complete(self) -> None:
        if len(self.captured) != len(self.plan):
            raise PlanMismatchError(
                f"ghost clipping: {len(self.captured)} layer calls, the plan has {len(self.plan)}."
            )


def _recorded(kind: str, layer: Any, x: chex.Array, out_sharding: Any, original: Callable):
    recorder = _RECORDER.get()
    if recorder is None or out_sharding is not None:
        return original(layer, x, out_sharding=out_sharding)
    return recorder.run(kind, layer, x)


if nnx is not None:

    class _GhostLinear(nnx.Linear):
        """`nnx.Linear` whose calls report to the current recorder (private copies only)."""

        def __call__(self, inputs, out_sharding=None):
            return _recorded(DENSE, self, inputs, out_sharding, nnx.Linear.__call__)

    class _GhostEmbed(nnx.Embed):
        """`nnx.Embed` whose lookups and `attend` report to the current recorder."""

        def __call__(self, inputs, out_sharding=None):
            return _recorded(LOOKUP, self, inputs, out_sharding, nnx.Embed.__call__)

        def attend(self, query, out_sharding=None):
            return _recorded(ATTEND, self, query, out_sharding, nnx.Embed.attend)


def _recognise(node: Any) -> type | None:
    """The re-classed type for a node ghost clipping factorises, else None."""
    if type(node) is nnx.Linear and node.dot_general is jax.lax.dot_general:
        if node.kernel is not None and node.kernel.get_value().ndim == 2:
            return _GhostLinear
    if type(node) is nnx.Embed and node.num_embeddings > 1:
        return _GhostEmbed
    return None


def _private_copy(graphdef, state, rest) -> tuple[Any, dict[int, str]]:
    """A fresh model whose recognised layers report to the recorder, and their paths."""
    model = nnx.merge(graphdef, state, *rest)
    paths = {}
    for path, node in nnx.iter_graph(model):
        ghost_type = _recognise(node)
        if ghost_type is not None:
            node.__class__ = ghost_type
            paths[id(node)] = "/".join(str(p) for p in path)
    return model, paths


def _run_loss(loss_fn, model, recorder, example, key):
    token = _RECORDER.set(recorder)
    try:
        return clipping.call_loss(loss_fn, model, example, key)
    finally:
        _RECORDER.reset(token)


def _analyse(loss_fn, graphdef, treedef, rest, leaves, example, key):
    """Traces one example: the recognised calls, and the leaves they cover alone."""
    calls: list[_Call] = []

    def traced(leaves, shadows, example, key):
        model, paths = _private_copy(graphdef, treedef.unflatten(leaves), rest)
        recorder = _Recorder(paths, {id(v): i for i, v in enumerate(leaves)}, shadows)
        loss = _run_loss(loss_fn, model, recorder, example, key)
        calls.extend(recorder.calls)
        return loss, recorder.inputs  # outputs, so that `check_not_leaked` sees them

    abstract = ghost_trace.abstract_values(leaves)
    closed = jax.make_jaxpr(traced)(abstract, abstract, example, key)
    ghost_trace.check_not_leaked(closed)
    read_elsewhere = ghost_trace.used_leaves(closed.jaxpr, len(leaves))
    in_calls = {index for call in calls for _, index in call.roles}
    return calls, frozenset(in_calls - read_elsewhere)


def _warn_fallback(names: Sequence[str]) -> None:
    key = tuple(names)
    if names and key not in _warned:
        _warned.add(key)
        warnings.warn(
            f"ghost clipping: per-example gradients (B copies) for {len(names)} parameter(s) "
            f"with two or more axes that it cannot factorise (not used only through nnx.Linear "
            f"or nnx.Embed calls): {', '.join(names)}",
            GhostClippingWarning,
            stacklevel=4,
        )


def split_model(model: Any, wrt: Any):
    """(graphdef, trainable state, other states) of a module or a `(graphdef, *states)` tuple."""
    if isinstance(model, tuple):
        model = nnx.merge(*model)
    if not isinstance(model, nnx.Module):
        raise TypeError(
            f"model must be an nnx.Module or a (graphdef, *states) tuple from nnx.split, "
            f"not {type(model).__name__}; for Flax linen use private_grad_sum."
        )
    graphdef, state, *rest = nnx.split(model, wrt, ...)
    return graphdef, state, tuple(rest)


def ghost_clipped_sum_nnx(
    loss_fn: Callable[..., chex.Array],
    model: Any,
    batch: Any,
    mask: chex.Array,
    l2_clip: float,
    keys: chex.Array | None,
    spmd_axis_name: str | None = None,
    *,
    wrt: Any = None,
    require_layers: bool = False,
) -> tuple[Any, chex.Array, chex.Array]:
    """Clipped sum, norms and losses of one batch by book-keeping (NNX `ghost.ghost_clipped_sum`).

    Args:
      loss_fn: `loss_fn(model, example)` (or `loss_fn(model, example, key)` when
        `keys` is given) -> scalar loss of ONE example, computed by calling the
        layers of the model it is given.
      model: an `nnx.Module`, or the `(graphdef, *states)` of `nnx.split`.
      batch: pytree, every leaf `[B, ...]`.
      mask: `[B]`, 0 for padding rows.
      l2_clip: clipping norm C > 0.
      keys: `[B]` per-example keys, or None.
      spmd_axis_name: passed to `jax.vmap`.
      wrt: NNX filter of the trainable variables (default `nnx.Param`).
      require_layers: as in `ghost.ghost_clipped_sum` (`clipping="auto"`).

    Returns:
      `(grad_sum, norms, losses)`: the float32 clipped sum as an `nnx.State`
      shaped like `nnx.state(model, wrt)`, `[B]` unclipped norms (non-finite for
      non-finite examples), `[B]` losses. All private.

    Raises:
      ImportError: flax is not installed (`pip install "dpnmt[ghost]"`).
      ghost.UNINTERCEPTABLE: the layers cannot be captured (`nnx.scan`, ...).
    """
    ghost.require_flax()
    graphdef, state, rest = split_model(model, nnx.Param if wrt is None else wrt)
    leaves, treedef = jax.tree_util.tree_flatten(state)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
    first, first_key = ghost_trace.abstract_values((batch, keys), 1)
    plan, handled = _analyse(loss_fn, graphdef, treedef, rest, leaves, first, first_key)
    if require_layers and not handled:
        raise ghost_trace.NothingToFactoriseError("no parameter is used only through layers")
    fallback = [i for i in range(len(leaves)) if i not in handled]
    plan, zeros = ghost_trace.handled_plan(plan, handled)

    def run(full, shadows, perturbations, example, key):
        model, layer_paths = _private_copy(graphdef, treedef.unflatten(full), rest)
        recorder = _Recorder(
            layer_paths, shadows=shadows, plan=plan, perturbations=perturbations, leaves=full
        )
        loss = _run_loss(loss_fn, model, recorder, example, key)
        recorder.check_complete()
        return loss, recorder.captured

    losses, captured, fallback_grads, out_grads = ghost_trace.checked_pass(
        run, leaves, handled, zeros, paths, batch, keys, spmd_axis_name
    )
    # Warned only once the checked pass succeeded (if refused, the caller falls back for all).
    _warn_fallback([paths[i] for i in fallback if leaves[i].ndim >= 2])
    sums, norms = _clipped_sum(
        plan, handled, fallback, leaves, captured, out_grads, fallback_grads, mask, l2_clip
    )
    return treedef.unflatten(sums), norms, losses


def _clipped_sum(
    plan, handled, fallback, leaves, captured, out_grads, fallback_grads, mask, l2_clip
):
    """Per-example norms (raised by their rounding bound) and the weighted sums, as linen's."""
    batch_size = mask.shape[0]
    uses: dict[int, list[_Use]] = {i: [] for i in handled}
    for call, x, g in zip(plan, captured, out_grads, strict=True):
        for name, index in call.roles:
            uses[index].append(
                uses_of(call.kind, name, x, g, batch_size, tuple(leaves[index].shape), g.shape[-1])
            )

    return clipped_sum(uses, fallback, fallback_grads, leaves, mask, l2_clip, prefer=prefer_ghost)
