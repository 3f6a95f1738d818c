"""DP-SGD as optax `GradientTransformation`s over per-example gradients.

For projects that already have an optax chain and compute per-example
gradients themselves:

    noise_key = key_from_seed(fresh_seed())  # secret: never saved with the state
    tx = optax.chain(dp_aggregate(l2_clip=1.0, noise_multiplier=1.1,
                                  expected_lot_size=256),
                     optax.adam(1e-3))
    state = tx.init(params)  # public: a release counter and adam's moments
    updates, state = tx.update(per_example_grads, state, params, mask=mask,
                               noise_key=noise_key)

One `dp_aggregate` update releases one lot. To build a lot from fixed-shape
micro-batches, use `dp_multi_steps(tx, ...)` (below): each update adds one
masked micro-batch (per-example gradients, or examples with `loss_fn=` for
ghost clipping) and only the one with `release=True` noises, releases and
steps `tx`, so a lot of any size runs the same compiled program.
(`dp_accumulate_aggregate`, the same without the wrapped optimizer, is
deprecated: chained before an optimizer, that optimizer steps on its zeros.)

The noise key is an argument of every `update`, never part of the state:
optimizer state is routinely checkpointed and shared, and whoever holds the
key regenerates each step's noise and subtracts it (ε = ∞). The state holds
only public values (see each state's docstring for the one exception).

To put an optimizer behind a lot of micro-batches, `dp_multi_steps(tx, ...)`
composes like `optax.MultiSteps`: zero updates and an untouched optimizer
state until the call with `release=True`, then one noisy release and one
optimizer step. `optax.MultiSteps` itself does not fit Poisson lots: it
applies an update after a FIXED number `every_k_schedule` of micro-steps,
while a Poisson lot's number of micro-batches is random; it averages the
micro-steps' updates (dividing by the realised count), where DP-SGD divides
the sum by the fixed expected lot size L; and wrapped around a noising
transformation it noises every micro-step, adding K times the variance the
accountant assumed. Unlike `optax.contrib.differentially_private_aggregate`,
the sums here are divided by the fixed L, not the realised batch size, as
Poisson sampling requires.

All three are views of the core's one lot step (`dpnmt.core.dp_step`).
"""

import warnings
from collections.abc import Callable
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax

from dpnmt.core import accumulation, deprecation, dp_step, noise, private_grad, validation


class DpAggregateState(NamedTuple):
    """State of `dp_aggregate`: public, safe to checkpoint and publish.

    Attributes:
      count: int32 scalar, lots released so far (the step). Release k draws
        its noise with `noise_key_for_step(noise_key, k)`.
    """

    count: chex.Array


def _noise_args(l2_clip, noise_multiplier, expected_lot_size, noise_mode) -> dict:
    """The privacy parameters, checked once when the transformation is built."""
    validation.check_positive("l2_clip", l2_clip)
    validation.check_positive("noise_multiplier", noise_multiplier, allow_zero=True)
    validation.check_positive("expected_lot_size", expected_lot_size)
    noise.check_noise_mode(noise_mode)
    return {
        "noise_multiplier": noise_multiplier,
        "l2_clip": l2_clip,
        "expected_lot_size": expected_lot_size,
        "noise_mode": noise_mode,
    }


def _step_key(noise_key, count) -> chex.PRNGKey:
    if noise_key is None:
        raise ValueError(
            "update needs noise_key=, the run's secret noise key "
            "(core.key_from_seed(core.fresh_seed())), passed to every update and kept "
            "out of the optimizer state and checkpoints."
        )
    return noise.noise_key_for_step(noise_key, count)


