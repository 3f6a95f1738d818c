"""Hugging Face PyTorch state dict -> Flax parameter pytree.

The mapping is derived from our own parameter tree: every Flax leaf names the
one Hugging Face weight it comes from (`hf_name`). A weight the checkpoint lacks,
or a checkpoint weight nothing consumes, is an error that lists the names.
`dpnmt.models.export` inverts it with the same `hf_name` and `tied_names`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import chex
import flax.traverse_util as traverse_util
import numpy as np

from dpnmt.models import factory
from dpnmt.models.config import ModelConfig, T5Config


class WeightNameError(ValueError):
    """The checkpoint's weight names do not match the model's parameters."""

    def __init__(self, missing: list[str], unexpected: list[str], shape_errors: list[str]):
        self.missing = missing
        self.unexpected = unexpected
        self.shape_errors = shape_errors
        lines = []
        if missing:
            lines.append(f"{len(missing)} missing weight(s): {missing}")
        if unexpected:
            lines.append(f"{len(unexpected)} unexpected weight(s): {unexpected}")
        if shape_errors:
            lines.append(f"{len(shape_errors)} shape mismatch(es): {shape_errors}")
        super().__init__("Checkpoint does not match the model config. " + "; ".join(lines))


def to_numpy(tensor: Any) -> np.ndarray:
    """A torch tensor (any float dtype, any device) or array -> float32 numpy."""
    if hasattr(tensor, "detach"):
        tensor = tensor.detach().cpu()
        if tensor.is_floating_point():
            tensor = tensor.float()
        return tensor.numpy()
    return np.asarray(tensor)


_T5_FFN_LAYER = {False: 1, True: 2}
_T5_ATTN = {"self_attention": (0, "SelfAttention"), "cross_attention": (1, "EncDecAttention")}
_T5_NORM = {"self_attention_norm": 0, "cross_attention_norm": 1}


def _t5_name(path: tuple[str, ...]) -> tuple[str, bool]:
    """HF name of a T5 Flax leaf, and whether the array is transposed."""
    if path == ("shared", "embedding"):
        return "shared.weight", False
    if path == ("lm_head", "kernel"):
        return "lm_head.weight", True
    stack = path[0]
    is_decoder = stack == "decoder"
    if path[1:] == ("relative_attention_bias", "embedding"):
        return f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight", False
    if path[1:] == ("final_norm", "scale"):
        return f"{stack}.final_layer_norm.weight", False
    block = int(path[1].removeprefix("block_"))
    prefix = f"{stack}.block.{block}.layer"
    part = path[2]
    if part in _T5_ATTN:
        idx, name = _T5_ATTN[part]
        return f"{prefix}.{idx}.{name}.{path[3]}.weight", True
    if part in _T5_NORM:
        return f"{prefix}.{_T5_NORM[part]}.layer_norm.weight", False
    ffn = _T5_FFN_LAYER[is_decoder]
    if part == "ffn_norm":
        return f"{prefix}.{ffn}.layer_norm.weight", False
    if part == "ffn":
        return f"{prefix}.{ffn}.DenseReluDense.{path[3]}.weight", True
    raise KeyError(f"no Hugging Face name for T5 parameter {'/'.join(path)}")


_MBART_ATTN = {"self_attention": "self_attn", "cross_attention": "encoder_attn"}
_MBART_PROJ = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj"}
_MBART_NORM = {
    "self_attention_norm": "self_attn_layer_norm",
    "cross_attention_norm": "encoder_attn_layer_norm",
    "ffn_norm": "final_layer_norm",
    "layernorm_embedding": "layernorm_embedding",
    "layer_norm": "layer_norm",
}


def _mbart_leaf(leaf: str) -> str:
    return {"kernel": "weight", "scale": "weight", "bias": "bias", "embedding": "weight"}[leaf]


def _mbart_name(path: tuple[str, ...]) -> tuple[str, bool]:
    """HF name of an mBART Flax leaf, and whether the array is transposed."""
    if path == ("shared", "embedding"):
        return "model.shared.weight", False
    if path == ("final_logits_bias",):
        return "final_logits_bias", False
    if path == ("lm_head", "kernel"):
        return "lm_head.weight", True
    stack, rest = path[0], path[1:]
    prefix = f"model.{stack}"
    if rest == ("embed_positions", "embedding"):
        return f"{prefix}.embed_positions.weight", False
    if rest[0] in _MBART_NORM:
        return f"{prefix}.{_MBART_NORM[rest[0]]}.{_mbart_leaf(rest[1])}", False
    layer = int(rest[0].removeprefix("layers_"))
    prefix = f"{prefix}.layers.{layer}"
    part = rest[1]
    if part in _MBART_NORM:
        return f"{prefix}.{_MBART_NORM[part]}.{_mbart_leaf(rest[2])}", False
    if part in _MBART_ATTN:
        name = f"{prefix}.{_MBART_ATTN[part]}.{_MBART_PROJ[rest[2]]}.{_mbart_leaf(rest[3])}"
        return name, rest[3] == "kernel"
    if part == "ffn":
        return f"{prefix}.{rest[2]}.{_mbart_leaf(rest[3])}", rest[3] == "kernel"
    raise KeyError(f"no Hugging Face name for mBART parameter {'/'.join(path)}")


def hf_name(config: ModelConfig, path: tuple[str, ...]) -> tuple[str, bool]:
    """The Hugging Face weight name of a Flax leaf, and whether the array is transposed.

    Args:
        config: The architecture (T5 family or mBART).
        path: The leaf's path in the params tree, e.g. ("shared", "embedding").

    Returns:
        (name, transposed): e.g. ("shared.weight", False); kernels are transposed.
    """
    return (_t5_name if isinstance(config, T5Config) else _mbart_name)(path)


def tied_names(config: ModelConfig) -> tuple[str, list[str], list[str]]:
    """(shared name, names that must equal it if present, names silently ignored)."""
    if isinstance(config, T5Config):
        shared = "shared.weight"
        aliases = ["encoder.embed_tokens.weight", "decoder.embed_tokens.weight"]
        # HF never uses this weight; its own loader ignores it too.
        ignored = [r"decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight"]
    else:
        shared = "model.shared.weight"
        aliases = ["model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"]
        ignored = []
    if config.tie_word_embeddings:
        aliases.append("lm_head.weight")
    return shared, aliases, ignored


def has_untied_lm_head(state_dict: Mapping[str, Any], config: ModelConfig) -> bool:
    """Whether the checkpoint's `lm_head.weight` exists and differs from the embedding."""
    shared, _, _ = tied_names(config)
    if "lm_head.weight" not in state_dict or shared not in state_dict:
        return False
    return not np.array_equal(to_numpy(state_dict["lm_head.weight"]), to_numpy(state_dict[shared]))


