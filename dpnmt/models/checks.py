"""What `config.model` asks of the models that exist.

A real folder, a known activation, LoRA targets the architecture has, bias
terms to train.

The rules the model section alone can check are `dpnmt.config.ModelConfig.problems`.
"""

import json
import os

from dpnmt.models import lora
from dpnmt.models.config import T5Config


def looks_local(name_or_path: str) -> bool:
    """A path, not a hub id ("org/name"): starts like a path or has two slashes."""
    return name_or_path.startswith(("/", ".", "~")) or name_or_path.count("/") > 1


def local_hf_config(name_or_path: str) -> dict | None:
    """A local model folder's Hugging Face config.json, or None when it cannot be read.

    None for a hub id, a missing folder or a malformed file (not JSON, or not an
    object): the model files' own checks name those.
    """
    path = os.path.join(os.path.expanduser(name_or_path), "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def architecture(model) -> tuple[str, bool] | None:
    """(model_type, gated feed-forward) of the model the run builds, if known unloaded.

    From scratch it is a T5 of `model.feed_forward_proj`; a local pretrained
    folder says in its config.json; a hub id is not looked up (None).
    """
    name = model.name_or_path
    if name is None:
        return "t5", str(model.feed_forward_proj).startswith("gated-")
    hf_config = local_hf_config(name)
    if hf_config is None:
        return None
    gated = str(hf_config.get("feed_forward_proj", "relu")).startswith("gated-")
    return str(hf_config.get("model_type")), gated


def model_problems(model) -> list[str]:
    """Problems of `model` (a `dpnmt.config.ModelConfig`) against the models that exist.

    Returns:
      One line per problem, naming the field and the fix.
    """
    problems = []
    name = model.name_or_path
    if name is not None:
        if looks_local(name) and not os.path.isdir(os.path.expanduser(name)):
            problems.append(
                f"model.name_or_path={name!r}: no such folder; give a local folder holding "
                "the model (config.json and weights) or a hub id such as 'google/t5-small'."
            )
    else:
        try:
            T5Config(feed_forward_proj=model.feed_forward_proj)
        except (ValueError, AttributeError) as error:
            problems.append(f"model.{error}")
    return problems + _finetune_problems(model)


def _finetune_problems(model) -> list[str]:
    """LoRA targets the architecture has; bias-only training of a model with biases."""
    mode, rank = model.finetune, model.lora_rank
    if not isinstance(rank, int) or rank < 0:
        return []  # Named by the range check.
    problems = []
    found = architecture(model)
    known = found is not None and found[0] in ("t5", "mt5", "mbart")
    if mode == "lora" and rank > 0:
        valid = lora.valid_targets(found[0], gated=found[1]) if known else None
        problem = lora.check_targets(model.lora_target_names, valid or lora.ALL_TARGETS)
        if problem:
            problems.append(f"model.lora_targets={model.lora_targets!r}: {problem}")
    if mode == "bias" and known and found[0] in ("t5", "mt5"):
        problems.append(
            "model.finetune='bias' trains only bias terms, and T5 and mT5 layers have none "
            "(they are bias-free): use model.finetune='lora' or 'all', or an mBART model."
        )
    return problems
