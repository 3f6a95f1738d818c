"""Experiment configs: the shared base config and `:variant` string parsing.

`dpnmt.config.RunConfig.parse` reads these fields into typed sections and checks
them all at once (`dpnmt.training.preflight` adds what needs files or the corpus).

Config files in `configs/` call `make_config(arg, ...)`: `arg` is the text after
the first `:` of `--config=configs/x.py:eps5,shuffle`. Privacy variants set the
target ε, sampling variants the lot sampling. Unknown variants fail, listing the
valid ones.
"""

import dataclasses
import json
import os
from collections.abc import Callable

import ml_collections
from ml_collections import config_dict

from dpnmt.config.fields import flatten
from dpnmt.config.run import (  # noqa: F401 - the eval schedule's constants, re-exported.
    EVAL_EXAMPLE_RATIO,
    EVALUATIONS_PER_RUN,
    FIXED_SEED_SWITCH,
    RunConfig,
)
from dpnmt.errors import MissingInputError, raise_problems

# Privacy variants: target ε of DP-SGD (None = non-private training).
PRIVACY_VARIANTS: dict[str, float | None] = {
    "eps1": 1.0,
    "eps3": 3.0,
    "eps5": 5.0,
    "eps8": 8.0,
    "eps1000": 1000.0,
    "nonprivate": None,
}
SAMPLING_VARIANTS = ("poisson", "shuffle")


def parse_variants(arg: str | None) -> tuple[str, str | None]:
    """Parses "eps5,shuffle" into (privacy variant, sampling variant or None).

    Args:
      arg: comma-separated variant names, or None/"" for the defaults.

    Returns:
      (privacy variant name, "poisson" | "shuffle" | None).

    Raises:
      ValueError: an unknown or repeated variant, listing the valid ones.
    """
    privacy, sampling = None, None
    for name in filter(None, (part.strip() for part in (arg or "").split(","))):
        if name in PRIVACY_VARIANTS:
            if privacy is not None:
                raise ValueError(f"Two privacy variants: {privacy!r} and {name!r}; give one.")
            privacy = name
        elif name in SAMPLING_VARIANTS:
            if sampling is not None:
                raise ValueError(f"Two sampling variants: {sampling!r} and {name!r}; give one.")
            sampling = name
        else:
            raise ValueError(unknown_variant_message(name))
    return privacy or "eps8", sampling


def _epsilon_of(name: str) -> float | None:
    """The ε a variant-like name asks for ("eps2" -> 2.0, "eps0.5" -> 0.5), else None."""
    for prefix in ("epsilon", "eps", "e"):
        if name.lower().startswith(prefix):
            try:
                return float(name[len(prefix) :].replace("_", "."))
            except ValueError:
                return None
    return None


def unknown_variant_message(name: str) -> str:
    """Why `name` is no variant: the valid ones, and the flag that sets any other ε."""
    message = (
        f"Unknown config variant {name!r}. Valid: privacy {sorted(PRIVACY_VARIANTS)}, "
        f"sampling {list(SAMPLING_VARIANTS)} (e.g. ':eps5,shuffle')."
    )
    epsilon = _epsilon_of(name)
    if epsilon is not None and epsilon <= 0:
        return f"{message} ε = {epsilon:g} is no privacy target: ':nonprivate' trains without DP."
    if epsilon is not None:
        return (
            f"{message} For ε = {epsilon:g}: --config.dp.target_epsilon={epsilon:g} (it replaces "
            "the ε of the default variant, eps8, or of the one given)."
        )
    return f"{message} Any other ε: --config.dp.target_epsilon=<ε>."


