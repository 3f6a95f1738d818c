"""The checked per-example pass of ghost clipping, shared by linen (`ghost`) and NNX (`ghost_nnx`).

Ghost clipping traces `loss_fn` twice: an analysis that finds the recognised
module calls and the trainable leaves read only through them ("handled"), then
the per-example pass that perturbs those calls' outputs and captures their
inputs. The second trace must compute what the first one found; this module
checks that on the very jaxpr that then runs (`checked_pass`, with
`used_leaves`: which jaxpr inputs a trace reads, and `check_not_leaked`: no
captured call input escaped an inner transform); the recognised calls check
their own outputs against the analysis (`check_output`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import chex
import jax
import jax.numpy as jnp
from jax.extend import core as jax_core


class PlanMismatchError(RuntimeError):
    """`loss_fn` ran other module calls than those found when it was analysed."""


class LeakedInputError(RuntimeError):
    """A recognised call ran inside an inner transform: its input cannot be captured."""


class NothingToFactoriseError(RuntimeError):
    """`clipping="auto"`: no parameter is used only through recognised calls (vmap fits)."""


def abstract_values(tree: Any, drop: int = 0) -> Any:
    """`ShapeDtypeStruct`s of `tree`'s leaves (weak types kept), less their first `drop` axes."""
    return jax.tree.map(
        lambda v: jax.ShapeDtypeStruct(v.shape[drop:], v.dtype, weak_type=jax.typeof(v).weak_type),
        tree,
    )


def handled_plan(plan: Sequence[Any], handled: frozenset[int]) -> tuple[list[Any], list[Any]]:
    """(the plan's calls with only their handled roles, per call a zero perturbation or None).

    `plan` holds the analysis's calls (`roles`: (parameter name, leaf index)
    pairs; `out_shape`, `out_dtype`); a call left with no handled role gets no
    perturbation (None), the others a zero array of their output's shape and dtype.
    """
    kept = [
        dataclasses.replace(call, roles=tuple(r for r in call.roles if r[1] in handled))
        for call in plan
    ]
    return kept, [jnp.zeros(c.out_shape, c.out_dtype) if c.roles else None for c in kept]


def fallback_reason(error: BaseException, transform_guess: str) -> str:
    """Why ghost clipping fell back, for a warning: the error, after what likely caused it.

    A `PlanMismatchError` says the trace differs from the analysis; any other
    error (a leaked or unexpected tracer) gets `transform_guess`, the caller's
    guess at the transform that hid the layers.
    """
    guess = (
        "its layers differ from the analysed plan:"
        if isinstance(error, PlanMismatchError)
        else transform_guess
    )
    return f"{guess} {type(error).__name__}: {str(error).splitlines()[0]}".strip()


def used_leaves(jaxpr: Any, count: int) -> set[int]:
    """Indices of the first `count` inputs that `jaxpr` reads (conservatively).

    An input handed to a sub-computation (`cond`, `checkpoint`, `scan`, ...)
    counts as read, whether or not the sub-computation uses it.
    """
    invars = {v: i for i, v in enumerate(jaxpr.invars[:count])}
    used = set()
    for eqn in jaxpr.eqns:
        used.update(invars[v] for v in eqn.invars if isinstance(v, jax_core.Var) and v in invars)
    used.update(invars[v] for v in jaxpr.outvars if isinstance(v, jax_core.Var) and v in invars)
    return used


def check_output(path: str, y: chex.Array, out_shape: tuple[int, ...], out_dtype: Any) -> None:
    """Raises PlanMismatchError if a recognised call's output `y` is not the analysed one.

    The perturbation added to `y` has the analysed `out_shape` and `out_dtype`:
    were `y` larger, it would broadcast, and its gradient would be the sum of
    the output gradients over the broadcast rows (a kernel would get
    `(Σ_t A_t)ᵀ(Σ_t G_t)` for `Σ_t A_tᵀ G_t`: wrong norms and sum, no error).
    """
    if tuple(y.shape) != tuple(out_shape) or y.dtype != out_dtype:
        raise PlanMismatchError(
            f"ghost clipping: module call {path!r} gives {y.dtype}{list(y.shape)}, the "
            f"analysed plan {out_dtype}{list(out_shape)}; loss_fn must trace "
            "the same way each time (no Python state, such as a call counter or a cache, "
            "that changes what it computes)."
        )


