"""A run's configuration as frozen, typed sections, each naming its own problems.

One dataclass per ConfigDict section (`data`, `tokenizer`, `model`, `dp`, `train`, `eval`).
Choices are `Literal` types; `problems()` checks what the section alone can tell (choices,
ranges, fields that must agree) and returns one line per problem naming the field, the value and
the fix. Rules that need the file system, the corpus, the devices or another section live with
their owners (`dpnmt.config.run.RunConfig.problems`, `training.setup.config_problems`). Defaults
equal `config_lib.base_config()`'s (tested); fields are documented there.
"""

import dataclasses
import math
import re
import typing
from typing import Literal

from dpnmt.config.fields import (  # Section: the sections' base (its rule helpers).
    Section,
    at_least,
    positive_finite,
    unit_open,
    unit_right_open,
)

TokenizeTrain = Literal["auto", "upfront", "per_lot"]
BsdSplit = Literal["train", "dev"]
Objective = Literal["translation", "span_corruption", "prefix_lm"]  # data.objectives.OBJECTIVES
TokenizerKind = Literal[
    "auto", "pretrained", "dp_sentencepiece", "sentencepiece_public", "sentencepiece_private"
]
ModelType = Literal["unigram", "bpe"]
Family = Literal["none", "t5", "mbart"]  # dpnmt.data.preprocess.FAMILIES (tested).
Finetune = Literal["all", "lora", "bias"]
Accountant = Literal["pld", "rdp"]  # core.accounting.Accountant (tested).
Sampling = Literal["poisson", "shuffle"]  # dpnmt.privacy.POISSON, SHUFFLE.
Clipping = Literal["ghost", "vmap"]  # core.private_grad.CLIPPING_METHODS (tested).
NoiseMode = Literal["float", "secure"]  # core.noise.NOISE_MODES (tested).
Unit = Literal["example", "group"]  # dpnmt.privacy.UNITS (tested).
Optimizer = Literal["sgd", "adam", "adamw", "adafactor"]
Decay = Literal["constant", "linear", "cosine"]


@dataclasses.dataclass(frozen=True)
class DataConfig(Section):
    """`config.data`: the corpus, its split sizes, lengths and how train is tokenized."""

    NAME: typing.ClassVar[str] = "data"
    corpus: str = "clinspen"
    corpus_weights: tuple[float, ...] = ()
    pair: str = "es-en"
    dir: str | None = None
    validation_size: int | None = None
    bsd_train_split: BsdSplit | None = None
    max_source_length: int = 64
    max_target_length: int = 64
    max_train_examples: int | None = None
    concat_weight: float = 0.0
    concat_max_pairs: int = 3
    concat_max_chars: int = 200
    max_eval_examples: int = 200
    max_test_examples: int | None = None
    detokenize: bool = False
    tokenize_train: TokenizeTrain = "auto"
    length_buckets: str = "auto"
    objective: Objective = "translation"
    objective_language: str | None = None
    noise_density: float = 0.15
    mean_span_length: float = 3.0
    prefix_min_fraction: float = 0.0
    prefix_max_fraction: float = 1.0
    objective_seed: int = 0  # Public by design (config_lib): draws = f(seed, text).

    # config.data field -> the corpus loader option it feeds (`corpora.CORPORA`).
    CORPUS_OPTIONS: typing.ClassVar[dict[str, str]] = {
        "dir": "data_dir",
        "validation_size": "validation_size",
        "bsd_train_split": "train_split",
    }

    def problems(self) -> list[str]:
        """Choices and ranges of the data fields."""
        return (
            self.choice_problems()
            + self.ranges(
                (
                    ("max_source_length", at_least(1), ">= 1 (tokens per source)"),
                    ("max_target_length", at_least(1), ">= 1 (tokens per target)"),
                    ("max_train_examples", at_least(1), ">= 1 (or unset for all)"),
                    ("max_eval_examples", at_least(1), ">= 1"),
                    ("concat_weight", lambda v: 0 <= v < float("inf"), ">= 0 (0: off)"),
                    ("concat_max_pairs", at_least(2), ">= 2 (pairs joined at most)"),
                    ("concat_max_chars", at_least(2), ">= 2 (characters of a joined side)"),
                    ("max_test_examples", at_least(1), ">= 1 (or unset for all)"),
                    ("validation_size", at_least(1), ">= 1 (or unset)"),
                    ("noise_density", lambda v: 0 < v < 1, "in (0, 1) (T5: 0.15)"),
                    ("mean_span_length", lambda v: v >= 1, ">= 1 token (T5: 3)"),
                    ("prefix_min_fraction", lambda v: 0 <= v <= 1, "in [0, 1]"),
                    ("prefix_max_fraction", lambda v: 0 <= v <= 1, "in [0, 1]"),
                    ("objective_seed", lambda v: 0 <= v < 2**63, "in [0, 2**63)"),
                )
            )
            + self.objective_problems()
        )

    def objective_problems(self) -> list[str]:
        """The pre-training objective's language and prefix range (`objective_language`)."""
        if self.objective == "translation":
            return []
        problems, languages = [], self.pair.split("-")
        if self.objective_language is not None and self.objective_language not in languages:
            problems.append(
                f"data.objective_language={self.objective_language!r} is not a language of "
                f"data.pair={self.pair!r}; use one of {languages} (unset: the source, "
                f"{languages[0]!r})."
            )
        if self.prefix_min_fraction > self.prefix_max_fraction:
            problems.append(
                f"data.prefix_min_fraction={self.prefix_min_fraction} exceeds "
                f"data.prefix_max_fraction={self.prefix_max_fraction}; swap them."
            )
        return problems

    @property
    def text_language(self) -> str:
        """The language an objective run reads (`objective_language`, else the source)."""
        return self.objective_language or self.pair.split("-")[0]

    def corpus_options(self) -> dict[str, typing.Any]:
        """The corpus loader's keyword options (unset fields left out)."""
        return {
            option: getattr(self, name)
            for name, option in self.CORPUS_OPTIONS.items()
            if getattr(self, name) is not None
        }

    def tokenize_per_lot(self, process_count: int) -> bool:
        """Whether the train split is tokenized per lot (`tokenize_train` resolved)."""
        mode = self.tokenize_train
        return mode == "per_lot" or (mode == "auto" and process_count > 1)