@deprecation.deprecated_arguments(positional=("l2_clip", "noise_multiplier", "expected_lot_size"))
def dp_aggregate(
    *,
    l2_clip: float,
    noise_multiplier: float,
    expected_lot_size: float,
    noise_mode: str = noise.FLOAT,
) -> optax.GradientTransformationExtraArgs:
    """Clip per-example gradients, sum, add N(0, σ²C²) once, divide by L.

    Args:
      l2_clip: clipping norm C > 0.
      noise_multiplier: σ >= 0.
      expected_lot_size: L, the fixed divisor (q·N under Poisson sampling), > 0.
      noise_mode: "float" (float32 Gaussian draws) or "secure" (a discrete
        Gaussian on a grid, safe against the floating-point attack on raw noisy
        sums); see `noisy_average`.

    Returns:
      A transformation whose `update(per_example_grads, state, params, *,
      noise_key, mask=None)` takes gradients with a leading per-example axis
      (every leaf `[B, *param.shape]`, B >= 1), the parameters (only their
      shapes are read, to check that axis), the run's secret noise key
      (`key_from_seed(fresh_seed())`, the same every update: release k uses
      `noise_key_for_step(noise_key, k)`) and an optional `[B]` 0/1 mask, and
      returns the noisy average gradient. Inside `optax.chain`, pass
      `noise_key=` (and `mask=`) to the chain's `update`. The state
      (`DpAggregateState`) holds no key: it is safe to save and publish. The
      noise key is secret: keep it (or its seed) out of checkpoints and logs.
    """
    noise_args = _noise_args(l2_clip, noise_multiplier, expected_lot_size, noise_mode)

    def init_fn(params):
        del params
        return DpAggregateState(jnp.zeros((), jnp.int32))

    def update_fn(updates, state, params=None, *, noise_key=None, mask=None, **extra_args):
        del extra_args
        if params is None:
            raise ValueError(
                "dp_aggregate's update needs params (only their shapes are read, to check "
                "that every gradient leaf has the per-example axis): "
                "tx.update(per_example_grads, state, params, noise_key=...)."
            )
        step_key = _step_key(noise_key, state.count)
        lot = dp_step.add_per_example_grads(dp_step.init(params), updates, mask, l2_clip=l2_clip)
        noisy = dp_step.release(lot, step_key, **noise_args)
        return noisy, DpAggregateState(state.count + 1)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


class DpAccumulateState(NamedTuple):
    """State of `dp_accumulate_aggregate`.

    Attributes:
      count: int32 scalar, lots released so far (the step). Public.
      accumulator: the current lot's clipped sum so far and its number of
        examples. PRIVATE between releases (an un-noised sum of the lot's
        examples, and the realised lot size): save or publish the state only
        right after a release, when the accumulator is back to zero.

    The state holds no key.
    """

    count: chex.Array
    accumulator: accumulation.AccumulatorState


@deprecation.deprecated_arguments(positional=("l2_clip", "noise_multiplier", "expected_lot_size"))
def dp_accumulate_aggregate(
    *,
    l2_clip: float,
    noise_multiplier: float,
    expected_lot_size: float,
    noise_mode: str = noise.FLOAT,
) -> optax.GradientTransformationExtraArgs:
    """Deprecated (use `dp_multi_steps`): accumulate micro-batches, noise once on release.

    Deprecated because it cannot compose: inside `optax.chain` the optimizer
    after it is stepped on the zeros it returns between releases (Adam's
    moments decay and its count advances) unless the host skips those calls.
    `dp_multi_steps(tx, ...)` wraps the optimizer instead and steps it only on
    the release; it also takes a `loss_fn` for ghost clipping.

    Call `update` once per micro-batch of the lot (the micro-batch shape is
    fixed, their number may vary from lot to lot) with `release=False`, and
    with `release=True` on the lot's last one: that call returns
    `noisy_average` of the lot's accumulated clipped sum with the key
    `noise_key_for_step(noise_key, k)` for lot k, and resets the
    accumulator; the other calls return zeros (so a following optimizer must
    only be stepped on release, e.g. apply the updates only then). An empty
    Poisson lot is one call with an all-zero mask and `release=True`: it
    releases noise only, as the accountant assumed a step. To step an
    optimizer only on releases, use `dp_multi_steps(tx, ...)` instead.

    Formal guarantee: as `noisy_average`, provided each example of the lot
    appears in at most one micro-batch, padding rows have mask 0, and
    `noise_key` stays secret.

    Args:
      l2_clip: clipping norm C > 0.
      noise_multiplier: σ >= 0.
      expected_lot_size: L, the fixed divisor (q·N under Poisson sampling), > 0.
      noise_mode: "float" (float32 Gaussian draws) or "secure" (a discrete
        Gaussian on a grid, safe against the floating-point attack on raw noisy
        sums); see `noisy_average`.

    Returns:
      A transformation whose `update(per_example_grads, state, params=None, *,
      noise_key, mask=None, release)` takes one micro-batch's gradients (every
      leaf `[b, *param.shape]`), the run's secret noise key (the same every
      call; `key_from_seed(fresh_seed())`), an optional `[b]` mask and a bool
      scalar `release` (may be traced). The state holds no key (see
      `DpAccumulateState` for what is private in it).
    """
    warnings.warn(
        "dp_accumulate_aggregate is deprecated: it returns zero updates between releases, "
        "and an optimizer chained after it steps on them. Use dp_multi_steps(tx, l2_clip=..., "
        "noise_multiplier=..., expected_lot_size=...), which steps tx only on the release "
        "(and takes loss_fn= for ghost clipping).",
        DeprecationWarning,
        stacklevel=3,  # past the deprecated_arguments wrapper, at the caller
    )
    noise_args = _noise_args(l2_clip, noise_multiplier, expected_lot_size, noise_mode)

    def init_fn(params):
        return DpAccumulateState(jnp.zeros((), jnp.int32), accumulation.init_accumulator(params))

    def update_fn(updates, state, params=None, *, noise_key=None, mask=None, release, **extra_args):
        del params, extra_args
        step_key = _step_key(noise_key, state.count)
        lot = dp_step.add_per_example_grads(state.accumulator, updates, mask, l2_clip=l2_clip)
        empty = dp_step.init(lot.grad_sum)

        def emit(lot):
            return dp_step.release(lot, step_key, **noise_args)

        def hold(lot):
            return jax.tree_util.tree_map(jnp.zeros_like, lot.grad_sum)

        release = jnp.asarray(release, bool)
        out = jax.lax.cond(release, emit, hold, lot)
        kept = jax.tree_util.tree_map(lambda e, a: jnp.where(release, e, a), empty, lot)
        count = state.count + release.astype(jnp.int32)
        return out, DpAccumulateState(count, kept)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