def check_not_leaked(closed: Any) -> None:
    """Raises LeakedInputError if a call ran inside a transform that closes over the parameters.

    `closed` is a trace whose outputs are the loss, then the inputs of the
    recognised calls. The input of a call made inside `jax.checkpoint` or a
    `jax.lax.scan` body is a tracer of that inner trace and cannot leave it.
    Outside `jax.jit`, JAX raises UnexpectedTracerError at once; inside it,
    the escaped tracer is taken as a constant of the trace and the step would
    fail only when it runs, beyond the vmap fallback. A call input that
    reaches the trace as a traced constant is refused here instead (an input
    closed over from an outer trace is refused too: it only costs the fallback).
    """
    consts = dict(zip(closed.jaxpr.constvars, closed.consts, strict=True))
    for var in closed.jaxpr.outvars[1:]:
        if isinstance(var, jax_core.Var) and isinstance(consts.get(var), jax.core.Tracer):
            raise LeakedInputError(
                "ghost clipping: a layer's input was traced inside a transform that closes "
                "over the model or its parameters (jax.checkpoint, a jax.lax.scan body), where "
                "it cannot be captured."
            )


def checked_pass(
    run: Callable[..., tuple[chex.Array, list[chex.Array | None]]],
    leaves: Sequence[chex.Array],
    handled: frozenset[int],
    zeros: Sequence[chex.Array | None],
    paths: Sequence[str],
    batch: Any,
    keys: chex.Array | None,
    spmd_axis_name: str | None,
) -> tuple[chex.Array, list[Any], list[chex.Array], list[Any]]:
    """The vmapped per-example pass of ghost clipping, evaluated from one checked trace.

    `run(full, shadows, perturbations, example, key) -> (loss, captured)` runs
    `loss_fn` on `full` (a value per trainable leaf); each recognised call
    reads its handled leaf `i` as `full[i]`, computes with `shadows[i]` and adds
    its perturbation. A handled leaf's gradient comes only from those calls, so
    `run` is traced once, for one example, with the handled leaves in two
    explicit slots (`full`'s, "real", and `shadows`): a trace that reads a real
    slot (a `loss_fn` whose Python state, a call counter or a cache, changed
    what it reads since the analysis) would lose that gradient term and is
    refused; so is a captured input that escaped an inner transform
    (`check_not_leaked`: under `jax.jit` it would fail only when the step
    runs). That very jaxpr then runs under `jax.vmap(jax.value_and_grad)`, the
    handled leaves in both slots: what runs is what was checked.

    Args:
      run: the function above.
      leaves: the trainable leaves.
      handled: indices of the leaves read only through recognised calls.
      zeros: per call of the plan, a zero perturbation of its output's shape
        and dtype (None for a call without handled leaves).
      paths: the leaves' parameter paths (for the error).
      batch: pytree, every leaf `[B, ...]`.
      keys: `[B]` per-example keys, or None.
      spmd_axis_name: passed to `jax.vmap`.

    Returns:
      `(losses, captured, fallback_grads, out_grads)`: `[B]` losses; per call,
      its captured `[B, ...]` input (or None); per fallback leaf (the others,
      ascending), `[B, *leaf.shape]` gradients; per call, the `[B, *out_shape]`
      gradient of its perturbation (or None).

    Raises:
      PlanMismatchError: the trace reads a handled leaf outside a recognised
        call (the message names its path), or `run` raised it.
      LeakedInputError: a captured input escaped an inner transform.
    """
    order = sorted(handled)
    fallback = [i for i in range(len(leaves)) if i not in handled]

    def per_example(real, shadows, diff, example, key):
        fallback_leaves, perturbations = diff
        given = dict(zip([*order, *fallback], [*real, *fallback_leaves], strict=True))
        full = [given[i] for i in range(len(leaves))]
        return run(full, dict(zip(order, shadows, strict=True)), perturbations, example, key)

    held = [leaves[i] for i in order]
    diff = ([leaves[i] for i in fallback], list(zeros))
    abstract = abstract_values((held, held, diff)) + abstract_values((batch, keys), 1)
    closed, out_shape = jax.make_jaxpr(per_example, return_shape=True)(*abstract)
    read = sorted(used_leaves(closed.jaxpr, len(order)))
    if read:
        raise PlanMismatchError(
            "ghost clipping: the per-example trace of loss_fn reads "
            f"{', '.join(paths[order[i]] for i in read)} outside the recognised module "
            "calls, unlike its analysis (the gradient of that read would be lost); loss_fn "
            "must trace the same way each time (no Python state, such as a call counter or "
            "a cache, that changes what it reads)."
        )
    check_not_leaked(closed)
    evaluate, out_tree = jax_core.jaxpr_as_fun(closed), jax.tree.structure(out_shape)

    def checked(diff, example, key):
        outputs = evaluate(*jax.tree.leaves((held, held, diff, example, key)))
        return jax.tree.unflatten(out_tree, outputs)

    in_axes = (None, 0, None if keys is None else 0)
    (losses, captured), (fallback_grads, out_grads) = jax.vmap(
        jax.value_and_grad(checked, has_aux=True), in_axes=in_axes, spmd_axis_name=spmd_axis_name
    )(diff, batch, keys)
    return losses, captured, fallback_grads, out_grads
