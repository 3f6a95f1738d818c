"""Ghost clipping refuses a loss_fn that traces differently after its analysis (linen and NNX).

A loss_fn with Python state (here a trace counter) can read a recognised
kernel directly in a later trace only. Before the check, that read's gradient
term was missing from the norm and the sum: ghost clipping returned the vmap
sum of the loss WITHOUT the term (verified on the code before the check), which
the tests show differs from the right one. Now the per-example trace is checked
and `ghost.PlanMismatchError` names the kernel; `private_grad_sum(_nnx)` falls
back to vmap clipping and returns the right sum. The same holds for a
recognised call whose output shape changed after the analysis (the plan's
zero perturbation would broadcast), a read hidden in a `jax.lax.cond` branch
or a `jax.checkpoint`, and parameters replaced after the analysis. And
`ghost_clipped_sum(_nnx)` traces loss_fn exactly twice (the analysis, the
checked pass): what runs under vmap is what was checked, not a third trace;
a refused pass warns of the whole-batch fallback only.
"""

import functools
import importlib
import warnings

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dpnmt import core
from dpnmt.core import ghost, ghost_nnx, ghost_trace
from dpnmt.core.private_grad_nnx import private_grad_sum_nnx

ROWS, WIDTH, L2_CLIP = 6, 5, 1.0