def base_config() -> ml_collections.ConfigDict:
    """Every field of an experiment, with its meaning; configs/ override them."""
    c = ml_collections.ConfigDict()
    c.variant = ""  # The `:variant` string this config was built from (record only).
    c.seed = 0  # Public seed: parameter init and dropout. Lots come from the private seed.
    # Secret seed of the noise, lots and vocabulary noise. None (always, for a
    # private run) draws 128 bits from the OS into workdir/private/. An int is
    # refused for a private run unless the switch below is on: anyone holding it
    # rebuilds every noise draw (true ε = ∞).
    c.noise_seed = config_dict.placeholder(int)  # Never published (kept in private/).
    # Tests only: allow a fixed noise_seed in a private run; every report then says ε = ∞.
    c.testing_only_fixed_noise_seed_NO_PRIVACY = False  # Tests only (see the line above).

    c.data = ml_collections.ConfigDict()
    # wmt16 | bsd | clinspen | hub:<id> | files:<dir>; `detok:<name>` Moses-detokenises
    # it; several, comma-separated, mix their train splits (non-private runs only;
    # validation/test from the first; data options apply to the first).
    c.data.corpus = "clinspen"  # The corpus or corpora (above).
    c.data.corpus_weights = ()  # Several corpora: one weight > 0 each (rows x weight; () = 1s).
    c.data.pair = "es-en"  # Translation direction "src-tgt".
    c.data.dir = config_dict.placeholder(str)  # Local corpus folder; None: $DPNMT_DATA_DIR/hub.
    c.data.validation_size = config_dict.placeholder(int)  # wmt16/bsd/hub/files: carved off train.
    c.data.bsd_train_split = config_dict.placeholder(str)  # bsd only: train | dev (offline).
    c.data.max_source_length = 64  # Source tokens per example (specials included).
    c.data.max_target_length = 64  # Target tokens per example (specials included).
    c.data.max_train_examples = config_dict.placeholder(int)  # Keep the first K train pairs.
    # Public, non-private runs only (data.concatenation): add round(w x N) train
    # examples, each 2..concat_max_pairs random pairs joined side by side.
    c.data.concat_weight = 0.0  # Concatenated examples per train pair (0: off).
    c.data.concat_max_pairs = 3  # Most pairs joined in one concatenated example.
    c.data.concat_max_chars = 200  # Most characters of a joined side (short pairs only).
    c.data.max_eval_examples = 200  # Validation pairs scored by BLEU during training.
    c.data.max_test_examples = config_dict.placeholder(int)  # Test pairs scored (None: all).
    c.data.detokenize = False  # Moses-detokenise before BLEU (WMT sample is tokenised).
    # Train split: upfront (once, exact truncation counts) | per_lot (each process
    # tokenizes only the rows it feeds). Same ids, N and lots either way.
    c.data.tokenize_train = "auto"  # auto: per_lot on several processes, else upfront.
    # Length buckets: each micro-batch is padded to the smallest of these joint
    # lengths (capped per side at the max lengths) that fits its longest row, rows
    # grouped by length within a lot; one compile per bucket. auto: 1/4, 1/2, 3/4
    # of the longer max length (rounded up to 8) and the max (off when the train
    # split is tokenized per lot) | none | ascending counts, e.g. "16,32,64".
    c.data.length_buckets = "auto"  # Micro-batch lengths (above).
    # Pre-training on monolingual text (docs/data.md): translation | span_corruption
    # (T5) | prefix_lm. One text of data.objective_language is one example (the unit
    # of privacy); a `files:` folder may hold that language alone (train.<lang>, ...).
    c.data.objective = "translation"  # What an example is (above).
    c.data.objective_language = config_dict.placeholder(str)  # Objective's text; None: source.
    c.data.noise_density = 0.15  # span_corruption: fraction of tokens masked.
    c.data.mean_span_length = 3.0  # span_corruption: mean masked span (tokens).
    c.data.prefix_min_fraction = 0.0  # prefix_lm: split uniform in [min, max] x length.
    c.data.prefix_max_fraction = 1.0  # prefix_lm: equal to min for a fixed split.
    # PUBLIC by design (recorded in config.json): which spans/splits each text gets is
    # SHA-256(this seed, the text's ids), a fixed map of the text alone; DP-SGD holds
    # for any such map, and a secret one would leak through the published scores.
    c.data.objective_seed = 0  # Objective draws' public seed, in [0, 2**63).

    c.tokenizer = ml_collections.ConfigDict()
    # auto: pretrained when model.name_or_path is set, else dp_sentencepiece |
    # pretrained (the model's own) | dp_sentencepiece | sentencepiece_public |
    # sentencepiece_private (only with private_data_ok: NOT covered by the guarantee).
    c.tokenizer.kind = "auto"  # How the vocabulary is made (above).
    c.tokenizer.vocab_size = 1000  # SentencePiece vocabulary size (pieces).
    c.tokenizer.model_type = "unigram"  # SentencePiece algorithm: unigram | bpe.
    c.tokenizer.public_text_paths = ()  # sentencepiece_public: public text files.
    # sentencepiece_public from PUBLIC corpora (names as in data.corpus, e.g.
    # "files:tatoeba_de_en,detok:wmt16"): their train splits, both sides of
    # data.pair; built once and cached by content (python -m dpnmt.public_vocab).
    c.tokenizer.public_corpora = ""  # Public corpora of the vocabulary (above).
    c.tokenizer.private_data_ok = False  # sentencepiece_private: explicit opt-in.
    c.tokenizer.dp_noise_stddev = 20.0  # DP-SentencePiece: σ of each word count.
    c.tokenizer.dp_delta = 1e-9  # DP-SentencePiece: its δ (composed with DP-SGD's).
    c.tokenizer.dp_max_words = 64  # DP-SentencePiece: words kept per pair.
    c.tokenizer.sentinels = 0  # T5 <extra_id_i>: reserved (SentencePiece) or appended (pretrained).

    c.model = ml_collections.ConfigDict()
    c.model.name_or_path = config_dict.placeholder(str)  # Pretrained: hub name or local dir.
    # A dpnmt export's own (ε, δ) is composed with a private run's unless this declares
    # that its training data share no example (dp.unit=group: no group) with this run's.
    c.model.pretrained_data_disjoint = False  # Declared disjoint: export's ε not composed.
    c.model.family = "t5"  # t5 (task prefix) | mbart (language codes) | none.
    c.model.source_prefix = config_dict.placeholder(str)  # Override the T5 task prefix.
    # From-scratch T5 (used when name_or_path is None).
    c.model.d_model = 128  # Residual width.
    c.model.d_kv = 32  # Width of one attention head.
    c.model.d_ff = 256  # Feed-forward width.
    c.model.num_layers = 2  # Encoder blocks.
    c.model.num_decoder_layers = 2  # Decoder blocks.
    c.model.num_heads = 4  # Attention heads.
    c.model.feed_forward_proj = "gated-gelu"  # relu (T5 v1.0) | gated-gelu (v1.1/mT5).
    c.model.dropout_rate = 0.1  # Dropout; each example gets its own key.
    # Regex over parameter paths ("encoder/.../kernel"); only matches are trained
    # and get per-example gradients. None trains everything.
    c.model.trainable = config_dict.placeholder(str)  # Trainable-params regex (above).
    # Parameter-efficient fine-tuning (README: "Parameter-efficient DP fine-tuning"):
    # all (every parameter, or those model.trainable matches) | lora (only the
    # adapters below; the base is frozen) | bias (only bias terms: mBART; T5 has none).
    c.model.finetune = "all"  # Which parameters train (above).
    c.model.lora_rank = 0  # LoRA adapters' rank r (0: none; finetune=lora needs >= 1).
    c.model.lora_alpha = config_dict.placeholder(float)  # Adapter scale alpha/r (None: alpha=r).
    # Comma-separated layers given adapters in every block: q,k,v,o (attention),
    # wo and wi (T5 v1.0) or wi_0,wi_1 (T5 v1.1/mT5), fc1,fc2 (mBART).
    c.model.lora_targets = "q,v"  # Adapted layers (above).

    c.dp = ml_collections.ConfigDict()
    c.dp.enabled = True  # False: plain mini-batch training, no clipping or noise.
    c.dp.target_epsilon = config_dict.placeholder(float)  # Calibrate σ to this DP-SGD ε (> 0).
    c.dp.noise_multiplier = config_dict.placeholder(float)  # Or give σ > 0 (wins over ε).
    c.dp.l2_clip = 1.0  # Per-example clipping norm C (> 0).
    c.dp.delta = 1e-8  # δ of DP-SGD in (0, 1), below 1/N (the paper's value).
    c.dp.allow_large_delta = False  # Accept a total δ >= 1/N (refused otherwise: weak).
    c.dp.accountant = "pld"  # pld (tight) | rdp.
    c.dp.sampling = "poisson"  # poisson (guarantee with amplification) | shuffle.
    c.dp.secure_rng = False  # Poisson lots from os.urandom, not the seed (releases).
    c.dp.clipping = "ghost"  # ghost (book-keeping, no per-example grads) | vmap; same sum.
    c.dp.clipping_chunk = 0  # Clip a micro-batch in chunks of this many rows (0: at once).
    c.dp.noise_mode = "float"  # float (raw noisy sums exposed to float attacks) | secure (slower).
    c.dp.unit = "example"  # Privacy unit: example (a pair) | group (user-level, below).
    c.dp.group_cap = config_dict.placeholder(int)  # k: most examples one group adds to a lot.
    # L_groups: expected GROUPS per lot (q = L_groups / N_groups; 1 <= L_groups < N_groups),
    # read only with dp.unit=group. Unset: train.expected_lot_size counts groups (older runs).
    c.dp.group_lot_size = config_dict.placeholder(int)  # L_groups (above).

    c.train = ml_collections.ConfigDict()
    c.train.expected_lot_size = 64  # L: expected examples per lot (q = L/N; 1 <= L < N).
    c.train.physical_batch_size = 16  # b: rows per micro-batch (a multiple of the devices).
    c.train.num_epochs = 2  # Epochs; Poisson: T = round(epochs * N / L) lots.
    c.train.optimizer = "adam"  # sgd | adam | adamw | adafactor.
    c.train.learning_rate = 1e-3  # Peak learning rate.
    c.train.warmup_steps = 5  # Linear warm-up steps.
    c.train.decay = "linear"  # Decay after warm-up: constant | linear | cosine.
    c.train.weight_decay = 0.0  # adamw only.
    # Label smoothing of the training loss (each example's own token mean; 0: plain
    # cross-entropy). Validation loss stays plain cross-entropy.
    c.train.label_smoothing = 0.0  # In [0, 1).
    # Moving average of the parameters (Polyak / EMA; post-processing: no privacy
    # spent): with a decay > 0 the average is the run's model (validated, tested,
    # decoded, exported). 0: the last iterate.
    c.train.ema_decay = 0.0  # In [0, 1); e.g. 0.99.
    # Validation loss + BLEU every K steps (0: only at the end; None: at most
    # EVALUATIONS_PER_RUN times a run and at most once per
    # EVAL_EXAMPLE_RATIO * data.max_eval_examples trained examples, see
    # eval_every_steps). Before training only the loss is scored: an untrained
    # model's greedy decode runs to full length, for BLEU 0.
    c.train.eval_every_steps = config_dict.placeholder(int)  # Validation interval (above).
    c.train.early_stopping_patience = 0  # Stop after P evals without BLEU gain (0: never).
    c.train.checkpoint_every_steps = 50  # Save every K steps (and at the end).
    c.train.log_every_steps = 10  # Log loss and ε spent every K steps.
    # Time each phase (start-up, lot preparation, device steps, evaluation,
    # checkpoints; compile time within each) into profile.json (private/ for a
    # private run). Blocks on each step's result: slightly slower, off by default.
    c.train.profile = False  # Write the run's wall-time profile (above).
    # Compiled XLA programs kept across runs: auto ($JAX_COMPILATION_CACHE_DIR,
    # else $XDG_CACHE_HOME/dpnmt/jax or ~/.cache/dpnmt/jax) | off | a folder.
    c.train.compilation_cache = "auto"  # Persistent compilation cache (above).

    c.eval = ml_collections.ConfigDict()
    c.eval.num_beams = 1  # 1: greedy; > 1: beam search.
    c.eval.length_penalty = 1.0  # Beam search length penalty.
    c.eval.no_repeat_ngram_size = 0  # n > 0: ban repeating an n-gram in a hypothesis.
    c.eval.max_new_tokens = 64  # Generated tokens per sentence.
    c.eval.batch_size = 32  # Sentences per decoding batch.
    c.eval.bertscore = False  # Also score BERTScore on the test split.
    c.eval.bertscore_model = config_dict.placeholder(str)  # None: offline MiniLM package.
    return c


