"""The tests' shared configs: a config file of `configs/` by name, and the small run.

`load_config("tiny", "eps8")` is `configs/tiny.py:eps8` as `--config` gives it;
`small_config(variant)` is `configs/tiny.py` shrunk to a run of seconds (the
end-to-end, release, decoding and noise-to-signal tests train it);
`smaller_config(variant)` shrinks it further (the multi-process and publication
tests); `files_config(folder, variant)` is the base config on the 120 pairs of
`files_corpus(folder)` (the error and pretrained-export tests, which stop before
or soon after training); `tiny_model_config()` is the base config with a
16-wide one-layer T5 (step and fine-tuning tests), `small_plan(...)` a Poisson
privacy plan for them. Tests change fields on their own copy; each call
returns a new ConfigDict.
"""

import importlib.util
import os
import pathlib
import types

import ml_collections

from dpnmt import config_lib, privacy

CONFIG_DIR = pathlib.Path(__file__).resolve().parents[1] / "configs"


def config_module(name: str | pathlib.Path) -> types.ModuleType:
    """The module of `configs/<name>.py` (or of a config file's path), freshly executed."""
    path = pathlib.Path(name) if str(name).endswith(".py") else CONFIG_DIR / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"dpnmt_test_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_config(name: str | pathlib.Path, variant: str | None = None) -> ml_collections.ConfigDict:
    """`configs/<name>.py:<variant>` (or a config file's path) as a ConfigDict."""
    return config_module(name).get_config(variant)


def small_config(variant: str | None) -> ml_collections.ConfigDict:
    """`configs/tiny.py:<variant>` shrunk: 600 pairs, 32 tokens, a one-layer T5, lots of 48."""
    c = load_config("tiny", variant)
    c.noise_seed = 7  # Fixed for determinism: the run reports ε = ∞ (no guarantee).
    c.testing_only_fixed_noise_seed_NO_PRIVACY = True
    c.data.max_train_examples = 600
    c.data.max_source_length = c.data.max_target_length = 32
    c.data.length_buckets = "none"  # One shape a run (CI time); the bucket test sets "auto".
    c.data.max_eval_examples = 16
    c.data.max_test_examples = 16
    c.tokenizer.dp_noise_stddev = 2.0
    c.tokenizer.vocab_size = 600
    c.model.d_model, c.model.d_ff, c.model.d_kv = 64, 128, 16
    c.model.num_layers = c.model.num_decoder_layers = 1
    c.train.expected_lot_size = 48
    c.train.physical_batch_size = 16
    c.train.num_epochs = 1
    c.train.learning_rate = 3e-3
    c.train.warmup_steps = 2
    c.train.eval_every_steps = 6
    c.train.checkpoint_every_steps = 6
    c.train.log_every_steps = 3
    c.eval.max_new_tokens = 32
    return c


def smaller_config(variant: str | None) -> ml_collections.ConfigDict:
    """`small_config(variant)` at 16 tokens, a 32-wide model, σ = 1 given, no validation.

    300 pieces, 4 validation and test pairs, micro-batches of 8, 4 new tokens:
    callers set the train size, lot size and checkpoint and log periods.
    """
    c = small_config(variant)
    c.data.max_source_length = c.data.max_target_length = 16
    c.data.max_eval_examples = c.data.max_test_examples = 4
    c.tokenizer.vocab_size = 300
    c.model.d_model, c.model.d_ff, c.model.d_kv, c.model.num_heads = 32, 64, 8, 2
    c.dp.target_epsilon, c.dp.noise_multiplier = None, 1.0  # No σ calibration (slow).
    c.train.physical_batch_size = 8
    c.train.eval_every_steps = 0
    c.eval.max_new_tokens = 4
    return c


FILES_ROWS = [(f"Satz Nummer {i} hier", f"Sentence number {i} here") for i in range(120)]


def files_corpus(folder: str | pathlib.Path) -> str:
    """Writes a `files:` de-en corpus of 120 train pairs (validation, test: the first 8)."""
    os.makedirs(folder, exist_ok=True)
    rows_of = (("train", FILES_ROWS), ("validation", FILES_ROWS[:8]), ("test", FILES_ROWS[:8]))
    for split, rows in rows_of:
        with open(os.path.join(folder, f"{split}.tsv"), "w", encoding="utf-8") as f:
            f.write("de\ten\n" + "".join(f"{a}\t{b}\n" for a, b in rows))
    return str(folder)


def files_config(folder: str | pathlib.Path, variant: str = "eps8") -> ml_collections.ConfigDict:
    """The base config `:variant` on `files_corpus(folder)`: lots of 16 by 8, σ = 1 given."""
    c = config_lib.make_config(variant)
    c.data.corpus = f"files:{files_corpus(folder)}"
    c.data.pair = "de-en"
    c.train.expected_lot_size = 16
    c.train.physical_batch_size = 8
    c.dp.noise_multiplier = 1.0  # Given σ: no calibration (fast).
    return c


def tiny_model_config() -> ml_collections.ConfigDict:
    """The base config with a one-layer T5 of width 16 (d_kv 8, d_ff 32, 2 heads)."""
    c = config_lib.base_config()
    c.model.update(d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2)
    return c


def small_plan(
    *,
    private: bool = True,
    sigma: float = 2.0,
    clip: float = 0.5,
    lot_size: int = 8,
    steps_per_epoch: int = 12,
) -> privacy.PrivacyPlan:
    """A Poisson plan over 100 examples, 10 steps, δ 1e-6 (σ is 0 when not private)."""
    return privacy.PrivacyPlan(
        private=private,
        sampling="poisson",
        dataset_size=100,
        expected_lot_size=lot_size,
        num_steps=10,
        steps_per_epoch=steps_per_epoch,
        noise_multiplier=sigma if private else 0.0,
        l2_clip=clip,
        delta=1e-6,
        accountant="rdp",
    )
