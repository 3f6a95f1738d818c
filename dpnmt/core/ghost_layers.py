"""The Flax layers that ghost clipping factorises: forward and input rows.

`dpnmt.core.ghost` recognises the calls (it holds flax); this module, given a
recognised module and its input, recomputes the call's output as flax does
(`forward`) and gives the rows `A [T, n]` whose product `Aᵀ G` with the output
gradient rows `G [T, width]` is the kernel's gradient (`rows`): the input with
its contracted axes flattened (dense layers), or the patches of a convolution.
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence
from typing import Any

import chex
import jax
import jax.numpy as jnp

from dpnmt.core.ghost_norms import CONV, DENSE, LOOKUP


def as_tuple(value: int | Sequence[int]) -> tuple[int, ...]:
    """An int or a sequence of ints as a tuple."""
    return (value,) if isinstance(value, int) else tuple(value)


def einsum_axes(module: Any, shape: tuple[int, ...]):
    """`dense_axes` of an `nn.Einsum` that is a DenseGeneral, else None.

    That is: the kernel's axes are the contracted input axes, then the output
    features, and the output is the input's other axes (in order), then the
    features (in order), e.g. `"btd,dhk->bthk"` or `"...hd,hdf->...f"`. Others
    (kernel batch axes, features in another order, input axes summed away) fall
    back to per-example gradients.
    """
    spec = (module.einsum_str or "").replace(" ", "")
    if spec.count("->") != 1 or spec.count(",") != 1:
        return None
    operands, out = spec.split("->")
    lhs, rhs = operands.split(",")
    if "..." in lhs and "..." in out and "..." not in rhs:  # The ellipsis as letters.
        fill = [c for c in string.ascii_letters if c not in spec][: len(shape) - len(lhs) + 3]
        lhs, out = lhs.replace("...", "".join(fill)), out.replace("...", "".join(fill))
    if not (lhs + rhs + out).isalpha() or len(lhs) != len(shape):
        return None
    contracted = [c for c in rhs if c in lhs]
    features = [c for c in rhs if c not in lhs]
    rest = [c for c in lhs if c not in rhs]
    if (
        any(len(set(labels)) != len(labels) for labels in (lhs, rhs, out))
        or len(rhs) != len(module.shape)
        or rhs != "".join(contracted + features)
        or out != "".join(rest + features)
    ):
        return None
    return tuple(lhs.index(c) for c in contracted), tuple(module.shape[len(contracted) :])


def dense_axes(module: Any, shape: tuple[int, ...]):
    """(contracted input axes, in kernel order; output feature sizes) of a dense call."""
    if hasattr(module, "einsum_str"):  # nn.Einsum
        return einsum_axes(module, shape)
    if not hasattr(module, "axis"):  # nn.Dense
        return (len(shape) - 1,), (module.features,)
    axes = tuple(axis % len(shape) for axis in as_tuple(module.axis))
    return axes, as_tuple(module.features)


def _conv_geometry(module: Any, x: chex.Array) -> tuple[chex.Array, dict[str, Any]]:
    """`nn.Conv`'s input as `lax.conv_general_dilated` sees it, and its window arguments.

    The input is `[N, *spatial, C]` (batch axes flattened, as flax does), padded
    here for CIRCULAR, REFLECT and CAUSAL padding (then "VALID"), as flax does.
    """
    kernel_size = as_tuple(module.kernel_size)
    rank = len(kernel_size)

    def per_axis(value):
        return (
            (1,) * rank
            if value is None
            else (value,) * rank
            if isinstance(value, int)
            else tuple(value)
        )

    strides, dilation = per_axis(module.strides), per_axis(module.kernel_dilation)
    x = jnp.reshape(x, (-1,) + x.shape[x.ndim - rank - 1 :])
    padding = _lax_padding(module.padding, rank)
    if padding in ("CIRCULAR", "REFLECT"):
        spans = [(k - 1) * d + 1 for k, d in zip(kernel_size, dilation, strict=True)]
        pads = [(0, 0), *[((k - 1) // 2, k // 2) for k in spans], (0, 0)]
        x = jnp.pad(x, pads, mode={"CIRCULAR": "wrap", "REFLECT": "reflect"}[padding])
        padding = "VALID"
    elif padding == "CAUSAL":
        if rank != 1:
            raise ValueError("Causal padding is only implemented for 1D convolutions.")
        x = jnp.pad(x, [(0, 0), (dilation[0] * (kernel_size[0] - 1), 0), (0, 0)])
        padding = "VALID"
    return x, dict(
        window_strides=strides,
        padding=padding,
        lhs_dilation=per_axis(module.input_dilation),
        rhs_dilation=dilation,
        dimension_numbers=_channels_last(x.ndim),
    )


def rows(kind: str, module: Any, x: chex.Array) -> chex.Array:
    """The rows `A [T, n]` of one call: the kernel's gradient is `Aᵀ G`.

    `G [T, width]` are the output gradient's rows, and `Aᵀ G` is the kernel
    reshaped to `[n, width]` in its own axis order (contracted axes, then features).
    """
    if kind == DENSE:
        axes, _ = dense_axes(module, x.shape)
        kept = [axis for axis in range(x.ndim) if axis not in axes]
        x = jnp.transpose(x, (*kept, *axes))
        return x.reshape(-1, math.prod(x.shape[len(kept) :]))
    # The unfold (im2col) view: output position t reads the window patches[t]. The
    # patches are ordered [C_in, *window]; the kernel [*window, C_in, C_out].
    x, geometry = _conv_geometry(module, x)
    window = as_tuple(module.kernel_size)
    patches = jax.lax.conv_general_dilated_patches(
        x, window, **geometry, precision=jax.lax.Precision.HIGHEST
    )
    patches = patches.reshape(-1, x.shape[-1], math.prod(window))
    return jnp.swapaxes(patches, 1, 2).reshape(patches.shape[0], -1)


def forward(kind: str, module: Any, x: chex.Array, params: dict[str, chex.Array]):
    """The recognised call's output, computed as flax computes it."""
    if kind == DENSE:
        axes, features = dense_axes(module, x.shape)
        x, kernel, bias = module.promote_dtype(
            x, params["kernel"], params.get("bias"), dtype=module.dtype
        )
        if hasattr(module, "einsum_str"):
            y = jnp.einsum(
                module.einsum_str.replace(" ", ""),
                x,
                kernel,
                precision=module.precision,
                preferred_element_type=module.preferred_element_type,
            )
        else:
            contracted = tuple(range(len(axes)))
            y = jax.lax.dot_general(
                x, kernel, ((axes, contracted), ((), ())), precision=module.precision
            )
        if bias is not None:
            y = y + jnp.reshape(bias, (1,) * (y.ndim - len(features)) + features)
        return y
    if kind == CONV:
        shape = x.shape
        x, kernel, bias = module.promote_dtype(
            x, params["kernel"], params.get("bias"), dtype=module.dtype
        )
        x, geometry = _conv_geometry(module, x)
        y = jax.lax.conv_general_dilated(x, kernel, **geometry, precision=module.precision)
        if bias is not None:
            y = y + jnp.reshape(bias, (1,) * (y.ndim - 1) + (-1,))
        rank = len(as_tuple(module.kernel_size))
        return jnp.reshape(y, shape[: len(shape) - rank - 1] + y.shape[1:])
    if kind == LOOKUP:
        if not jnp.issubdtype(x.dtype, jnp.integer):
            raise ValueError("Input type must be an integer or unsigned integer.")
        (embedding,) = module.promote_dtype(params["embedding"], dtype=module.dtype, inexact=False)
        return jnp.take(embedding, x, axis=0)
    x, embedding = module.promote_dtype(x, params["embedding"], dtype=module.dtype)
    return jnp.dot(x, embedding.T)


def _lax_padding(padding: Any, rank: int) -> Any:
    """`nn.Conv`'s padding as `lax.conv_general_dilated` takes it (a string or pairs)."""
    if isinstance(padding, str):
        return padding
    if isinstance(padding, int):
        return [(padding, padding)] * rank
    pairs = [(p, p) if isinstance(p, int) else tuple(p) for p in padding]
    if len(pairs) != rank or any(len(p) != 2 for p in pairs):
        raise ValueError(f"nn.Conv padding={padding!r}: give a string, an int or {rank} pairs.")
    return pairs


def _channels_last(ndim: int) -> jax.lax.ConvDimensionNumbers:
    """Flax's layout: input and output [N, *spatial, C], kernel [*window, C_in, C_out]."""
    lhs = (0, ndim - 1, *range(1, ndim - 1))
    return jax.lax.ConvDimensionNumbers(lhs, (ndim - 1, ndim - 2, *range(ndim - 2)), lhs)
