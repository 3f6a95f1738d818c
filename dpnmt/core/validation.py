"""Boundary checks for privacy parameters, with errors that name the value."""

import math
import numbers
import warnings

import jax


def is_concrete(value) -> bool:
    """Whether `value` is a concrete Python/NumPy number (not a JAX tracer)."""
    return not isinstance(value, jax.core.Tracer)


def check_positive(name: str, value, *, allow_zero: bool = False) -> None:
    """Raises ValueError unless `value` is a finite number > 0 (>= 0 if allowed).

    Tracers (values inside `jax.jit`) are passed through unchecked: validate
    them before jitting.
    """
    if not is_concrete(value):
        return
    if getattr(value, "ndim", 0) > 0:
        raise ValueError(f"{name} must be a scalar, got an array of shape {value.shape}.")
    value = float(value)
    ok = value >= 0 if allow_zero else value > 0
    if not ok or not math.isfinite(value):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}.")


def check_delta(delta: float) -> None:
    """Raises ValueError unless 0 < delta < 1."""
    if not isinstance(delta, numbers.Real) or not 0.0 < float(delta) < 1.0:
        raise ValueError(
            f"delta must lie in the open interval (0, 1), got {delta!r}. "
            "Choose delta much smaller than 1/N for N training examples (e.g. 1e-8)."
        )


def check_sampling_rate(sampling_rate: float) -> None:
    """Raises ValueError unless 0 < sampling_rate <= 1."""
    if not isinstance(sampling_rate, numbers.Real) or not 0.0 < float(sampling_rate) <= 1.0:
        raise ValueError(
            f"sampling_rate (q = expected lot size / dataset size) must lie in (0, 1], "
            f"got {sampling_rate!r}. A lot cannot be larger than the dataset."
        )


def check_num_steps(name: str, num_steps) -> None:
    """Raises ValueError unless `num_steps` is a positive integer."""
    if isinstance(num_steps, bool) or not isinstance(num_steps, numbers.Integral) or num_steps < 1:
        raise ValueError(f"{name} must be a positive integer, got {num_steps!r}.")


def warn_if_delta_too_large(delta: float, dataset_size: int | None) -> None:
    """Warns when delta >= 1/N: such a delta permits leaking one example outright."""
    if dataset_size is None:
        return
    check_num_steps("dataset_size", dataset_size)
    if delta >= 1.0 / dataset_size:
        recommended = 10.0 ** math.floor(math.log10(0.01 / dataset_size))
        warnings.warn(
            f"delta={delta:g} is >= 1/N = {1.0 / dataset_size:g} for N={dataset_size} "
            f"examples; a mechanism that publishes one random example outright meets "
            f"this delta. Use delta << 1/N, e.g. {recommended:g}.",
            UserWarning,
            stacklevel=3,
        )