def eval_every_steps(config: ml_collections.ConfigDict, num_steps: int) -> int:
    """`train.eval_every_steps` resolved for `num_steps` lots: `RunConfig.eval_every_steps`."""
    return RunConfig.of(config).eval_every_steps(num_steps)


FIXED_SEED_NOTE = "fixed seed: no guarantee"


def check_noise_seed(run: RunConfig) -> None:
    """Refuses a fixed `noise_seed` in a private run unless the test-only switch is on.

    Raises:
      ConfigError: `run.noise_seed_problems()`, one line each.
    """
    raise_problems(run.noise_seed_problems())


def fixed_noise_seed(config: ml_collections.ConfigDict) -> bool:
    """True when the run's noise seed is fixed by the config (no guarantee)."""
    return config.noise_seed is not None


def config_json(run: RunConfig) -> dict:
    """`run` as JSON values (tuples as lists), as config.json holds it.

    A value JSON lacks is written as ml_collections' `to_json_best_effort` wrote
    it (config.json's format before `RunConfig`): a set sorted, else its text.
    """

    def best_effort(value):
        if isinstance(value, set):
            return sorted(value)
        return f"unserializable object: {value}"

    return json.loads(json.dumps(run.to_dict(), default=best_effort))


def published_config(run: RunConfig) -> dict:
    """`run` as written to the published config.json: JSON values, the noise seed removed."""
    return config_json(dataclasses.replace(run, noise_seed=None))


