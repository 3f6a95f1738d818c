"""The tests' shared configs: a config file of `configs/` by name, and the small run.

`load_config("tiny", "eps8")` is `configs/tiny.py:eps8` as `--config` gives it;
`small_config(variant)` is `configs/tiny.py` shrunk to a run of seconds (the
end-to-end, release, decoding and noise-to-signal tests train it). Tests shrink
it further or change fields on their own copy; each call returns a new ConfigDict.
"""

import importlib.util
import pathlib
import types

import ml_collections

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