def convert_state_dict(state_dict: Mapping[str, Any], config: ModelConfig) -> chex.ArrayTree:
    """Converts a Hugging Face PyTorch state dict to our Flax params.

    Args:
        state_dict: Name -> torch tensor or array, as from `model.state_dict()`,
            `safetensors.torch.load_file` or `torch.load`.
        config: The architecture the weights are for (`tie_word_embeddings`
            decides whether `lm_head.weight` is a separate parameter).

    Returns:
        Params pytree for `factory.create_model(config)`, float32 numpy leaves.

    Raises:
        WeightNameError: Listing weights the model needs but the checkpoint
            lacks, weights of the checkpoint that nothing consumes, tied
            weights that differ from the embedding, and shape mismatches.
    """
    model = factory.create_model(config)
    expected = traverse_util.flatten_dict(factory.abstract_params(model))
    shared, aliases, ignored = tied_names(config)
    missing, shape_errors, consumed = [], [], set()
    flat = {}
    for path, struct in expected.items():
        name, transpose = hf_name(config, path)
        if name not in state_dict:
            if name == "final_logits_bias":  # a zero buffer HF also treats as optional
                flat[path] = np.zeros(struct.shape, np.float32)
                continue
            missing.append(name)
            continue
        consumed.add(name)
        array = to_numpy(state_dict[name])
        if name == "final_logits_bias":
            array = array.reshape(-1)
        if transpose:
            array = array.T
        if array.shape != struct.shape:
            shape_errors.append(f"{name}: checkpoint {array.shape}, model {struct.shape}")
            continue
        flat[path] = array.astype(np.float32)
    unexpected = []
    for name in state_dict:
        if name in consumed or any(re.fullmatch(p, name) for p in ignored):
            continue
        if name in aliases and shared in state_dict:
            if not np.array_equal(to_numpy(state_dict[name]), to_numpy(state_dict[shared])):
                unexpected.append(f"{name} (differs from tied {shared})")
            continue
        unexpected.append(name)
    if missing or unexpected or shape_errors:
        raise WeightNameError(sorted(missing), sorted(unexpected), shape_errors)
    return traverse_util.unflatten_dict(flat)
