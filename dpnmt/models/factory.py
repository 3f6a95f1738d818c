"""Config -> Flax model factory and from-scratch parameter initialisation."""

from __future__ import annotations

import chex
import flax.linen as nn
import flax.traverse_util as traverse_util
import jax
import jax.numpy as jnp

from dpnmt.models import lora
from dpnmt.models.config import MBartConfig, ModelConfig, T5Config
from dpnmt.models.mbart import MBartForConditionalGeneration
from dpnmt.models.t5 import T5ForConditionalGeneration

_MODEL_CLASSES = {
    "t5": T5ForConditionalGeneration,
    "mt5": T5ForConditionalGeneration,
    "mbart": MBartForConditionalGeneration,
}


def create_model(config: ModelConfig) -> nn.Module:
    """Returns the Flax module for `config`, keyed by `config.model_type`.

    Raises:
        ValueError: If the model type is unknown or does not match the config class.
    """
    cls = _MODEL_CLASSES.get(config.model_type)
    if cls is None:
        raise ValueError(
            f"config.model_type={config.model_type!r} is not supported; "
            f"supported: {sorted(_MODEL_CLASSES)}."
        )
    expected = MBartConfig if cls is MBartForConditionalGeneration else T5Config
    if not isinstance(config, expected):
        raise ValueError(
            f"model_type={config.model_type!r} needs a {expected.__name__}, got "
            f"{type(config).__name__}."
        )
    return cls(config)


def _dummy_inputs() -> tuple[chex.Array, chex.Array, chex.Array]:
    ids = jnp.ones((1, 2), jnp.int32)
    return ids, jnp.ones((1, 2), jnp.int32), ids


def init_params(model: nn.Module, rng: chex.PRNGKey) -> chex.ArrayTree:
    """From-scratch parameters (the Hugging Face initialisation scheme).

    Args:
        model: From `create_model`.
        rng: PRNG key.

    Returns:
        The 'params' pytree (nested dicts of float32 arrays).
    """
    return jax.jit(model.init)(rng, *_dummy_inputs())["params"]


def abstract_params(model: nn.Module) -> chex.ArrayTree:
    """Shapes and dtypes of the parameters (`jax.ShapeDtypeStruct` leaves), no compute."""
    return jax.eval_shape(lambda: init_params(model, jax.random.key(0)))


def add_adapters(
    model: nn.Module, base_params: chex.ArrayTree, rng: chex.PRNGKey
) -> chex.ArrayTree:
    """`base_params` (a model without adapters) plus freshly initialised adapters.

    Args:
        model: The module with adapters (`create_model(config)`, `config.lora` set).
        base_params: Parameters of the same architecture without adapters
            (e.g. `load_pretrained`'s).
        rng: Key of the adapters' initialisation (public).

    Returns:
        The params of `model`: the base leaves unchanged, A random, B zero.

    Raises:
        ValueError: If the base params do not fit the model.
    """
    # jit drops the initialisation of every non-adapter leaf (dead code).
    adapters = jax.jit(
        lambda key: {
            k: v
            for k, v in traverse_util.flatten_dict(init_params(model, key)).items()
            if lora.is_adapter("/".join(k))
        }
    )(rng)
    flat = traverse_util.flatten_dict(base_params)
    expected = traverse_util.flatten_dict(abstract_params(model))
    missing = sorted("/".join(k) for k in expected.keys() - flat.keys() - adapters.keys())
    if missing:
        raise ValueError(f"base params lack {missing[:5]} for the adapted model.")
    return traverse_util.unflatten_dict({**flat, **adapters})
