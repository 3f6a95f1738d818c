"""Noise-to-signal of a DP run: the clipped signal, the noise norm, and where the file goes."""

import json
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpnmt import core
from dpnmt.config import RunConfig
from dpnmt.errors import ConfigError
from dpnmt.evaluation import noise_to_signal
from dpnmt.training import loop
from tests.markers import needs_data
from tests.small_configs import load_config, small_config


class _Linear(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(1)(x)[0]


def _loss_fn(model):
    def loss_fn(params, example):
        return jnp.square(model.apply({"params": params}, example["x"]) - example["y"])

    return loss_fn


def test_clipped_signal_is_the_mean_of_clipped_per_example_gradients():
    model = _Linear()
    params = model.init(jax.random.key(0), jnp.zeros(5))["params"]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, 5)).astype(np.float32) * rng.uniform(0.1, 3, size=(12, 1))
    y = rng.normal(size=12).astype(np.float32)
    clip = 1.5
    micro = [
        {"x": x[:8], "y": y[:8], "mask": np.ones(8, np.float32), "example_index": np.arange(8)},
        # The second micro-batch has 4 real rows and 4 padding rows.
        {
            "x": np.concatenate([x[8:], np.full((4, 5), 50, np.float32)]),
            "y": np.concatenate([y[8:], np.zeros(4, np.float32)]),
            "mask": np.array([1, 1, 1, 1, 0, 0, 0, 0], np.float32),
            "example_index": np.array([8, 9, 10, 11, -1, -1, -1, -1]),
        },
    ]
    signal = noise_to_signal.clipped_signal(_loss_fn(model), params, micro, clip)

    grads = jax.vmap(jax.grad(_loss_fn(model)), in_axes=(None, 0))(params, {"x": x, "y": y})
    flat = np.concatenate(
        [np.asarray(g).reshape(12, -1) for g in jax.tree.leaves(grads)], axis=1
    ).astype(np.float64)
    norms = np.linalg.norm(flat, axis=1)
    clipped = flat * np.minimum(1.0, clip / norms)[:, None]
    assert signal.num_examples == 12
    np.testing.assert_allclose(signal.mean_clipped_norm, np.linalg.norm(clipped.mean(0)), rtol=1e-5)
    np.testing.assert_allclose(signal.median_example_norm, np.median(norms), rtol=1e-5)
    assert signal.fraction_clipped == pytest.approx(np.mean(norms > clip))
    assert 0 < signal.fraction_clipped < 1  # The data exercises both sides of C.
    losses = [float(_loss_fn(model)(params, {"x": x[i], "y": y[i]})) for i in range(12)]
    assert signal.loss == pytest.approx(np.mean(losses), rel=1e-5)


def test_noise_norm_matches_the_noise_dp_sgd_adds():
    sigma, clip, lot, d = 0.8, 1.0, 64.0, 20_000
    expected = noise_to_signal.noise_norm(sigma, clip, lot, d)
    key = jax.random.key(1)
    norms = []
    for i in range(20):
        noisy = core.add_gaussian_noise(jnp.zeros(d), sigma * clip, jax.random.fold_in(key, i))
        norms.append(float(jnp.linalg.norm(noisy / lot)))
    # ‖N(0, s² I_d)‖ has mean s√(d - 1/2) (to O(1/d)) and std about s/√2; the mean of 20
    # draws is within 4 standard errors, and √d is what the formula claims.
    scale = sigma * clip / lot
    assert abs(np.mean(norms) - expected) < 4 * scale / math.sqrt(2) / math.sqrt(20) + scale / d


