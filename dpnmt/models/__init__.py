"""Flax seq2seq models (T5, mT5, mBART) with Hugging Face conversion and decoding.

Example:
    model, params, tokenizer = load_pretrained("google/mt5-small")  # or a local dir
    logits = model.apply({"params": params}, ids, mask, decoder_inputs(model.config, labels))
    trainable, frozen = split_params(params, cross_attention_only)
    # LoRA: config = dataclasses.replace(config, lora=LoRASpec(8, None, ("q", "v")))
    # params = add_adapters(create_model(config), params, rng); train only is_adapter.
    gen = GenerationConfig(max_new_tokens=64, decoder_start_token_id=0, eos_token_id=1,
                           pad_token_id=0, num_beams=4)
    tokens, scores = generate(model, params, ids, mask, gen)
"""

from dpnmt.models.checkpoint import load_params, save_params
from dpnmt.models.config import LoRASpec, MBartConfig, T5Config, from_hf_config
from dpnmt.models.convert import WeightNameError, convert_state_dict
from dpnmt.models.decoding import GenerationConfig, generate, make_generate_fn
from dpnmt.models.factory import abstract_params, add_adapters, create_model, init_params
from dpnmt.models.lora import is_adapter, merge_adapters
from dpnmt.models.mbart import MBartForConditionalGeneration
from dpnmt.models.partition import (
    all_but_embeddings,
    bias_only,
    cross_attention_only,
    merge_params,
    regex_trainable,
    split_params,
)
from dpnmt.models.pretrained import load_pretrained
from dpnmt.models.t5 import T5ForConditionalGeneration
from dpnmt.models.targets import decoder_inputs

__all__ = [
    "GenerationConfig",
    "LoRASpec",
    "MBartConfig",
    "MBartForConditionalGeneration",
    "T5Config",
    "T5ForConditionalGeneration",
    "WeightNameError",
    "abstract_params",
    "add_adapters",
    "all_but_embeddings",
    "bias_only",
    "convert_state_dict",
    "create_model",
    "decoder_inputs",
    "cross_attention_only",
    "from_hf_config",
    "generate",
    "init_params",
    "is_adapter",
    "load_params",
    "load_pretrained",
    "make_generate_fn",
    "merge_adapters",
    "merge_params",
    "regex_trainable",
    "save_params",
    "split_params",
]
