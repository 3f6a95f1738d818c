"""Model configurations: frozen dataclasses built from Hugging Face configs.

Every architectural choice a Flax model needs lives in one of these records, so
a model is a pure function of (config, params). `from_hf_config` is the single
place that reads a `transformers` config object.
"""

from __future__ import annotations

import dataclasses
from typing import Any

_T5_ACTIVATIONS = ("relu", "gelu", "gelu_new", "silu", "gelu_pytorch_tanh")


@dataclasses.dataclass(frozen=True)
class LoRASpec:
    """Low-rank adapters on chosen dense kernels (`dpnmt.models.lora`); rank 0: none.

    Each targeted kernel W [d_in, d_out] gets `x -> x W (+ b) + (alpha / rank) x A B`
    with A [d_in, rank] and B [rank, d_out] (B starts at zero), as two bias-free
    `nn.Dense` layers that ghost clipping sees exactly.

    Attributes:
        rank: r, the adapters' inner width (0: no adapters).
        alpha: Scale numerator (None: alpha = rank, a scale of 1).
        targets: Module names of the adapted kernels ("q", "k", "v", "o" in
            every attention layer; T5 "wi"/"wi_0"/"wi_1"/"wo", mBART
            "fc1"/"fc2" in every feed-forward layer).
    """

    rank: int = 0
    alpha: float | None = None
    targets: tuple[str, ...] = ()

    @property
    def enabled(self) -> bool:
        """Whether any kernel gets an adapter."""
        return self.rank > 0 and bool(self.targets)

    @property
    def scale(self) -> float:
        """The factor of the adapter's output: alpha / rank."""
        return (self.rank if self.alpha is None else self.alpha) / self.rank

    def adapts(self, name: str) -> bool:
        """Whether the dense layer called `name` gets an adapter."""
        return self.enabled and name in self.targets


@dataclasses.dataclass(frozen=True)
class T5Config:
    """Architecture of a T5 v1.0 / v1.1 / mT5 encoder-decoder.

    Attributes:
        model_type: Hugging Face `model_type`, "t5" or "mt5".
        vocab_size: Number of token embeddings (rows of the shared embedding).
        d_model: Width of the residual stream.
        d_kv: Width of one attention head.
        d_ff: Width of the feed-forward hidden layer.
        num_layers: Encoder blocks.
        num_decoder_layers: Decoder blocks.
        num_heads: Attention heads per attention layer.
        relative_attention_num_buckets: Buckets of the relative position bias.
        relative_attention_max_distance: Distance beyond which buckets saturate.
        dropout_rate: Dropout probability (residual, feed-forward and attention).
        layer_norm_epsilon: Epsilon of the RMS norm.
        feed_forward_proj: "relu" (v1.0) or "gated-gelu" (v1.1 / mT5), or any
            "ACT" / "gated-ACT" with ACT in relu, gelu, gelu_new, silu.
        tie_word_embeddings: Whether the output projection reuses the shared
            input embedding (v1.0) instead of a separate `lm_head` (v1.1, mT5).
        scale_decoder_outputs: Whether the decoder output is multiplied by
            d_model**-0.5 before the output projection (v1.0 only).
        pad_token_id: Padding token id.
        eos_token_id: End-of-sequence token id.
        decoder_start_token_id: First decoder input token.
        lora: Low-rank adapters (none by default; never part of a Hugging
            Face config: export merges them into the kernels).
    """

    model_type: str = "t5"
    vocab_size: int = 32128
    d_model: int = 512
    d_kv: int = 64
    d_ff: int = 2048
    num_layers: int = 6
    num_decoder_layers: int = 6
    num_heads: int = 8
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    dropout_rate: float = 0.1
    layer_norm_epsilon: float = 1e-6
    feed_forward_proj: str = "relu"
    tie_word_embeddings: bool = True
    scale_decoder_outputs: bool = True
    pad_token_id: int = 0
    eos_token_id: int = 1
    decoder_start_token_id: int = 0
    lora: LoRASpec = LoRASpec()

    def __post_init__(self):
        parts = self.feed_forward_proj.split("-")
        if (
            len(parts) > 2
            or (len(parts) == 2 and parts[0] != "gated")
            or (parts[-1] not in _T5_ACTIVATIONS)
        ):
            raise ValueError(
                f"feed_forward_proj={self.feed_forward_proj!r} is not supported; use 'ACT' or "
                f"'gated-ACT' with ACT one of {_T5_ACTIVATIONS}."
            )

    @property
    def is_gated_act(self) -> bool:
        """Whether the feed-forward layer is gated (wi_0, wi_1)."""
        return self.feed_forward_proj.startswith("gated-")

    @property
    def dense_act_fn(self) -> str:
        """Activation name; "gated-gelu" means the tanh approximation, as in HF."""
        if self.feed_forward_proj == "gated-gelu":
            return "gelu_new"
        return self.feed_forward_proj.split("-")[-1]