@pytest.mark.slow
@needs_data
def test_run_measurement_lands_in_private_when_validation_is_carved(tmp_path):
    workdir = tmp_path / "run"
    config = small_config("eps8")
    config.data.max_train_examples = 96
    config.data.max_eval_examples = config.data.max_test_examples = 4
    config.model.d_model, config.model.d_ff, config.model.d_kv = 32, 64, 8
    config.eval.max_new_tokens = 4
    loop.train_and_evaluate(RunConfig.of(config), str(workdir))

    path, result = noise_to_signal.write_run(str(workdir), max_examples=20)
    # The WMT sample's validation split is carved from its (private) train split.
    assert result["validation_is_private"]
    assert path == str(workdir / "private" / "noise_to_signal.json")
    assert not (workdir / "noise_to_signal.json").exists()
    assert json.loads((workdir / "private" / "noise_to_signal.json").read_text()) == json.loads(
        json.dumps(result)
    )
    for name in ("initial", "trained"):
        r = result[name]
        assert r["num_examples"] == 20
        assert 0 < r["mean_clipped_norm"] <= config.dp.l2_clip * (1 + 1e-6)
        assert r["noise_to_signal"] == pytest.approx(result["noise_norm"] / r["mean_clipped_norm"])
    assert result["noise_norm"] == pytest.approx(
        result["noise_multiplier"] * math.sqrt(result["num_trainable"]) / 48
    )
    assert result["finished"] and result["steps_done"] == result["steps_planned"] >= 1
    assert "PRIVATE training data" in noise_to_signal.format_table(result)
    table = noise_to_signal.format_table(result)
    config.dp.enabled = False  # A non-private run has no noise to compare: refused.
    with pytest.raises(ConfigError, match="non-private run"):
        noise_to_signal.measure_run(RunConfig.of(config), str(workdir))
    assert "| initial |" in table and "| trained |" in table


@pytest.fixture(scope="module")
def tiny_public_model(tmp_path_factory):
    from tests.tiny_export import write_tiny_export

    sentence = "ein kleiner Hund {i} läuft, a small dog runs"
    return write_tiny_export(tmp_path_factory.mktemp("model"), sentence, feed_forward_proj="relu")


@pytest.mark.slow
@needs_data
def test_a_configs_start_is_measured_before_training_with_its_plans_sigma(tiny_public_model):
    from dpnmt import privacy

    results = {}
    for variant in ("eps8", "eps8,lora"):
        config = load_config("multi30k_from_public", variant)
        config.model.name_or_path = str(tiny_public_model)
        run = RunConfig.of(config)
        results[variant] = noise_to_signal.measure_start(run, max_examples=6)
        plan = privacy.plan_privacy(run.dp, run.train, 29000)
        result = results[variant]
        assert set(result) >= {"initial", "noise_norm", "num_trainable"}
        assert "trained" not in result and result["steps_done"] == 0
        lot = run.train.expected_lot_size  # 1,024; LoRA's stand-in winner 4,096.
        assert lot == (4096 if "lora" in variant else 1024)
        assert result["steps_planned"] == plan.num_steps == round(20 * 29000 / lot)  # 20 epochs.
        assert result["dataset_size"] == 29000  # Multi30K's train pairs, counted as training does.
        assert result["noise_multiplier"] == plan.noise_multiplier
        assert result["noise_norm"] == pytest.approx(
            plan.noise_multiplier * plan.l2_clip * math.sqrt(result["num_trainable"]) / lot
        )
        assert result["initial"]["num_examples"] == 6 and not result["validation_is_private"]
        assert "| initial |" in noise_to_signal.format_table(result)
    # LoRA trains fewer parameters (even at this width): less noise on each update, by √d,
    # and by σ/L for its larger lots.
    lora, full = results["eps8,lora"], results["eps8"]
    assert lora["num_trainable"] < full["num_trainable"] and lora["noise_norm"] < full["noise_norm"]
    per_lot = (lora["noise_multiplier"] / 4096) / (full["noise_multiplier"] / 1024)
    assert lora["noise_norm"] / full["noise_norm"] == pytest.approx(
        per_lot * math.sqrt(lora["num_trainable"] / full["num_trainable"])
    )


@needs_data
def test_a_configs_start_is_not_measured_on_a_validation_carved_from_train():
    carved = small_config("eps8")  # The WMT sample: validation carved from train.
    with pytest.raises(ConfigError, match="carved from the private train split"):
        noise_to_signal.measure_start(RunConfig.of(carved))
    with pytest.raises(ConfigError, match="non-private run"):
        noise_to_signal.measure_start(RunConfig.of(small_config("nonprivate")))
    dp_vocab = load_config("multi30k_dp_vocab", "eps8")  # Public validation, private vocabulary.
    with pytest.raises(ConfigError, match="learns its vocabulary from the private train split"):
        noise_to_signal.measure_start(RunConfig.of(dp_vocab))
    # Public vocabulary text that is the private corpus: refused as training refuses it.
    leaky = load_config("multi30k_scratch_recipe", "eps8")
    leaky.tokenizer.public_corpora = leaky.data.corpus
    with pytest.raises(ConfigError, match="public_corpora"):
        noise_to_signal.measure_start(RunConfig.of(leaky))