def small_t5_from_scratch(model: ml_collections.ConfigDict) -> None:
    """Sets `model` to a T5 v1.0 layout (ReLU, tied embeddings) sized for a CPU.

    3+3 layers, d_model 256, 8 heads of 32, d_ff 512, dropout 0.1, no task
    prefix: about 4.2M parameters with a 4k vocabulary, which learns Multi30K
    in hours on 2 cores (configs/multi30k.py, configs/two_stage_public.py).
    """
    model.family = "none"  # No T5 task prefix: a from-scratch model needs none.
    model.feed_forward_proj = "relu"
    model.d_model = 256
    model.d_kv = 32
    model.num_heads = 8
    model.d_ff = 512
    model.num_layers = 3
    model.num_decoder_layers = 3
    model.dropout_rate = 0.1


def sibling_config(config_file: str, name: str):
    """The config module `name` ("multi30k") beside `config_file` (configs/ is no package).

    Lets one config file reuse another's pieces, e.g. `configs/public_de_en.py`
    the public vocabulary of `configs/multi30k.py`.
    """
    import importlib.util  # noqa: PLC0415 - config files only.
    import os  # noqa: PLC0415

    path = os.path.join(os.path.dirname(os.path.abspath(config_file)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"dpnmt_configs_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one_variant(arg: str | None, choices, default: str, what: str) -> tuple[str, str]:
    """A config file's own variant of `choices` in `arg`, and `arg` without it.

    ("eps8,span", ("span", "prefix"), "span", "objective") -> ("span", "eps8").

    Raises:
      ValueError: `arg` names two of `choices`.
    """
    parts = [p.strip() for p in (arg or "").split(",") if p.strip()]
    chosen = [p for p in parts if p in choices] or [default]
    if len(chosen) > 1:
        raise ValueError(f"Two {what} variants {chosen}; give one of {list(choices)}.")
    return chosen[0], ",".join(p for p in parts if p not in choices)


def make_config(
    arg: str | None, customize: Callable[[ml_collections.ConfigDict], None] | None = None
) -> ml_collections.ConfigDict:
    """The base config, customised by a config file, then its variants applied.

    Args:
      arg: the `:variant` string (e.g. "eps5,shuffle").
      customize: the config file's own settings, applied before the variants.

    Returns:
      The resolved ConfigDict.
    """
    privacy, sampling = parse_variants(arg)
    config = base_config()
    config.variant = arg or ""
    if customize is not None:
        customize(config)
    target = PRIVACY_VARIANTS[privacy]
    config.dp.enabled = target is not None
    config.dp.target_epsilon = target
    config.dp.sampling = sampling or ("poisson" if target is not None else "shuffle")
    return config


def public_stage_config(
    arg: str | None, customize: Callable[[ml_collections.ConfigDict], None], name: str
) -> ml_collections.ConfigDict:
    """`make_config` of a public stage: non-private by default; a DP variant is refused.

    Raises:
      ValueError: `arg` names a privacy variant (eps...): the stage's data are public.
    """
    config = make_config(arg or "nonprivate", customize)
    if config.dp.enabled:
        raise ValueError(f"{name} is a public stage: use the nonprivate variant.")
    return config


def lora_targets(config: ml_collections.ConfigDict) -> tuple[str, ...]:
    """`model.lora_targets` ("q, v") as names ("q", "v"): `ModelConfig.lora_target_names`."""
    return RunConfig.of(config).model.lora_target_names


def tokenizer_kind(config: ml_collections.ConfigDict) -> str:
    """`tokenizer.kind` resolved: `dpnmt.config.RunConfig.tokenizer_kind`.

    Raises:
      ConfigError: a learnt vocabulary asked for a pretrained model.
    """
    return RunConfig.of(config).tokenizer_kind


def config_from_json(values: dict) -> ml_collections.ConfigDict:
    """A run's config.json as the ConfigDict `--config` gives: `--config.x=` overrides still parse.

    The base config's fields keep their types and placeholders (a None `dp.noise_multiplier`
    still takes a float); a list is stored as a tuple where the base holds a tuple. A
    field the base lacks is kept, so `RunConfig.build` names it.

    Args:
      values: config.json's object (`published_config`: no noise seed).
    """
    config = base_config()
    for field, value in flatten(values).items():
        *sections, name = field.split(".")
        node = config
        for section in sections:
            if section not in node:
                node[section] = ml_collections.ConfigDict()
            node = node[section]
        if isinstance(value, list) and isinstance(node.get(name), tuple):
            value = tuple(value)
        node[name] = value
    return config


def workdir_config(workdir: str) -> ml_collections.ConfigDict:
    """The config a training run wrote into `workdir` (config.json), to resume it.

    Raises:
      MissingInputError: `workdir` holds no config.json.
    """
    path = os.path.join(workdir, "config.json")
    if not os.path.isfile(path):
        raise MissingInputError(
            f"--workdir={workdir} holds no config.json: give --config=<file.py[:variant]> "
            "to start a run there (only a run's own folder resumes from --workdir alone)."
        )
    with open(path, encoding="utf-8") as f:
        return config_from_json(json.load(f))
