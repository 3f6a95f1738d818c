"""Load a Hugging Face checkpoint (hub name or local directory) as Flax params."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from dpnmt.models import convert, factory, hub
from dpnmt.models.config import from_hf_config

_WEIGHT_FILES = (
    ("model.safetensors.index.json", "model.safetensors", "safetensors"),
    ("pytorch_model.bin.index.json", "pytorch_model.bin", "torch"),
)
_TOKENIZER_FILES = hub.TOKENIZER_FILES


def _resolve(name_or_path: str, filename: str) -> str | None:
    """Local path of `filename` in a directory or hub repo, or None if absent."""
    if os.path.isdir(name_or_path):
        path = os.path.join(name_or_path, filename)
        return path if os.path.isfile(path) else None
    from transformers.utils import cached_file  # hub download (needs internet)

    return cached_file(
        name_or_path,
        filename,
        _raise_exceptions_for_missing_entries=False,
        _raise_exceptions_for_connection_errors=False,
    )


def find_file(name_or_path: str, filename: str) -> str | None:
    """Local path of `filename` in a model folder or hub repo; None when the model has none.

    The same places `load_pretrained` reads (a folder, else the hub through its
    local cache), but telling "the model has no such file" from "it cannot be
    known": `_resolve` (transformers' `cached_file`) answers None to both.

    Args:
      name_or_path: a local folder (`~` expanded) or a hub id.
      filename: a file name inside it, e.g. "dpnmt.json".

    Raises:
      ValueError: `name_or_path` is neither a local folder nor a valid hub id
        (no model can be loaded from it).
      OSError: whether the model has the file cannot be known: a hub id whose
        file is neither in the local cache (nor recorded there as absent) nor
        reachable (offline, no network, a private or unknown repo).
    """
    folder = os.path.expanduser(name_or_path)
    if os.path.isdir(folder):
        path = os.path.join(folder, filename)
        return path if os.path.isfile(path) else None
    import huggingface_hub  # noqa: PLC0415 - only hub ids need it.
    from huggingface_hub.errors import RemoteEntryNotFoundError  # noqa: PLC0415
    from huggingface_hub.utils import validate_repo_id  # noqa: PLC0415

    validate_repo_id(name_or_path)  # ValueError when not a hub id.
    try:  # Offline (HF_HUB_OFFLINE), this reads the local cache only.
        if not hub.is_offline():  # One short request: an unreachable hub fails at once.
            hub.hub_has(name_or_path, filename)
        return huggingface_hub.hf_hub_download(name_or_path, filename)
    except RemoteEntryNotFoundError:
        return None  # The hub answered: the repo has no such file.
    except OSError as error:  # Offline and not cached, unreachable, unknown repo.
        cached = huggingface_hub.try_to_load_from_cache(name_or_path, filename)
        if cached is huggingface_hub._CACHED_NO_EXIST:  # A past download found none.
            return None
        raise OSError(
            f"{name_or_path!r} is not a local folder and its {filename} could not be read "
            f"from the Hugging Face hub or its local cache ({type(error).__name__}: {error})"
        ) from error


def _read_weights(path: str, kind: str) -> dict[str, Any]:
    if kind == "safetensors":
        from safetensors.torch import load_file

        return load_file(path)
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def load_state_dict(name_or_path: str) -> dict[str, Any]:
    """The PyTorch state dict of a checkpoint (sharded or not, safetensors or .bin).

    Args:
        name_or_path: Local directory or hub model name.

    Returns:
        Name -> torch tensor.

    Raises:
        FileNotFoundError: If no weight file is found.
    """
    for index_name, single_name, kind in _WEIGHT_FILES:
        index = _resolve(name_or_path, index_name)
        if index is not None:
            with open(index) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
            state_dict = {}
            for shard in shards:
                shard_path = _resolve(name_or_path, shard)
                if shard_path is None:
                    raise FileNotFoundError(
                        f"{name_or_path}: shard {shard} listed in {index_name} is missing."
                    )
                state_dict.update(_read_weights(shard_path, kind))
            return state_dict
        single = _resolve(name_or_path, single_name)
        if single is not None:
            return _read_weights(single, kind)
    names = [n for pair in _WEIGHT_FILES for n in pair[:2]]
    raise FileNotFoundError(f"{name_or_path}: no weights found; looked for {names}.")


def _load_tokenizer(name_or_path: str) -> Any | None:
    import transformers

    if os.path.isdir(name_or_path) and not any(
        os.path.isfile(os.path.join(name_or_path, f)) for f in _TOKENIZER_FILES
    ):
        logging.warning(
            "%s has no tokenizer files (%s); returning tokenizer=None.",
            name_or_path,
            ", ".join(_TOKENIZER_FILES),
        )
        return None
    return transformers.AutoTokenizer.from_pretrained(name_or_path)


def load_pretrained(name_or_path: str) -> tuple[nn.Module, chex.ArrayTree, Any | None]:
    """Loads config, tokenizer and converted weights of a Hugging Face model.

    Whether the output projection is tied to the embedding is decided by the
    weights: a `lm_head.weight` that differs from the embedding (T5 v1.1,
    mT5) becomes its own parameter.

    Args:
        name_or_path: Local directory (always works) or hub name (needs internet),
            holding a `config.json` of model_type t5, mt5 or mbart and
            safetensors / PyTorch weights.

    Returns:
        (model, params, tokenizer): the Flax module, its params (float32 jax
        arrays) and a `transformers` tokenizer, or None when a local directory
        holds no tokenizer files.

    Raises:
        ValueError: For an unsupported model_type.
        convert.WeightNameError: If the weights do not match the config.
    """
    import transformers

    hf_config = transformers.AutoConfig.from_pretrained(name_or_path)
    config = from_hf_config(hf_config)
    state_dict = load_state_dict(name_or_path)
    config = dataclasses.replace(
        config, tie_word_embeddings=not convert.has_untied_lm_head(state_dict, config)
    )
    params = convert.convert_state_dict(state_dict, config)
    params = jax.tree.map(jnp.asarray, params)
    return factory.create_model(config), params, _load_tokenizer(name_or_path)