class _Linen(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(3, name="out")(jnp.tanh(nn.Dense(WIDTH, name="hidden")(x)))


class _Nnx(nnx.Module):
    def __init__(self, rngs):
        self.hidden = nnx.Linear(4, WIDTH, rngs=rngs)
        self.out = nnx.Linear(WIDTH, 3, rngs=rngs)

    def __call__(self, x):
        return self.out(jnp.tanh(self.hidden(x)))


def _linen_loss(p, x):
    return jnp.sum(jnp.sin(_Linen().apply({"params": p}, x)))


def _linen_kernel(p, name="hidden"):
    return p[name]["kernel"]


def _nnx_loss(model, x):
    return jnp.sum(jnp.sin(model(x)))


def _nnx_kernel(model, name="hidden"):
    return getattr(model, name).kernel.get_value()


def _direct(term, x):
    return term()


def _in_cond(term, x):  # the kernel is read only inside the branch
    return jax.lax.cond(jnp.all(jnp.isfinite(x)), term, lambda: jnp.zeros((), jnp.float32))


def _in_checkpoint(term, x):
    return jax.checkpoint(term)()


def _with_term(loss, kernel, direct_from=1, wrap=_direct):
    """`loss` plus `0.1 Σ kernel` from its `direct_from`-th trace on (a read outside the layer).

    `wrap(term, x)` computes the term: directly, or inside a sub-computation.
    """
    traces = []

    def loss_fn(params, x):
        traces.append(None)
        value = loss(params, x)
        if len(traces) >= direct_from:
            value = value + wrap(lambda: 0.1 * jnp.sum(kernel(params)), x)
        return value

    return loss_fn


def _linen_setup():
    x = jax.random.normal(jax.random.key(0), (ROWS, 2, 4))
    params = _Linen().init(jax.random.key(1), x[0])["params"]
    return params, x, jnp.ones((ROWS,)).at[2].set(0.0)


def _nnx_setup():
    x = jax.random.normal(jax.random.key(0), (ROWS, 2, 4))
    return _Nnx(nnx.Rngs(1)), x, jnp.ones((ROWS,)).at[2].set(0.0)


_LINEN = (_linen_setup, _linen_loss, _linen_kernel, core.private_grad_sum, ghost.ghost_clipped_sum)
_NNX = (_nnx_setup, _nnx_loss, _nnx_kernel, private_grad_sum_nnx, ghost_nnx.ghost_clipped_sum_nnx)


@pytest.mark.parametrize("api", [_LINEN, _NNX], ids=["linen", "nnx"])
def test_a_kernel_read_directly_only_after_the_analysis_is_refused_and_falls_back(api):
    setup, loss, kernel, private_grad_sum, ghost_clipped_sum = api
    params, x, mask = setup()
    vmap = functools.partial(private_grad_sum, mask=mask, l2_clip=L2_CLIP, clipping="vmap")
    want = vmap(_with_term(loss, kernel), params, x)
    dropped = vmap(loss, params, x)  # What the unchecked ghost pass returned.
    assert not np.allclose(want.norms, dropped.norms, rtol=1e-3)
    assert not all(
        map(np.allclose, jax.tree.leaves(want.grad_sum), jax.tree.leaves(dropped.grad_sum))
    )

    # Trace 1 analyses (no direct read: the kernel is left to the Dense call),
    # trace 2 is the per-example pass, which reads it directly.
    with pytest.raises(ghost.PlanMismatchError, match=r"\['hidden'\]\['kernel'\].*same way"):
        ghost_clipped_sum(_with_term(loss, kernel, 2), params, x, mask, L2_CLIP, None)

    # private_grad_sum checks the loss's shape on those same traces (no trace of its own).
    with pytest.warns(
        ghost.GhostClippingWarning, match="differ from the analysed plan: PlanMismatchError"
    ):
        got = private_grad_sum(_with_term(loss, kernel, 2), params, x, mask, l2_clip=L2_CLIP)
    chex.assert_trees_all_close(got.grad_sum, want.grad_sum, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got.norms, want.norms, rtol=1e-6)
    np.testing.assert_allclose(got.mean_loss, want.mean_loss, rtol=1e-6)


@pytest.mark.parametrize("wrap", [_in_cond, _in_checkpoint], ids=["cond", "checkpoint"])
@pytest.mark.parametrize("api", [_LINEN, _NNX], ids=["linen", "nnx"])
def test_a_kernel_read_only_inside_a_sub_computation_after_the_analysis_is_refused(api, wrap):
    setup, loss, kernel, _, ghost_clipped_sum = api
    params, x, mask = setup()
    with pytest.raises(ghost.PlanMismatchError, match=r"\['hidden'\]\['kernel'\].*same way"):
        ghost_clipped_sum(_with_term(loss, kernel, 2, wrap), params, x, mask, L2_CLIP, None)


@pytest.mark.parametrize("api", [_LINEN, _NNX], ids=["linen", "nnx"])
def test_ghost_clipped_sum_traces_loss_fn_exactly_twice(api):
    """The analysis and the checked pass: what runs under vmap is the checked trace, no third."""
    setup, loss, _, private_grad_sum, ghost_clipped_sum = api
    params, x, mask = setup()
    traces = []

    def loss_fn(params, x):
        traces.append(None)
        return loss(params, x)

    ghost_clipped_sum(loss_fn, params, x, mask, L2_CLIP, None)
    assert len(traces) == 2
    # The public entry adds no trace of its own (its scalar-loss check rides on these).
    traces.clear()
    private_grad_sum(loss_fn, params, x, mask, l2_clip=L2_CLIP)
    assert len(traces) == 2


def test_parameters_handed_to_apply_changed_after_the_analysis_are_refused():
    params, x, mask = _linen_setup()
    traces = []

    def loss_fn(p, x):
        traces.append(None)
        if len(traces) >= 2:  # new values, not read from the leaves the analysis saw
            p = jax.tree.map(jnp.zeros_like, p)
        return _linen_loss(p, x)

    with pytest.raises(ghost.PlanMismatchError, match="'kernel' values"):
        ghost.ghost_clipped_sum(loss_fn, params, x, mask, L2_CLIP, None)


def test_model_parameters_reassigned_after_the_analysis_are_refused_nnx():
    model, x, mask = _nnx_setup()
    traces = []

    def loss_fn(model, x):
        traces.append(None)
        if len(traces) >= 2:  # loss_fn's copy of the model, given new values
            model.hidden.kernel.set_value(jnp.zeros_like(model.hidden.kernel.get_value()))
        return _nnx_loss(model, x)

    with pytest.raises(ghost.PlanMismatchError, match="'hidden' read other parameter values"):
        ghost_nnx.ghost_clipped_sum_nnx(loss_fn, model, x, mask, L2_CLIP, None)


def _all_rows_from(loss, all_from):
    """`loss` on the first row of each example before its `all_from`-th trace, on both after."""
    traces = []

    def loss_fn(params, x):
        traces.append(None)
        return loss(params, x if len(traces) >= all_from else x[:1])

    return loss_fn


@pytest.mark.parametrize("api", [_LINEN, _NNX], ids=["linen", "nnx"])
def test_a_call_whose_output_shape_changed_after_the_analysis_is_refused_and_falls_back(api):
    """The `[1, 5]` zero perturbation of the plan would broadcast over 2 rows, unchecked.

    The kernel would then get `(Σ_t A_t)ᵀ(Σ_t G_t)` instead of `Σ_t A_tᵀ G_t`:
    wrong norms and sum, and no error (so it was, before the check).
    """
    setup, loss, _, private_grad_sum, ghost_clipped_sum = api
    params, x, mask = setup()
    with pytest.raises(
        ghost.PlanMismatchError,
        match=r"'hidden' gives float32\[2, 5\], the analysed plan float32\[1, 5\]",
    ):
        ghost_clipped_sum(_all_rows_from(loss, 2), params, x, mask, L2_CLIP, None)

    want = private_grad_sum(loss, params, x, mask, l2_clip=L2_CLIP, clipping="vmap")
    with pytest.warns(
        ghost.GhostClippingWarning, match=r"analysed plan: PlanMismatchError: .*'hidden' gives"
    ):
        got = private_grad_sum(_all_rows_from(loss, 2), params, x, mask, l2_clip=L2_CLIP)
    chex.assert_trees_all_close(got.grad_sum, want.grad_sum, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got.norms, want.norms, rtol=1e-6)
    np.testing.assert_allclose(got.mean_loss, want.mean_loss, rtol=1e-6)


def test_a_call_output_of_another_dtype_than_analysed_is_refused():
    y = jnp.zeros((2, 3), jnp.bfloat16)
    ghost_trace.check_output("out", y, (2, 3), jnp.dtype(jnp.bfloat16))
    with pytest.raises(
        ghost.PlanMismatchError, match=r"'out' gives bfloat16\[2, 3\].*float32\[2, 3\]"
    ):
        ghost_trace.check_output("out", y, (2, 3), jnp.dtype(jnp.float32))


@pytest.mark.parametrize("api", [_LINEN, _NNX], ids=["linen", "nnx"])
def test_a_refused_pass_warns_only_of_the_whole_batch_fallback(api, monkeypatch):
    """The partial-fallback warning comes after the checked pass, never before a refusal."""
    setup, loss, kernel, private_grad_sum, ghost_clipped_sum = api
    monkeypatch.setattr(importlib.import_module(ghost_clipped_sum.__module__), "_warned", set())
    params, x, mask = setup()
    # ['out']['kernel'] is read directly in every trace (a partial fallback, warned);
    # the hidden kernel too from the checked pass on (trace 2), which is refused.
    partial = _with_term(loss, functools.partial(kernel, name="out"))

    def warned(loss_fn):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            private_grad_sum(loss_fn, params, x, mask, l2_clip=L2_CLIP)
        return [str(w.message) for w in caught if w.category is ghost.GhostClippingWarning]

    (message,) = warned(_with_term(partial, kernel, 2))
    assert "for all parameters" in message and "two or more axes" not in message
    (message,) = warned(partial)  # not spent by the refused pass
    assert "two or more axes" in message and "['out']['kernel']" in message
