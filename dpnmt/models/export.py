"""Flax parameter pytree -> a Hugging Face transformers (PyTorch) checkpoint.

The inverse of `dpnmt.models.convert`: each Flax leaf goes to the weight that
`convert.hf_name` names, tied aliases (T5's and mBART's `embed_tokens`, a tied
`lm_head`) are filled from the shared embedding, and transformers' own
`save_pretrained` writes `config.json`, `model.safetensors` and
`generation_config.json`. LoRA adapters are merged into their kernels first
(`lora.merge_adapters`): the export is a plain model.
"""

from __future__ import annotations

import os
from typing import Any

import chex
import flax.traverse_util as traverse_util
import numpy as np

from dpnmt.models import convert, lora
from dpnmt.models.config import MBartConfig, ModelConfig, T5Config


def to_state_dict(params: chex.ArrayTree, config: ModelConfig) -> dict[str, np.ndarray]:
    """Hugging Face weight name -> float32 array, tied aliases included.

    Args:
        params: Flax params of `factory.create_model(config)` (jax or numpy leaves).
        config: Their architecture; with `config.lora`, adapters are merged
            into their kernels (`W + (alpha / r) A B`).

    Returns:
        A state dict that `convert.convert_state_dict(…, config)` maps back to
        `params` exactly (to the merged params for a model with adapters).
    """
    params, config = lora.merge_adapters(params, config)
    state_dict = {}
    for path, leaf in traverse_util.flatten_dict(params).items():
        name, transpose = convert.hf_name(config, path)
        array = np.asarray(leaf, np.float32)
        if transpose:
            array = array.T
        if name == "final_logits_bias":  # HF keeps it as a [1, vocab] buffer.
            array = array.reshape(1, -1)
        state_dict[name] = np.ascontiguousarray(array)
    shared, aliases, _ = convert.tied_names(config)
    for alias in aliases:
        state_dict[alias] = state_dict[shared]
    return state_dict


def to_hf_config(config: ModelConfig) -> Any:
    """The `transformers` config (T5Config, MT5Config or MBartConfig) of `config`.

    transformers 5 always ties T5's `lm_head` in its config; an untied head is
    kept by giving the weights separately (see `to_hf_model`). For T5 v1.0/v1.1
    its `tie_word_embeddings=False` argument means "do not scale decoder outputs".
    """
    import transformers

    if isinstance(config, T5Config):
        common = dict(
            vocab_size=config.vocab_size,
            d_model=config.d_model,
            d_kv=config.d_kv,
            d_ff=config.d_ff,
            num_layers=config.num_layers,
            num_decoder_layers=config.num_decoder_layers,
            num_heads=config.num_heads,
            relative_attention_num_buckets=config.relative_attention_num_buckets,
            relative_attention_max_distance=config.relative_attention_max_distance,
            dropout_rate=config.dropout_rate,
            layer_norm_epsilon=config.layer_norm_epsilon,
            feed_forward_proj=config.feed_forward_proj,
            pad_token_id=config.pad_token_id,
            eos_token_id=config.eos_token_id,
            decoder_start_token_id=config.decoder_start_token_id,
        )
        if config.model_type == "mt5":
            if config.scale_decoder_outputs:
                raise ValueError("mT5 never scales decoder outputs; use model_type='t5'.")
            return transformers.MT5Config(**common)
        return transformers.T5Config(tie_word_embeddings=config.scale_decoder_outputs, **common)
    if isinstance(config, MBartConfig):
        return transformers.MBartConfig(
            vocab_size=config.vocab_size,
            d_model=config.d_model,
            encoder_layers=config.encoder_layers,
            decoder_layers=config.decoder_layers,
            encoder_attention_heads=config.encoder_attention_heads,
            decoder_attention_heads=config.decoder_attention_heads,
            encoder_ffn_dim=config.encoder_ffn_dim,
            decoder_ffn_dim=config.decoder_ffn_dim,
            max_position_embeddings=config.max_position_embeddings,
            dropout=config.dropout,
            attention_dropout=config.attention_dropout,
            activation_dropout=config.activation_dropout,
            activation_function=config.activation_function,
            scale_embedding=config.scale_embedding,
            tie_word_embeddings=config.tie_word_embeddings,
            pad_token_id=config.pad_token_id,
            bos_token_id=config.bos_token_id,
            eos_token_id=config.eos_token_id,
            decoder_start_token_id=config.decoder_start_token_id,
            forced_bos_token_id=config.forced_bos_token_id,
            forced_eos_token_id=config.forced_eos_token_id,
        )
    raise TypeError(f"Cannot export a {type(config).__name__}; expected T5Config or MBartConfig.")


def to_hf_model(params: chex.ArrayTree, config: ModelConfig) -> Any:
    """A transformers PyTorch model (eval mode) holding `params`.

    Raises:
        convert.WeightNameError: If the model transformers builds expects
            weights that `params` does not give, or the reverse.
    """
    import torch
    import transformers

    hf_config = to_hf_config(config)
    model = transformers.AutoModelForSeq2SeqLM.from_config(hf_config)
    if not config.tie_word_embeddings:
        # Untie: a parameter of its own, and no longer listed as tied (else
        # save_pretrained would drop it and loading would tie it again).
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
        getattr(model, "all_tied_weights_keys", {}).pop("lm_head.weight", None)
    state_dict = {k: torch.from_numpy(v.copy()) for k, v in to_state_dict(params, config).items()}
    result = model.load_state_dict(state_dict, strict=False)
    _, aliases, ignored = convert.tied_names(config)
    missing = [k for k in result.missing_keys if k not in aliases]
    unexpected = [k for k in result.unexpected_keys if k not in ignored]
    if missing or unexpected:
        raise convert.WeightNameError(sorted(missing), sorted(unexpected), [])
    return model.eval()


def save_pretrained(
    params: chex.ArrayTree,
    config: ModelConfig,
    out_dir: str,
    *,
    generation: dict[str, int | float] | None = None,
) -> None:
    """Writes `config.json`, `model.safetensors`, `generation_config.json` to `out_dir`.

    Args:
        params: The Flax parameters.
        config: Their model config.
        out_dir: The folder (made if missing).
        generation: `GenerationConfig` fields for `generate`'s defaults (max_new_tokens,
            num_beams, length_penalty, no_repeat_ngram_size); None: transformers' own
            (which stop at 20 tokens).
    """
    os.makedirs(out_dir, exist_ok=True)
    model = to_hf_model(params, config)
    if generation is not None:
        fields = dict(generation)
        if fields.get("num_beams", 1) == 1:  # transformers refuses it without beams.
            fields.pop("length_penalty", None)
        model.generation_config.update(**fields)
    model.save_pretrained(out_dir)
