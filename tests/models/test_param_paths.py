"""Parameter and cache paths of small T5, mT5 and mBART models, pinned.

Checkpoints, Hugging Face conversion (`convert.py`), partition presets, LoRA
targets and ghost clipping's module paths all rely on these names; they were
taken from the models as they stood before the shared `seq2seq` base. Shapes
come from `jax.eval_shape`: no parameters are computed.
"""

import flax.traverse_util as traverse_util
import jax
import jax.numpy as jnp
import pytest

from dpnmt.models import factory
from dpnmt.models.config import LoRASpec, MBartConfig, T5Config

_T5 = dict(
    vocab_size=11, d_model=6, d_kv=2, d_ff=5, num_layers=1, num_decoder_layers=2, num_heads=3
)
CONFIGS = {
    "t5": T5Config(relative_attention_num_buckets=4, **_T5),
    "mt5": T5Config(
        model_type="mt5",
        relative_attention_num_buckets=4,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
        scale_decoder_outputs=False,
        lora=LoRASpec(1, None, ("q", "wo")),
        **_T5,
    ),
    "mbart": MBartConfig(
        vocab_size=11,
        d_model=6,
        encoder_layers=1,
        decoder_layers=2,
        encoder_attention_heads=3,
        decoder_attention_heads=2,
        encoder_ffn_dim=5,
        decoder_ffn_dim=4,
        max_position_embeddings=7,
        tie_word_embeddings=False,
        lora=LoRASpec(1, None, ("v", "fc2")),
    ),
}

# Per model: (top-level and per-stack leaves, per-layer leaves with {S} the
# stack and {F} its feed-forward width, decoder-only per-layer leaves, the
# layers' list name). A "-" line is absent from the encoder.
_T5_ATTENTION = "\n".join(f"{{A}}/{n}/kernel (6, 6)" for n in "qkvo")
_MBART_ATTENTION = "\n".join(f"{{A}}/{n}/kernel (6, 6)\n{{A}}/{n}/bias (6,)" for n in "qkvo")
LAYOUT = {
    "t5": (
        """shared/embedding (11, 6)
        {S}/relative_attention_bias/embedding (4, 3)
        {S}/final_norm/scale (6,)""",
        f"""{_T5_ATTENTION.format(A="{L}/self_attention")}
        {{L}}/self_attention_norm/scale (6,)
        {{L}}/ffn/wi/kernel (6, 5)
        {{L}}/ffn/wo/kernel (5, 6)
        {{L}}/ffn_norm/scale (6,)""",
        f"""{_T5_ATTENTION.format(A="{L}/cross_attention")}
        {{L}}/cross_attention_norm/scale (6,)""",
        "block",
    ),
    "mt5": (
        """shared/embedding (11, 6)
        lm_head/kernel (6, 11)
        {S}/relative_attention_bias/embedding (4, 3)
        {S}/final_norm/scale (6,)""",
        f"""{_T5_ATTENTION.format(A="{L}/self_attention")}
        {{L}}/self_attention/q/lora_a/kernel (6, 1)
        {{L}}/self_attention/q/lora_b/kernel (1, 6)
        {{L}}/self_attention_norm/scale (6,)
        {{L}}/ffn/wi_0/kernel (6, 5)
        {{L}}/ffn/wi_1/kernel (6, 5)
        {{L}}/ffn/wo/kernel (5, 6)
        {{L}}/ffn/wo/lora_a/kernel (5, 1)
        {{L}}/ffn/wo/lora_b/kernel (1, 6)
        {{L}}/ffn_norm/scale (6,)""",
        f"""{_T5_ATTENTION.format(A="{L}/cross_attention")}
        {{L}}/cross_attention/q/lora_a/kernel (6, 1)
        {{L}}/cross_attention/q/lora_b/kernel (1, 6)
        {{L}}/cross_attention_norm/scale (6,)""",
        "block",
    ),
    "mbart": (
        """shared/embedding (11, 6)
        lm_head/kernel (6, 11)
        final_logits_bias (11,)
        {S}/embed_positions/embedding (9, 6)
        {S}/layernorm_embedding/scale (6,)
        {S}/layernorm_embedding/bias (6,)
        {S}/layer_norm/scale (6,)
        {S}/layer_norm/bias (6,)""",
        f"""{_MBART_ATTENTION.format(A="{L}/self_attention")}
        {{L}}/self_attention/v/lora_a/kernel (6, 1)
        {{L}}/self_attention/v/lora_b/kernel (1, 6)
        {{L}}/self_attention_norm/scale (6,)
        {{L}}/self_attention_norm/bias (6,)
        {{L}}/ffn/fc1/kernel (6, {{F}})
        {{L}}/ffn/fc1/bias ({{F}},)
        {{L}}/ffn/fc2/kernel ({{F}}, 6)
        {{L}}/ffn/fc2/bias (6,)
        {{L}}/ffn/fc2/lora_a/kernel ({{F}}, 1)
        {{L}}/ffn/fc2/lora_b/kernel (1, 6)
        {{L}}/ffn_norm/scale (6,)
        {{L}}/ffn_norm/bias (6,)""",
        f"""{_MBART_ATTENTION.format(A="{L}/cross_attention")}
        {{L}}/cross_attention/v/lora_a/kernel (6, 1)
        {{L}}/cross_attention/v/lora_b/kernel (1, 6)
        {{L}}/cross_attention_norm/scale (6,)
        {{L}}/cross_attention_norm/bias (6,)""",
        "layers",
    ),
}


def _expected(kind: str) -> set[str]:
    top, layer, cross, layers = LAYOUT[kind]
    rows = set()
    for stack, num_layers, ffn in (("encoder", 1, 5), ("decoder", 2, 4 if kind == "mbart" else 5)):
        rows |= {line.strip().format(S=stack) for line in top.splitlines()}
        for i in range(num_layers):
            template = layer + ("\n" + cross if stack == "decoder" else "")
            name = f"{stack}/{layers}_{i}"
            rows |= {line.strip().format(L=name, F=ffn) for line in template.splitlines()}
    return rows


def _rows(tree) -> set[str]:
    return {f"{'/'.join(k)} {tuple(v.shape)}" for k, v in traverse_util.flatten_dict(tree).items()}


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_param_paths_and_shapes_are_pinned(kind):
    params = factory.abstract_params(factory.create_model(CONFIGS[kind]))
    assert _rows(params) == _expected(kind)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_decoding_cache_is_keyed_by_decoder_layer(kind):
    config = CONFIGS[kind]
    model = factory.create_model(config)
    params = factory.abstract_params(model)
    encoded = jax.ShapeDtypeStruct((2, 3, 6), jnp.float32)
    cache = jax.eval_shape(
        lambda p, e: model.apply({"params": p}, e, 4, method=model.init_cache), params, encoded
    )
    heads, head_dim = (2, 3) if kind == "mbart" else (3, 2)
    layers = LAYOUT[kind][3]
    assert _rows(cache) == {
        f"{layers}_{i}/{name} {shape}"
        for i in range(2)
        for name, shape in (
            ("self_k", (2, heads, head_dim, 4)),
            ("self_v", (2, heads, head_dim, 4)),
            ("cross_k", (2, heads, head_dim, 3)),
            ("cross_v", (2, heads, head_dim, 3)),
        )
    }