class DpMultiStepsState(NamedTuple):
    """State of `dp_multi_steps`.

    Attributes:
      count: int32 scalar, lots released so far. Public.
      accumulator: the current lot's clipped sum and its number of examples.
        PRIVATE between releases: save or publish the state only right after a
        release, when it is back to zero.
      inner_state: the wrapped optimizer's state; it changes only on a release
        (post-processing of released gradients): public.

    The state holds no key. Checkpoint the optimizer state only right after a
    release: between releases `accumulator` holds the un-noised partial sum.

        updates, opt_state = tx.update(grads, opt_state, params, noise_key=key, release=last)
        if last:  # Released: the accumulator is zero again, opt_state is public.
            save_checkpoint(opt_state)
    """

    count: chex.Array
    accumulator: accumulation.AccumulatorState
    inner_state: optax.OptState


def dp_multi_steps(
    tx: optax.GradientTransformation,
    *,
    l2_clip: float,
    noise_multiplier: float,
    expected_lot_size: float,
    noise_mode: str = noise.FLOAT,
    loss_fn: Callable[..., chex.Array] | None = None,
    clipping: str = private_grad.AUTO,
    microbatch_size: int | None = None,
) -> optax.GradientTransformationExtraArgs:
    """DP-SGD around an optimizer, composed like `optax.MultiSteps`: no step until the lot ends.

    Each `update` adds one masked micro-batch to the lot: per-example
    gradients (`dp_step.add_per_example_grads`), or, with `loss_fn`, the
    micro-batch's examples themselves, clipped by `private_grad_sum` (by
    default ghost clipping for a Flax loss: no per-example gradients in
    memory; vmap for a pure-JAX one). On the lot's
    last micro-batch (`release=True`) the lot is released once
    (`dp_step.release`: noise N(0, σ²C²) on the clipped sum, ÷ L, key
    `noise_key_for_step(noise_key, k)` for lot k) and `tx` takes one step on
    it; every other call returns zero updates and leaves `tx`'s state
    untouched, so `optax.apply_updates` may run on every call (unlike a
    following optimizer stepping on the zeros of `dp_accumulate_aggregate`).
    An empty Poisson lot is one call with an all-zero mask and `release=True`:
    a noise-only step. Unlike `optax.MultiSteps`, the release comes when the
    caller says the (Poisson, random-sized) lot ends, not after a fixed count,
    and divides by the fixed L.

        tx = dp_multi_steps(optax.adam(1e-3), l2_clip=1.0, noise_multiplier=1.1,
                            expected_lot_size=256, loss_fn=loss_fn)  # ghost clipping
        for k, (batch, mask) in enumerate(micro_batches):  # any number, even 1
            updates, state = tx.update(batch, state, params, noise_key=noise_key,
                                       mask=mask, release=k == last,
                                       dropout_key=dropout_key(dropout_base, t, k))
            params = optax.apply_updates(params, updates)  # zeros until the release

    Args:
      tx: the optimizer to step on each released lot gradient.
      l2_clip: clipping norm C > 0.
      noise_multiplier: σ >= 0.
      expected_lot_size: L, the fixed divisor (q·N under Poisson sampling), > 0.
      noise_mode: "float" or "secure" (see `noisy_average`).
      loss_fn: None (`update` takes per-example gradients), or
        `loss_fn(params, example[, key]) -> scalar` for ONE example (see
        `private_grad_sum`): `update` then takes the micro-batch's examples.
      clipping: with `loss_fn`, "auto" (default: ghost where it applies and flax
        is installed, else vmap), "ghost" or "vmap": cost, not result.
      microbatch_size: with `loss_fn`, rows per sequential clipping chunk.

    Returns:
      A transformation whose `update(updates, state, params, *, noise_key,
      mask=None, release, dropout_key=None)` takes one micro-batch: without
      `loss_fn`, its per-example gradients (every leaf `[b, *param.shape]`);
      with it, its examples (a pytree, every leaf `[b, ...]`; `params` is then
      required: the gradients are taken there, and `dropout_key` is the
      micro-batch's secret dropout key, `dp_step.dropout_key`). `noise_key` is
      the run's secret noise key (the same every call), `mask` an optional
      `[b]` 0/1 (None: every row is real; a micro-batch padded to its fixed
      shape MUST pass its mask, and padding rows must never be copies of real
      examples, or an example counts twice), `release` a bool scalar (may be
      traced); `params` is passed to `tx` on release. See
      `DpMultiStepsState` for what the state holds (no key).
    """
    noise_args = _noise_args(l2_clip, noise_multiplier, expected_lot_size, noise_mode)
    if loss_fn is None and (clipping == "vmap" or microbatch_size is not None):
        raise ValueError(
            "dp_multi_steps: clipping= and microbatch_size= apply only with loss_fn= (then "
            "update takes the micro-batch's examples); without it, update clips the "
            "per-example gradients it is given."
        )
    private_grad.check_clipping(clipping)

    def init_fn(params):
        return DpMultiStepsState(jnp.zeros((), jnp.int32), dp_step.init(params), tx.init(params))

    def add(lot, updates, params, mask, dropout_key):
        if loss_fn is None:
            return dp_step.add_per_example_grads(lot, updates, mask, l2_clip=l2_clip)
        if params is None:
            raise ValueError(
                "dp_multi_steps with loss_fn= needs params in update (the gradients are "
                "taken there): tx.update(batch, state, params, noise_key=..., release=...)."
            )
        if mask is None:
            mask = jnp.ones(validation.check_batch_axis("batch", updates), jnp.int32)
        lot, _ = dp_step.add_microbatch(
            lot,
            loss_fn,
            params,
            updates,
            mask,
            l2_clip=l2_clip,
            dropout_key=dropout_key,
            clipping=clipping,
            microbatch_size=microbatch_size,
        )
        return lot

    def update_fn(
        updates,
        state,
        params=None,
        *,
        noise_key=None,
        mask=None,
        release,
        dropout_key=None,
        **extra_args,
    ):
        del extra_args
        step_key = _step_key(noise_key, state.count)
        lot = add(state.accumulator, updates, params, mask, dropout_key)

        def emit(lot, inner):
            gradient = dp_step.release(lot, step_key, **noise_args)
            return tx.update(gradient, inner, params)

        out_shapes = jax.eval_shape(emit, lot, state.inner_state)[0]

        def hold(lot, inner):
            del lot
            return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), out_shapes), inner

        release = jnp.asarray(release, bool)
        out, inner = jax.lax.cond(release, emit, hold, lot, state.inner_state)
        empty = dp_step.init(lot.grad_sum)
        kept = jax.tree_util.tree_map(lambda e, a: jnp.where(release, e, a), empty, lot)
        return out, DpMultiStepsState(state.count + release.astype(jnp.int32), kept, inner)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)
