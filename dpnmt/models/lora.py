"""Low-rank adapters (LoRA, Hu et al. 2021) on the dense kernels of T5 and mBART.

A targeted layer computes `x W + b + (alpha / r) (x A) B`: the frozen base
`nn.Dense` (its `kernel`/`bias` keep their paths, so pretrained weights load
unchanged) plus two bias-free `nn.Dense` layers `lora_a` (d_in -> r) and
`lora_b` (r -> d_out, initialised to zero: the model's output is unchanged at
init). All three are plain `nn.Dense` calls, so ghost clipping
(`dpnmt.core.ghost`) computes the adapters' per-example norms exactly.

    spec = LoRASpec(rank=8, targets=("q", "v"))
    config = dataclasses.replace(config, lora=spec)
    params = factory.add_adapters(create_model(config), base_params, rng)
    trainable, frozen = split_params(params, is_adapter)
    ... train ...
    plain_params, plain_config = merge_adapters(params, config)  # for export
"""

from __future__ import annotations

import dataclasses
from typing import Any

import chex
import flax.linen as nn
import flax.traverse_util as traverse_util
import jax.numpy as jnp

from dpnmt.models.config import LoRASpec, ModelConfig, T5Config

ADAPTER_NAMES = ("lora_a", "lora_b")
_ATTENTION = ("q", "k", "v", "o")
# Every target name some architecture has (for messages when it is unknown).
ALL_TARGETS = (*_ATTENTION, "wi", "wi_0", "wi_1", "wo", "fc1", "fc2")


def valid_targets(model_type: str, *, gated: bool = False) -> tuple[str, ...]:
    """Dense layers that can take an adapter, by architecture.

    Args:
        model_type: "t5", "mt5" or "mbart".
        gated: T5 only: a gated feed-forward (v1.1 / mT5: wi_0, wi_1) rather
            than v1.0's single wi.

    Returns:
        The names, attention first.
    """
    if model_type == "mbart":
        return (*_ATTENTION, "fc1", "fc2")
    return (*_ATTENTION, *(("wi_0", "wi_1") if gated else ("wi",)), "wo")


def targets_of(config: ModelConfig) -> tuple[str, ...]:
    """`valid_targets` of a model config."""
    gated = isinstance(config, T5Config) and config.is_gated_act
    return valid_targets(config.model_type, gated=gated)


def check_targets(targets: tuple[str, ...], valid: tuple[str, ...]) -> str | None:
    """One line naming the targets `valid` lacks (and listing the valid ones), or None."""
    if not targets:
        return f"no adapter targets given; choose from {', '.join(valid)}."
    unknown = [t for t in targets if t not in valid]
    if unknown:
        return f"unknown target(s) {', '.join(unknown)}; valid for this model: {', '.join(valid)}."
    return None


class LoRADense(nn.Module):
    """`nn.Dense` plus a low-rank adapter; same `kernel`/`bias` paths as `nn.Dense`.

    Attributes:
        features: d_out.
        rank: r >= 1.
        scale: alpha / r, the factor of the adapter's output.
        use_bias: Whether the base layer has a bias.
        kernel_init: The base kernel's initialiser.
        bias_init: The base bias's initialiser.
    """

    features: int
    rank: int
    scale: float
    use_bias: bool = True
    kernel_init: Any = nn.initializers.lecun_normal()
    bias_init: Any = nn.initializers.zeros

    def setup(self):  # noqa: D102 (flax hook)
        self.base = nn.Dense(
            self.features,
            use_bias=self.use_bias,
            kernel_init=self.kernel_init,
            bias_init=self.bias_init,
        )
        nn.share_scope(self, self.base)  # base's kernel/bias live at this module's path.
        # A: uniform(±1/sqrt(d_in)), as PEFT's kaiming_uniform(a=√5); B: zero.
        self.lora_a = nn.Dense(
            self.rank,
            use_bias=False,
            kernel_init=nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform"),
        )
        self.lora_b = nn.Dense(self.features, use_bias=False, kernel_init=nn.initializers.zeros)

    def __call__(self, x: chex.Array) -> chex.Array:
        """[..., d_in] -> [..., d_out]: base output plus the scaled adapter output."""
        return self.base(x) + self.lora_b(self.lora_a(x)) * self.scale


def dense(spec: LoRASpec, target: str, features: int, **kwargs) -> nn.Module:
    """An `nn.Dense(features, **kwargs)`, or a `LoRADense` if `spec` adapts `target`.

    Args:
        spec: The model's adapters.
        target: The layer's module name ("q", "wo", "fc1", ...).
        features: d_out.
        **kwargs: `nn.Dense` options (use_bias, kernel_init, bias_init, name).
    """
    if spec.adapts(target):
        return LoRADense(features, rank=spec.rank, scale=spec.scale, **kwargs)
    return nn.Dense(features, **kwargs)


def is_adapter(path: str, _leaf: Any = None) -> bool:
    """Whether a '/'-joined parameter path is an adapter weight (a `split_params` predicate)."""
    return any(part in ADAPTER_NAMES for part in path.split("/"))


def merge_adapters(
    params: chex.ArrayTree, config: ModelConfig
) -> tuple[chex.ArrayTree, ModelConfig]:
    """Folds each adapter into its kernel: `W + (alpha / r) A B`; the config without adapters.

    Args:
        params: Params of a model with `config.lora` (adapter leaves under
            `.../<target>/lora_a/kernel` [d_in, r] and `lora_b/kernel` [r, d_out]).
        config: Its config.

    Returns:
        (params of the same model without adapters, the config with
        `lora=LoRASpec()`): the same function of the inputs, up to float32
        rounding. Params without adapters are returned as given.
    """
    flat = traverse_util.flatten_dict(params)
    merged = {k: v for k, v in flat.items() if not is_adapter("/".join(k))}
    if len(merged) == len(flat):
        return params, dataclasses.replace(config, lora=LoRASpec())
    scale = config.lora.scale
    for path in flat:
        if path[-2:] != ("lora_a", "kernel"):
            continue
        layer = path[:-2]
        a, b = flat[path], flat[(*layer, "lora_b", "kernel")]
        kernel = flat[(*layer, "kernel")]
        update = jnp.matmul(
            jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32), precision="highest"
        )
        merged[(*layer, "kernel")] = (jnp.asarray(kernel, jnp.float32) + scale * update).astype(
            jnp.asarray(kernel).dtype
        )
    return traverse_util.unflatten_dict(merged), dataclasses.replace(config, lora=LoRASpec())


__all__ = [
    "ADAPTER_NAMES",
    "ALL_TARGETS",
    "LoRADense",
    "LoRASpec",
    "check_targets",
    "dense",
    "is_adapter",
    "merge_adapters",
    "targets_of",
    "valid_targets",
]
