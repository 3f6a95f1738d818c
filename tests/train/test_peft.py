"""Parameter-efficient DP fine-tuning in the trainer: LoRA adapters and bias-only.

The config checks (one line naming the field), the lot step (only the trainable
part is clipped, noised and in the optimizer state; the base stays as built),
and a tiny LoRA run on the WMT sample that stops, resumes, translates and exports
with its adapters merged.
"""

import json
import types

import flax.traverse_util as traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dpnmt import bridge, config_lib, core, models, release, training
from dpnmt.config import RunConfig
from dpnmt.errors import ConfigError
from dpnmt.evaluation import decode
from dpnmt.training import loop, pieces, preflight
from tests.markers import needs_data
from tests.small_configs import small_plan, tiny_model_config


def _model_problems(**fields):
    config = config_lib.make_config("eps8")
    config.model.update(fields)
    return [
        p for p in preflight.config_problems(RunConfig.of(config), device_count=1) if "model." in p
    ]


def test_config_checks_name_the_field_and_the_fix(tmp_path):
    assert _model_problems(finetune="lora", lora_rank=8) == []
    assert _model_problems(finetune="lora") == [
        "model.finetune='lora' needs model.lora_rank >= 1 (the adapters' rank, e.g. 8)."
    ]
    (problem,) = _model_problems(lora_rank=8)
    assert "model.lora_rank=8" in problem and "model.finetune='lora'" in problem
    # Unknown layers are named, with the valid ones of this (gated T5) model.
    (problem,) = _model_problems(finetune="lora", lora_rank=8, lora_targets="q,fc1,wi")
    assert problem.startswith("model.lora_targets='q,fc1,wi': unknown target(s) fc1, wi;")
    assert problem.endswith("valid for this model: q, k, v, o, wi_0, wi_1, wo.")
    (problem,) = _model_problems(
        finetune="lora", lora_rank=8, lora_targets="wi_0", feed_forward_proj="relu"
    )
    assert problem.endswith("valid for this model: q, k, v, o, wi, wo.")
    (problem,) = _model_problems(finetune="lora", lora_rank=8, trainable="decoder/")
    assert "model.trainable='decoder/'" in problem and "unset model.trainable" in problem
    (problem,) = _model_problems(finetune="lora", lora_rank=2, lora_alpha=-1.0)
    assert problem == "model.lora_alpha=-1.0 must be > 0 (or unset: alpha = rank)."
    # T5 has no biases: refused from scratch and for a local T5; a local mBART is fine.
    (problem,) = _model_problems(finetune="bias")
    assert problem.startswith("model.finetune='bias' trains only bias terms")
    for model_type, refused in (("mt5", True), ("mbart", False)):
        folder = tmp_path / model_type
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
        for name in ("model.safetensors", "tokenizer.json"):  # Present: not read here.
            (folder / name).write_text("")
        problems = _model_problems(finetune="bias", name_or_path=str(folder))
        assert bool(problems) == refused, problems
    problems = _model_problems(
        finetune="lora", lora_rank=4, lora_targets="fc1,wo", name_or_path=str(tmp_path / "mbart")
    )
    assert problems == [
        "model.lora_targets='fc1,wo': unknown target(s) wo; valid for this model: "
        "q, k, v, o, fc1, fc2."
    ]


VOCAB, PAD, EOS, ROWS, LENGTH = 32, 0, 1, 4, 5


def _tiny_lora_config():
    config = tiny_model_config()
    config.model.update(finetune="lora", lora_rank=2, lora_targets="q,v,wo")
    return config


