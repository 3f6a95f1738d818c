"""Boundary checks for privacy parameters and batches, with errors that name the value.

Privacy parameters (C, σ, L, q, T, δ, ε) may be Python, NumPy or concrete JAX
scalars; they are returned as Python numbers. They must be concrete: a value
traced by `jax.jit` cannot be checked, and a wrong one (a negative C flips the
clipped gradient) would fail silently, so tracers are refused.
"""

import math
import numbers
import warnings

import chex
import jax
import numpy as np


def is_concrete(value) -> bool:
    """Whether `value` is concrete (not a JAX tracer)."""
    return not isinstance(value, jax.core.Tracer)


def _scalar(name: str, value, what: str):
    """`value` as a Python int or float; refuses tracers, arrays, bools and non-numbers."""
    if not is_concrete(value):
        raise TypeError(
            f"{name} is a traced JAX value (an argument of jax.jit, vmap or grad), so it "
            f"cannot be checked: pass {name} as a concrete Python or NumPy number, by "
            "closing over it or marking it static (jax.jit(..., static_argnames=...))."
        )
    if isinstance(value, bool | np.bool_) or (
        getattr(value, "dtype", None) is not None and np.dtype(value.dtype) == np.bool_
    ):
        raise TypeError(f"{name} must be {what}, got the boolean {value!r}.")
    if getattr(value, "ndim", 0) != 0:
        raise ValueError(f"{name} must be a scalar, got an array of shape {np.shape(value)}.")
    if isinstance(value, numbers.Integral) or (
        hasattr(value, "dtype") and np.issubdtype(np.dtype(value.dtype), np.integer)
    ):
        return int(value)
    if isinstance(value, numbers.Real) or (
        hasattr(value, "dtype") and np.issubdtype(np.dtype(value.dtype), np.floating)
    ):
        return float(value)
    raise TypeError(f"{name} must be {what}, got {type(value).__name__} {value!r}.")


def check_positive(name: str, value, *, allow_zero: bool = False) -> float:
    """`value` as a float; ValueError unless finite and > 0 (>= 0 if allowed).

    Raises:
      TypeError: `value` is traced, boolean or not a number.
      ValueError: `value` is an array, not finite, or out of range.
    """
    bound = ">= 0" if allow_zero else "> 0"
    value = float(_scalar(name, value, f"a finite number {bound}"))
    ok = value >= 0 if allow_zero else value > 0
    if not ok or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}.")
    return value


def check_delta(delta) -> float:
    """`delta` as a float; ValueError unless 0 < delta < 1."""
    value = _scalar("delta", delta, "a number in (0, 1)")
    if not 0.0 < float(value) < 1.0:
        raise ValueError(
            f"delta must lie in the open interval (0, 1), got {delta!r}. "
            "Choose delta much smaller than 1/N for N training examples (e.g. 1e-8)."
        )
    return float(value)


def check_sampling_rate(sampling_rate) -> float:
    """`sampling_rate` as a float; ValueError unless 0 < sampling_rate <= 1."""
    value = _scalar("sampling_rate", sampling_rate, "a number in (0, 1]")
    if not 0.0 < float(value) <= 1.0:
        raise ValueError(
            f"sampling_rate (q = expected lot size / dataset size) must lie in (0, 1], "
            f"got {sampling_rate!r}. A lot cannot be larger than the dataset."
        )
    return float(value)


def check_num_steps(name: str, num_steps) -> int:
    """`num_steps` as an int; ValueError unless a positive integer (2.0 counts, 2.5 not)."""
    value = _scalar(name, num_steps, "a positive integer")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{name} must be a positive integer, got {num_steps!r}.")
        value = int(value)
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {num_steps!r}.")
    return value


# `jax.random.fold_in` folds in a 32-bit word: steps at or above it would wrap onto earlier ones.
STEP_BOUND = 2**32


def check_step(name: str, step):
    """`step` unchanged if it is an integer scalar (concrete in [0, 2**32), or traced).

    Key schedules fold the step into a key (`jax.random.fold_in`), which casts
    it to uint32: a float step 1.5 folds in as 1 and a bool as 0 or 1, so a
    float step counter would reuse an earlier step's (noise) key, silently.

    Raises:
      TypeError: `step` is a float, a bool or not a number (concrete or traced).
      ValueError: `step` is not a scalar, or a concrete value outside [0, 2**32).
    """
    dtype = getattr(step, "dtype", None)
    integral = (
        np.issubdtype(np.dtype(dtype), np.integer)
        if dtype is not None
        else isinstance(step, numbers.Integral)
    )
    if isinstance(step, bool | np.bool_) or not integral:
        raise TypeError(
            f"{name} must be an integer (a step or index counter), got "
            f"{type(step).__name__} {step!r}: jax.random.fold_in truncates it (1.5 folds in "
            "as 1), so a float counter reuses an earlier step's key. Count steps with ints."
        )
    if np.ndim(step) != 0:
        raise ValueError(f"{name} must be a scalar, got an array of shape {np.shape(step)}.")
    if is_concrete(step) and not 0 <= int(step) < STEP_BOUND:
        raise ValueError(
            f"{name} must lie in [0, 2**32), got {int(step)}: jax.random.fold_in folds in a "
            "32-bit word, so larger or negative steps would share keys with others."
        )
    return step


