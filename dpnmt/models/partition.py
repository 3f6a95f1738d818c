"""Split params into trainable and frozen parts before per-example gradients.

Freezing in the optimizer still materialises a per-example gradient for every
parameter; taking gradients only with respect to the trainable part means
frozen parameters cost no per-example memory:

    trainable, frozen = split_params(params, cross_attention_only)
    def loss(trainable, example):
        return loss_fn(merge_params(trainable, frozen), example)
    per_example_grads = jax.vmap(jax.grad(loss), in_axes=(None, 0))(trainable, batch)
"""

from __future__ import annotations

import re
from collections.abc import Callable

import chex
import flax.traverse_util as traverse_util

TrainableFn = Callable[[str, chex.Array], bool]


def param_path(path: tuple[str, ...]) -> str:
    """'encoder/block_0/self_attention/q/kernel' from a flattened-dict key."""
    return "/".join(str(p) for p in path)


def regex_trainable(pattern: str) -> TrainableFn:
    """Trainable iff `re.search(pattern, path)` matches the '/'-joined param path."""
    compiled = re.compile(pattern)
    return lambda path, _: compiled.search(path) is not None


# Only encoder-decoder (cross) attention layers and their norms.
cross_attention_only = regex_trainable(r"(^|/)cross_attention(_norm)?/")
# Everything except token and learned position embeddings.
all_but_embeddings = regex_trainable(r"^(?!shared/)(?!.*embed_positions/)")
# Bias terms only (BitFit): dense and layer-norm biases, mBART's final_logits_bias.
# T5 has none: nothing matches (split_params then raises).
bias_only = regex_trainable(r"(^|/)(bias|final_logits_bias)$")


def split_params(
    params: chex.ArrayTree, trainable_fn: TrainableFn
) -> tuple[chex.ArrayTree, chex.ArrayTree]:
    """Partitions nested-dict params into (trainable, frozen) nested dicts.

    Args:
        params: Nested dict of arrays (a Flax 'params' collection).
        trainable_fn: `(path, array) -> bool`, path like
            'decoder/block_1/cross_attention/q/kernel'.

    Returns:
        Two nested dicts with disjoint leaves whose union is `params`; a
        subtree with no leaf on one side is absent there (no placeholders).

    Raises:
        ValueError: If no parameter is trainable (a mistyped spec).
    """
    flat = traverse_util.flatten_dict(params)
    trainable = {k: v for k, v in flat.items() if trainable_fn(param_path(k), v)}
    if not trainable:
        raise ValueError(
            f"trainable_fn selected no parameter; paths look like {param_path(next(iter(flat)))!r}."
        )
    frozen = {k: v for k, v in flat.items() if k not in trainable}
    return traverse_util.unflatten_dict(trainable), traverse_util.unflatten_dict(frozen)


def merge_params(trainable: chex.ArrayTree, frozen: chex.ArrayTree) -> chex.ArrayTree:
    """Inverse of `split_params`.

    Raises:
        ValueError: If a parameter path occurs in both parts.
    """
    flat_trainable = traverse_util.flatten_dict(trainable)
    flat_frozen = traverse_util.flatten_dict(frozen)
    overlap = sorted(param_path(k) for k in flat_trainable.keys() & flat_frozen.keys())
    if overlap:
        raise ValueError(f"parameters in both trainable and frozen parts: {overlap}")
    return traverse_util.unflatten_dict({**flat_frozen, **flat_trainable})