# Above any translation model's vocabulary: a learnt one this size is a typo (issue 61).
MAX_VOCAB_SIZE = 1_000_000


@dataclasses.dataclass(frozen=True)
class TokenizerConfig(Section):
    """`config.tokenizer`: how the vocabulary is made (`RunConfig.tokenizer_kind` resolves it)."""

    NAME: typing.ClassVar[str] = "tokenizer"
    kind: TokenizerKind = "auto"
    vocab_size: int = 1000
    model_type: ModelType = "unigram"
    public_text_paths: tuple[str, ...] = ()
    public_corpora: str = ""
    private_data_ok: bool = False
    dp_noise_stddev: float = 20.0
    dp_delta: float = 1e-9
    dp_max_words: int = 64
    sentinels: int = 0

    def problems(self) -> list[str]:
        """Choices and ranges of the tokenizer fields (the DP ones: `dp_problems`)."""
        return self.choice_problems() + self.ranges(
            (
                (
                    "vocab_size",
                    lambda v: 8 <= v <= MAX_VOCAB_SIZE,
                    f">= 8 and <= {MAX_VOCAB_SIZE:,} pieces (mT5 has 250,112; more is most "
                    "likely a typo)",
                ),
                ("dp_max_words", at_least(1), ">= 1"),
                ("sentinels", at_least(0), ">= 0 (T5 sentinels reserved or appended)"),
            )
        )

    def dp_problems(self) -> list[str]:
        """Ranges of DP-SentencePiece's noise and δ (checked when it is the resolved kind)."""
        return self.ranges(
            (
                ("dp_noise_stddev", positive_finite, "> 0"),
                ("dp_delta", unit_open, "in (0, 1)"),
            )
        )