@dataclasses.dataclass(frozen=True)
class MBartConfig:
    """Architecture of an mBART (cc25 / mBART-50) encoder-decoder.

    Attributes:
        model_type: Always "mbart".
        vocab_size: Number of token embeddings.
        d_model: Width of the residual stream.
        encoder_layers: Encoder layers.
        decoder_layers: Decoder layers.
        encoder_attention_heads: Heads per encoder attention layer.
        decoder_attention_heads: Heads per decoder attention layer.
        encoder_ffn_dim: Encoder feed-forward hidden width.
        decoder_ffn_dim: Decoder feed-forward hidden width.
        max_position_embeddings: Longest sequence with a learned position
            (the table has 2 more rows: mBART offsets positions by 2).
        dropout: Residual dropout probability.
        attention_dropout: Attention-weight dropout probability.
        activation_dropout: Dropout after the feed-forward activation.
        activation_function: Feed-forward activation ("gelu", "relu", ...).
        scale_embedding: Whether token embeddings are multiplied by sqrt(d_model).
        layer_norm_eps: Epsilon of every layer norm.
        tie_word_embeddings: Whether the output projection reuses the shared
            embedding (unscaled), as in all released mBART checkpoints.
        pad_token_id: Padding token id.
        bos_token_id: Beginning-of-sequence token id.
        eos_token_id: End-of-sequence token id.
        decoder_start_token_id: First decoder input token (mBART-50: eos; the
            target language id is then forced as the first generated token).
        forced_bos_token_id: Token forced at the first generated position
            (target language id for mBART-50), or None.
        forced_eos_token_id: Token forced at the last position when the maximum
            length is reached, or None.
        lora: Low-rank adapters, as for `T5Config`.
    """

    model_type: str = "mbart"
    vocab_size: int = 250027
    d_model: int = 1024
    encoder_layers: int = 12
    decoder_layers: int = 12
    encoder_attention_heads: int = 16
    decoder_attention_heads: int = 16
    encoder_ffn_dim: int = 4096
    decoder_ffn_dim: int = 4096
    max_position_embeddings: int = 1024
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation_function: str = "gelu"
    scale_embedding: bool = True
    layer_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True
    pad_token_id: int = 1
    bos_token_id: int = 0
    eos_token_id: int = 2
    decoder_start_token_id: int = 2
    forced_bos_token_id: int | None = None
    forced_eos_token_id: int | None = 2
    lora: LoRASpec = LoRASpec()


ModelConfig = T5Config | MBartConfig

SUPPORTED_MODEL_TYPES = ("t5", "mt5", "mbart")


def _single_id(value: Any, name: str) -> int | None:
    """Returns an int token id from an int, a one-element list or None."""
    if value is None or isinstance(value, int):
        return value
    if isinstance(value, (list, tuple)) and len(value) == 1:
        return int(value[0])
    raise ValueError(f"{name}={value!r}: only a single token id is supported.")