def check_per_example_axis(grads: chex.ArrayTree, params: chex.ArrayTree, what: str) -> None:
    """Raises ValueError unless every leaf of `grads` is `[B_i, *shape]` for `params`' leaf.

    That the B_i agree is `check_batch_axis`'s job. Only the leaves' shapes
    are read (arrays or `jax.ShapeDtypeStruct`s). A batch gradient (leaves
    shaped like the parameters) is refused even when
    all its leaves share a leading size, which alone would look like B rows.
    """
    grad_paths, grad_def = jax.tree_util.tree_flatten_with_path(grads)
    want_leaves, want_def = jax.tree_util.tree_flatten(params)
    if grad_def != want_def:
        raise ValueError(
            f"per_example_grads has tree structure {grad_def} but {what} has {want_def}: "
            "pass one gradient leaf per parameter, with a leading per-example axis."
        )
    for (path, leaf), want in zip(grad_paths, want_leaves, strict=True):
        if np.shape(leaf)[1:] != np.shape(want) or np.ndim(leaf) != np.ndim(want) + 1:
            raise ValueError(
                f"per_example_grads{jax.tree_util.keystr(path)} has shape {np.shape(leaf)}, "
                f"but the {what} leaf has shape {np.shape(want)}: it needs a leading "
                f"per-example axis, [B, *{np.shape(want)}]. Pass per-example gradients "
                "(e.g. jax.vmap(jax.grad(loss), in_axes=(None, 0))), not a batch gradient."
            )


def check_mask(mask: chex.Array, batch_size: int) -> None:
    """Raises ValueError unless `mask` is `[batch_size]` and (if concrete) 0/1.

    The mask is a 0/1 indicator of real rows, not a weight: the clipping code
    treats any non-zero entry as 1 (`mask != 0`). A traced mask cannot be
    checked, so that is its meaning under `jax.jit`.
    """
    shape = np.shape(mask)
    if shape != (batch_size,):
        raise ValueError(
            f"mask has shape {shape} but the batch has {batch_size} rows: pass a [B] mask "
            "with one 0/1 entry per row (1: a real example, 0: padding)."
        )
    if is_concrete(mask):
        values = np.asarray(mask)
        bad = values[(values != 0) & (values != 1)]
        if bad.size:
            raise ValueError(
                f"mask must hold only 0 and 1 (an indicator of real rows, not weights), "
                f"got {bad[0]!r}; weight examples in loss_fn instead."
            )


def check_batch_axis(name: str, tree: chex.ArrayTree) -> int:
    """B, the leading axis every leaf of `tree` shares; ValueError naming the leaf otherwise.

    Raises:
      ValueError: no leaves, a leaf is a scalar (no batch axis), the leaves' leading sizes
        differ, or B = 0 (an empty batch).
    """
    sizes = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if np.ndim(leaf) == 0:
            raise ValueError(
                f"{name}{jax.tree_util.keystr(path)} is a scalar: every leaf needs a leading "
                "batch (per-example) axis [B, ...]."
            )
        sizes.setdefault(np.shape(leaf)[0], jax.tree_util.keystr(path))
    if not sizes:
        raise ValueError(f"{name} has no leaves: pass a pytree of [B, ...] arrays.")
    if len(sizes) > 1:
        found = ", ".join(f"{where or 'leaf'}: {size}" for size, where in sizes.items())
        raise ValueError(
            f"every leaf of {name} needs the same leading (batch) axis B; got {found}."
        )
    (batch_size,) = sizes
    if batch_size == 0:
        raise ValueError(
            f"{name} has an empty batch (B = 0). Pass at least one row; an empty lot is "
            "a micro-batch of padding rows with mask 0 (its release is noise only)."
        )
    return batch_size


def warn_if_delta_too_large(delta, dataset_size) -> None:
    """Warns when delta >= 1/N: such a delta permits leaking one example outright."""
    if dataset_size is None:
        return
    dataset_size = check_num_steps("dataset_size", dataset_size)
    delta = check_delta(delta)
    if delta >= 1.0 / dataset_size:
        recommended = 10.0 ** math.floor(math.log10(0.01 / dataset_size))
        warnings.warn(
            f"delta={delta:g} is >= 1/N = {1.0 / dataset_size:g} for N={dataset_size} "
            f"examples; a mechanism that publishes one random example outright meets "
            f"this delta. Use delta << 1/N, e.g. {recommended:g}.",
            UserWarning,
            stacklevel=3,
        )
