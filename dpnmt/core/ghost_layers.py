"""The Flax layers that ghost clipping factorises: forward and input rows.

`dpnmt.core.ghost` recognises the calls (it holds flax); this module, given a
recognised module and its input, recomputes the call's output as flax does
(`forward`) and gives the rows `A [T, n]` whose product `Aᵀ G` with the output
gradient rows `G [T, width]` is the kernel's gradient (`rows`): the input with
its contracted axes flattened (dense layers), or the patches of a convolution
(pads and slices only: no arithmetic, so exact on every backend).
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
    x, geometry = _conv_geometry(module, x)
    return _patches(x, as_tuple(module.kernel_size), **geometry)


def _patches(
    x: chex.Array,
    window: tuple[int, ...],
    *,
    window_strides: tuple[int, ...],
    padding: Any,
    lhs_dilation: tuple[int, ...],
    rhs_dilation: tuple[int, ...],
    dimension_numbers: Any = None,
) -> chex.Array:
    """The unfold (im2col) view of a conv: output position t reads the window patches[t].

    Built from pads and strided slices only (no multiply-add), so the patches are
    the input's own values on every backend: a conv with an identity filter
    (`lax.conv_general_dilated_patches`) may round float32 to TF32 or bf16 on a
    GPU/TPU, and the per-example norms from it could then come out too small.
    One slice per window offset and axis (`sum(window)` slices, not `prod`).

    Args:
      x: The input, `[N, *spatial, C_in]`.
      window: The kernel's spatial size.
      window_strides: The conv's strides, per spatial axis.
      padding: "SAME", "VALID" or `(low, high)` pairs, as `lax.conv_general_dilated`
        takes it.
      lhs_dilation: The input's dilation (zeros between its elements), per axis.
      rhs_dilation: The kernel's dilation, per axis.
      dimension_numbers: Ignored: flax's channels-last layout.

    Returns:
      `[N · prod(out_spatial), prod(window) · C_in]`, each row in the kernel's
      `[*window, C_in]` order.
    """
    del dimension_numbers
    spatial = x.shape[1:-1]
    if isinstance(padding, str):  # As lax: from the undilated input (it refuses dilation).
        padding = jax.lax.padtype_to_pads(
            spatial,
            [(k - 1) * d + 1 for k, d in zip(window, rhs_dilation, strict=True)],
            window_strides,
            padding,
        )
    pads = [(lo, hi, d - 1) for (lo, hi), d in zip(padding, lhs_dilation, strict=True)]
    x = jax.lax.pad(x, jnp.zeros((), x.dtype), [(0, 0, 0), *pads, (0, 0, 0)])
    geometry = [  # (window, stride, dilation, output size) per spatial axis.
        (k, s, d, (n - (k - 1) * d - 1) // s + 1)
        for n, k, s, d in zip(x.shape[1:-1], window, window_strides, rhs_dilation, strict=True)
    ]
    if min(size for *_, size in geometry) <= 0:  # The window does not fit: no output.
        return jnp.zeros((0, math.prod(window) * x.shape[-1]), x.dtype)
    for axis, (k, stride, dilation, size) in enumerate(geometry, start=1):
        span = (size - 1) * stride + 1
        # A new window axis just before C_in, after the earlier ones.
        x = jnp.stack(
            [
                jax.lax.slice_in_dim(x, j * dilation, j * dilation + span, stride, axis)
                for j in range(k)
            ],
            axis=-2,
        )
    return x.reshape(-1, math.prod(window) * x.shape[-1])


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