def from_hf_config(hf_config: Any) -> ModelConfig:
    """Builds our config from a `transformers` config object.

    Args:
        hf_config: A `transformers.PretrainedConfig` (T5Config, MT5Config or
            MBartConfig), or any object with the same attributes.

    Returns:
        A `T5Config` or `MBartConfig`. The `tie_word_embeddings` flag of T5
        models follows the architecture (v1.0 tied, v1.1 / mT5 untied);
        `load_pretrained` then corrects it from the weights actually present.

    Raises:
        ValueError: If `hf_config.model_type` is not one of
            `SUPPORTED_MODEL_TYPES`.
    """
    model_type = getattr(hf_config, "model_type", None)
    if model_type in ("t5", "mt5"):
        if model_type == "mt5":
            scale = False
        else:
            # transformers 5 stores the v1.0/v1.1 distinction in scale_decoder_outputs;
            # older configs store it in tie_word_embeddings.
            scale = bool(
                getattr(
                    hf_config,
                    "scale_decoder_outputs",
                    getattr(hf_config, "tie_word_embeddings", True),
                )
            )
        num_layers = hf_config.num_layers
        return T5Config(
            model_type=model_type,
            vocab_size=hf_config.vocab_size,
            d_model=hf_config.d_model,
            d_kv=hf_config.d_kv,
            d_ff=hf_config.d_ff,
            num_layers=num_layers,
            num_decoder_layers=hf_config.num_decoder_layers or num_layers,
            num_heads=hf_config.num_heads,
            relative_attention_num_buckets=hf_config.relative_attention_num_buckets,
            relative_attention_max_distance=hf_config.relative_attention_max_distance,
            dropout_rate=float(hf_config.dropout_rate),
            layer_norm_epsilon=hf_config.layer_norm_epsilon,
            feed_forward_proj=hf_config.feed_forward_proj,
            tie_word_embeddings=scale,
            scale_decoder_outputs=scale,
            pad_token_id=hf_config.pad_token_id,
            eos_token_id=_single_id(hf_config.eos_token_id, "eos_token_id"),
            decoder_start_token_id=(
                hf_config.decoder_start_token_id
                if getattr(hf_config, "decoder_start_token_id", None) is not None
                else hf_config.pad_token_id
            ),
        )
    if model_type == "mbart":
        start = getattr(hf_config, "decoder_start_token_id", None)
        return MBartConfig(
            vocab_size=hf_config.vocab_size,
            d_model=hf_config.d_model,
            encoder_layers=hf_config.encoder_layers,
            decoder_layers=hf_config.decoder_layers,
            encoder_attention_heads=hf_config.encoder_attention_heads,
            decoder_attention_heads=hf_config.decoder_attention_heads,
            encoder_ffn_dim=hf_config.encoder_ffn_dim,
            decoder_ffn_dim=hf_config.decoder_ffn_dim,
            max_position_embeddings=hf_config.max_position_embeddings,
            dropout=float(hf_config.dropout),
            attention_dropout=float(hf_config.attention_dropout),
            activation_dropout=float(hf_config.activation_dropout),
            activation_function=hf_config.activation_function,
            scale_embedding=bool(hf_config.scale_embedding),
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", True)),
            pad_token_id=hf_config.pad_token_id,
            bos_token_id=hf_config.bos_token_id,
            eos_token_id=_single_id(hf_config.eos_token_id, "eos_token_id"),
            decoder_start_token_id=start if start is not None else hf_config.eos_token_id,
            forced_bos_token_id=getattr(hf_config, "forced_bos_token_id", None),
            forced_eos_token_id=_single_id(
                getattr(hf_config, "forced_eos_token_id", None), "forced_eos_token_id"
            ),
        )
    raise ValueError(
        f"model_type={model_type!r} is not supported; supported: {SUPPORTED_MODEL_TYPES}."
    )