def test_lot_step_clips_noises_and_optimizes_only_the_adapters():
    config = _tiny_lora_config()
    tokenizer = types.SimpleNamespace(vocab_size=VOCAB, pad_id=PAD, eos_id=EOS)
    model, model_config, params = pieces.build_model(
        RunConfig.of(config).model, tokenizer, jax.random.key(0)
    )
    trainable, frozen = pieces.split_trainable(RunConfig.of(config).model, params)
    trainable_paths = {"/".join(k) for k in traverse_util.flatten_dict(trainable)}
    assert trainable_paths and all(models.is_adapter(p) for p in trainable_paths)
    assert not any(models.is_adapter("/".join(k)) for k in traverse_util.flatten_dict(frozen))
    sigma, clip, lot = 2.0, 0.5, 8
    plan = small_plan(sigma=sigma, clip=clip, lot_size=lot)
    tx = optax.adam(1e-2)
    step = training.make_lot_step(
        lambda p, example, key: training.example_loss(model, model_config, p, example, key),
        tx,
        training.StepPrivacy.from_plan(plan),
        bridge.make_data_mesh(jax.devices()[:1]),
    )
    # The optimizer state holds moments of the adapters only.
    opt_state = tx.init(trainable)
    state_sizes = sum(x.size for x in jax.tree.leaves(opt_state) if x.ndim)
    assert state_sizes == 2 * sum(x.size for x in jax.tree.leaves(trainable))
    # An empty lot: the release is pure noise N(0, (σC/L)²) on each adapter leaf.
    noise = training.lot_gradient(step, trainable, [], jax.random.key(9), frozen=frozen)
    assert {"/".join(k) for k in traverse_util.flatten_dict(noise)} == trainable_paths
    draws = np.concatenate([np.ravel(x) for x in jax.tree.leaves(noise)])
    # The sample std of n normals is within 5 standard errors (σ/sqrt(2n)) of σ.
    expected = sigma * clip / lot
    assert abs(draws.std() - expected) < 5 * expected / np.sqrt(2 * draws.size)
    # A real micro-batch: the clipped sum reaches A and B (B starts at 0, A does not).
    rng = np.random.default_rng(3)
    micro = {
        bridge.dataset.INPUT_IDS: rng.integers(2, VOCAB, (ROWS, LENGTH)).astype(np.int32),
        bridge.dataset.INPUT_LENGTH: np.full((ROWS,), LENGTH, np.int32),
        bridge.dataset.LABELS: rng.integers(2, VOCAB, (ROWS, LENGTH)).astype(np.int32),
        bridge.dataset.LABEL_LENGTH: np.full((ROWS,), LENGTH, np.int32),
        bridge.MASK: np.ones((ROWS,), np.int32),
    }
    acc = core.init_accumulator(trainable)
    acc, _ = step.add_microbatch(
        acc, trainable, frozen, {k: jnp.asarray(v) for k, v in micro.items()}, jax.random.key(1)
    )
    flat = traverse_util.flatten_dict(acc.grad_sum)
    assert all(float(jnp.abs(v).max()) > 0 for k, v in flat.items() if k[-2] == "lora_b")
    norm = float(jnp.sqrt(sum(jnp.sum(v**2) for v in flat.values())))
    assert norm <= ROWS * clip * (1 + 1e-5)


def test_bias_only_on_t5_is_refused_at_build_too():
    config = _tiny_lora_config()
    config.model.update(finetune="bias", lora_rank=0)
    tokenizer = types.SimpleNamespace(vocab_size=VOCAB, pad_id=PAD, eos_id=EOS)
    _, _, params = pieces.build_model(RunConfig.of(config).model, tokenizer, jax.random.key(0))
    with pytest.raises(ConfigError, match="model.finetune='bias' trains only bias terms"):
        pieces.split_trainable(RunConfig.of(config).model, params)


@pytest.mark.slow
@needs_data
def test_lora_run_resumes_translates_and_exports_merged(tmp_path):
    from tests.small_configs import small_config

    config = small_config("eps8")
    config.data.max_train_examples = 96
    config.data.max_eval_examples = config.data.max_test_examples = 4
    config.model.d_model, config.model.d_ff, config.model.d_kv = 32, 64, 8
    config.eval.max_new_tokens = 4
    config.train.eval_every_steps = 0
    config.model.update(finetune="lora", lora_rank=4, lora_alpha=8.0, lora_targets="q,v,wo")
    workdir = str(tmp_path / "run")
    loop.train_and_evaluate(RunConfig.of(config), workdir, stop_after_steps=1)
    results = loop.train_and_evaluate(RunConfig.of(config), workdir)  # Resumes from step 1.
    assert results["finished"] and results["steps_done"] >= 2

    tokenizer, _, model_config, params, _, _ = decode.load_trained(RunConfig.of(config), workdir)
    assert model_config.lora == models.LoRASpec(4, 8.0, ("q", "v", "wo"))
    _, _, initial = pieces.build_model(
        RunConfig.of(config).model, tokenizer, jax.random.fold_in(jax.random.key(config.seed), 0)
    )
    trained, start = traverse_util.flatten_dict(params), traverse_util.flatten_dict(initial)
    assert trained.keys() == start.keys()
    for key, value in trained.items():
        if models.is_adapter("/".join(key)):
            if key[-2] == "lora_b":  # Trained away from zero.
                assert float(jnp.abs(value).max()) > 0
        else:  # The base is exactly as built: frozen, never noised.
            np.testing.assert_array_equal(value, start[key])

    translator = release.load_translator(workdir=workdir)
    lines = release.translate_lines(
        translator, ["Ein Hund.", "", "Gut."], batch_size=2, num_beams=1, max_new_tokens=4
    )
    assert len(lines) == 3 and lines[1] == ""

    out = tmp_path / "export"
    release.export_run(workdir, str(out))
    exported_model, exported, _ = models.load_pretrained(str(out))
    merged, merged_config = models.merge_adapters(params, model_config)
    assert exported_model.config.lora == models.LoRASpec()
    assert merged_config.d_model == exported_model.config.d_model
    jax.tree.map(np.testing.assert_array_equal, exported, merged)