@dataclasses.dataclass(frozen=True)
class ModelConfig(Section):
    """`config.model`: pretrained or from-scratch T5, and which parameters train."""

    NAME: typing.ClassVar[str] = "model"
    name_or_path: str | None = None
    pretrained_data_disjoint: bool = False
    family: Family = "t5"
    source_prefix: str | None = None
    d_model: int = 128
    d_kv: int = 32
    d_ff: int = 256
    num_layers: int = 2
    num_decoder_layers: int = 2
    num_heads: int = 4
    feed_forward_proj: str = "gated-gelu"
    dropout_rate: float = 0.1
    trainable: str | None = None
    finetune: Finetune = "all"
    lora_rank: int = 0
    lora_alpha: float | None = None
    lora_targets: str = "q,v"

    @property
    def lora_target_names(self) -> tuple[str, ...]:
        """`lora_targets` ("q, v") as names ("q", "v"), repeats dropped."""
        names = (part.strip() for part in str(self.lora_targets or "").split(","))
        return tuple(dict.fromkeys(name for name in names if name))

    def problems(self) -> list[str]:
        """Choices, ranges, the trainable regex, and finetune/LoRA fields that agree."""
        problems = self.choice_problems() + self.ranges(
            (
                ("d_model", at_least(1), ">= 1"),
                ("d_kv", at_least(1), ">= 1"),
                ("d_ff", at_least(1), ">= 1"),
                ("num_layers", at_least(1), ">= 1"),
                ("num_decoder_layers", at_least(1), ">= 1"),
                ("num_heads", at_least(1), ">= 1"),
                ("dropout_rate", unit_right_open, "in [0, 1)"),
                ("lora_rank", at_least(0), ">= 0 (0: no adapters)"),
                ("lora_alpha", positive_finite, "> 0 (or unset: alpha = rank)"),
            )
        )
        if self.trainable is not None:
            try:
                re.compile(self.trainable)
            except re.error as error:
                problems.append(
                    f"model.trainable={self.trainable!r} is not a regex ({error}); fix it."
                )
        return problems + self._finetune_problems()

    def _finetune_problems(self) -> list[str]:
        mode, rank = self.finetune, self.lora_rank
        if not isinstance(rank, int) or rank < 0:
            return []  # Named by the range check.
        problems = []
        if mode == "lora" and rank == 0:
            problems.append(
                "model.finetune='lora' needs model.lora_rank >= 1 (the adapters' rank, e.g. 8)."
            )
        if rank > 0 and mode != "lora":
            problems.append(
                f"model.lora_rank={rank} adds adapters, but model.finetune={mode!r} would not "
                "train them alone: set model.finetune='lora' (or model.lora_rank=0)."
            )
        if mode in ("lora", "bias") and self.trainable is not None:
            problems.append(
                f"model.trainable={self.trainable!r} and model.finetune={mode!r} both "
                "choose the trained parameters; unset model.trainable (it applies to "
                "finetune='all')."
            )
        return problems


@dataclasses.dataclass(frozen=True)
class PrivacyConfig(Section):
    """`config.dp`: whether DP-SGD runs, its target, clipping, δ, accounting and sampling."""

    NAME: typing.ClassVar[str] = "dp"
    enabled: bool = True
    target_epsilon: float | None = None
    noise_multiplier: float | None = None
    l2_clip: float = 1.0
    delta: float = 1e-8
    allow_large_delta: bool = False
    accountant: Accountant = "pld"
    sampling: Sampling = "poisson"
    secure_rng: bool = False
    clipping: Clipping = "ghost"
    clipping_chunk: int = 0
    noise_mode: NoiseMode = "float"
    unit: Unit = "example"
    group_cap: int | None = None
    group_lot_size: int | None = None  # Checked by RunConfig (group runs only).

    @property
    def calibrates_noise(self) -> bool:
        """Whether σ is calibrated to `target_epsilon` (a private run without a given σ)."""
        return self.enabled and self.noise_multiplier is None and self.target_epsilon is not None

    def problems(self) -> list[str]:
        """Choices, the chunk size, and (a private run) C, δ, and ε or σ."""
        problems = self.choice_problems() + self.ranges(
            (("clipping_chunk", at_least(0), ">= 0 (0: the whole micro-batch at once)"),)
        )
        problems += self.unit_problems()
        if not self.enabled:
            return problems  # A non-private run has no clipping or noise.
        problems += self.ranges(
            (
                ("l2_clip", positive_finite, "> 0 (the clipping norm C)"),
                ("delta", unit_open, "in (0, 1), e.g. 1e-8 (below 1/N)"),
                (
                    "target_epsilon",
                    positive_finite,
                    "> 0 and finite (a run without DP: the :nonprivate variant, e.g. "
                    "--config=configs/<file>.py:nonprivate)",
                ),
                ("noise_multiplier", positive_finite, "> 0 (or use :nonprivate)"),
            )
        )
        if self.target_epsilon is None and self.noise_multiplier is None:
            problems.append(
                "A private run needs dp.target_epsilon (σ is calibrated) or dp.noise_multiplier "
                "(ε is reported); set one, or use the :nonprivate variant."
            )
        return problems

    def unit_problems(self) -> list[str]:
        """`dp.unit="group"`: a cap k >= 1, Poisson sampling, no clipping chunks."""
        if self.unit != "group":
            return []
        problems = []
        if self.group_cap is None or isinstance(self.group_cap, bool) or self.group_cap < 1:
            problems.append(
                f"dp.group_cap={self.group_cap!r}: dp.unit='group' needs dp.group_cap = k >= 1, "
                "the most examples one group adds to a lot (e.g. --config.dp.group_cap=8)."
            )
        if self.sampling != "poisson":
            problems.append(
                f"dp.unit='group' needs dp.sampling='poisson' (groups are Poisson-sampled), "
                f"not {self.sampling!r}."
            )
        if self.clipping_chunk:
            problems.append(
                f"dp.clipping_chunk={self.clipping_chunk} is not supported with dp.unit='group' "
                "(each micro-batch clips whole groups at once): set dp.clipping_chunk=0 and "
                "lower train.physical_batch_size to save memory."
            )
        return problems


