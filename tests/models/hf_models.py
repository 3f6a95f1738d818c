"""Tiny random Hugging Face PyTorch models and their converted Flax twins."""

import dataclasses

import numpy as np
import torch
import transformers

from dpnmt.models import convert, factory
from dpnmt.models.config import from_hf_config

# Tiny models: thread start-up dominates, and CI cores are shared with XLA.
torch.set_num_threads(1)

KINDS = ("t5_v1", "t5_v11", "mt5", "mbart")
VOCAB = 100
_T5_COMMON = dict(
    vocab_size=VOCAB,
    d_model=32,
    d_kv=8,
    d_ff=64,
    num_layers=2,
    num_heads=4,
    # Small buckets so 30-token inputs reach the logarithmic buckets.
    relative_attention_num_buckets=8,
    relative_attention_max_distance=20,
)


def hf_model(kind: str, seed: int = 0, diverse: bool = False) -> torch.nn.Module:
    """A random eval-mode HF model; T5 v1.1 / mT5 get an untied lm_head.

    `diverse` scales T5 v1.0 init by 4 so greedy/beam outputs are not one token
    repeated (its logits are then large, ~50, and float32 noise exceeds 1e-4).
    """
    torch.manual_seed(seed)
    if kind == "t5_v1":
        factor = 4.0 if diverse else 1.0
        cfg = transformers.T5Config(
            feed_forward_proj="relu", initializer_factor=factor, **_T5_COMMON
        )
        model = transformers.T5ForConditionalGeneration(cfg)
    elif kind == "t5_v11":
        cfg = transformers.T5Config(
            feed_forward_proj="gated-gelu", tie_word_embeddings=False, **_T5_COMMON
        )
        model = transformers.T5ForConditionalGeneration(cfg)
    elif kind == "mt5":
        model = transformers.MT5ForConditionalGeneration(transformers.MT5Config(**_T5_COMMON))
    elif kind == "mbart":
        cfg = transformers.MBartConfig(
            vocab_size=VOCAB,
            d_model=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=48,
            max_position_embeddings=64,
            scale_embedding=True,
            init_std=0.3,
        )
        model = transformers.MBartForConditionalGeneration(cfg)
    else:
        raise ValueError(kind)
    if kind in ("t5_v11", "mt5"):
        # transformers 5 ties lm_head at construction; real v1.1/mT5 checkpoints do not.
        model.lm_head.weight = torch.nn.Parameter(torch.randn(VOCAB, 32))
    if kind == "mbart":
        with torch.no_grad():
            model.final_logits_bias.normal_()
    model.config._attn_implementation = "eager"
    return model.eval()


def convert_model(hf: torch.nn.Module):
    """(our config, Flax module, params) converted from `hf`."""
    state_dict = hf.state_dict()
    config = from_hf_config(hf.config)
    config = dataclasses.replace(
        config, tie_word_embeddings=not convert.has_untied_lm_head(state_dict, config)
    )
    return config, factory.create_model(config), convert.convert_state_dict(state_dict, config)


def padded_batch(seed: int, batch: int, src_len: int, tgt_len: int):
    """Random ids with right padding of varying lengths (first row unpadded)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, VOCAB, (batch, src_len))
    mask = np.ones((batch, src_len), np.int64)
    dec = rng.integers(3, VOCAB, (batch, tgt_len))
    dec_mask = np.ones((batch, tgt_len), np.int64)
    for row in range(1, batch):
        mask[row, rng.integers(2, src_len) :] = 0
        dec_mask[row, rng.integers(2, tgt_len) :] = 0
    ids = np.where(mask == 1, ids, 0)
    return ids, mask, dec, dec_mask


def hf_logits(hf: torch.nn.Module, ids, mask, dec, dec_mask) -> np.ndarray:
    """transformers' logits `[B, T, V]` for a `padded_batch` (no gradients)."""
    with torch.no_grad():
        return hf(
            input_ids=torch.tensor(ids),
            attention_mask=torch.tensor(mask),
            decoder_input_ids=torch.tensor(dec),
            decoder_attention_mask=torch.tensor(dec_mask),
        ).logits.numpy()