@dataclasses.dataclass(frozen=True)
class TrainConfig(Section):
    """`config.train`: lots, micro-batches, the optimizer and the run's rhythm."""

    NAME: typing.ClassVar[str] = "train"
    expected_lot_size: int = 64
    physical_batch_size: int = 16
    num_epochs: int = 2
    optimizer: Optimizer = "adam"
    learning_rate: float = 1e-3
    warmup_steps: int = 5
    decay: Decay = "linear"
    weight_decay: float = 0.0
    label_smoothing: float = 0.0
    ema_decay: float = 0.0
    eval_every_steps: int | None = None
    early_stopping_patience: int = 0
    checkpoint_every_steps: int = 50
    log_every_steps: int = 10
    profile: bool = False
    compilation_cache: str = "auto"

    def problems(self) -> list[str]:
        """Choices and ranges of the training fields."""
        return self.choice_problems() + self.ranges(
            (
                ("expected_lot_size", at_least(1), ">= 1 (L, examples per lot)"),
                ("physical_batch_size", at_least(1), ">= 1 (rows per micro-batch)"),
                (
                    "num_epochs",
                    lambda v: v >= 1 and float(v).is_integer(),
                    "a whole number >= 1",
                ),
                ("learning_rate", positive_finite, "> 0"),
                ("warmup_steps", at_least(0), ">= 0"),
                ("weight_decay", at_least(0), ">= 0"),
                ("label_smoothing", unit_right_open, "in [0, 1) (0: plain cross-entropy)"),
                ("ema_decay", unit_right_open, "in [0, 1) (0: no average; e.g. 0.99)"),
                ("eval_every_steps", at_least(0), ">= 0 (0: only at the end; unset: auto)"),
                ("early_stopping_patience", at_least(0), ">= 0 (0: never stop early)"),
                ("checkpoint_every_steps", at_least(1), ">= 1"),
                ("log_every_steps", at_least(1), ">= 1"),
            )
        )

    def device_problems(self, device_count: int) -> list[str]:
        """The micro-batch must split evenly over `device_count` devices."""
        b = self.physical_batch_size
        if isinstance(b, int) and b >= 1 and b % device_count:
            fix = max(1, round(b / device_count)) * device_count
            return [
                f"train.physical_batch_size={b} must be a multiple of the {device_count} "
                f"devices; use e.g. {fix}."
            ]
        return []


# EvalConfig's fields that change the generated text (not batch_size, not scoring).
DECODING_FIELDS = ("num_beams", "length_penalty", "no_repeat_ngram_size", "max_new_tokens")


@dataclasses.dataclass(frozen=True)
class EvalConfig(Section):
    """`config.eval`: decoding and scoring of validation and test splits."""

    NAME: typing.ClassVar[str] = "eval"
    num_beams: int = 1
    length_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    max_new_tokens: int = 64
    batch_size: int = 32
    bertscore: bool = False
    bertscore_model: str | None = None

    def problems(self) -> list[str]:
        """Ranges of the decoding fields."""
        return self.ranges(
            (
                ("num_beams", at_least(1), ">= 1 (1: greedy)"),
                (
                    "length_penalty",
                    math.isfinite,
                    "finite (beam scores / length^lp; > 0 favours longer)",
                ),
                ("no_repeat_ngram_size", at_least(0), ">= 0 (0: no n-gram ban)"),
                ("max_new_tokens", at_least(1), ">= 1"),
                ("batch_size", at_least(1), ">= 1"),
            )
        )

    def decoding(self) -> dict[str, int | float]:
        """The generation settings, named as transformers' `GenerationConfig` names them.

        What a decode's results.json and an export's `dpnmt.json` record, and what
        `dpnmt.translate` decodes with unless its flags say otherwise.
        """
        return {name: getattr(self, name) for name in DECODING_FIELDS}


SECTIONS: tuple[type[Section], ...] = (
    DataConfig,
    TokenizerConfig,
    ModelConfig,
    PrivacyConfig,
    TrainConfig,
    EvalConfig,
)
