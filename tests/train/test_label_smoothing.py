"""`train.label_smoothing`: the per-example training loss with smoothed targets.

Off (0) it is the plain token-mean cross-entropy, bit for bit; at 0.1 it equals
optax's `softmax_cross_entropy` on `smooth_labels` targets, averaged over the
example's own target tokens with padding ignored.
"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dpnmt import models, training
from dpnmt.bridge.dataset import INPUT_IDS, INPUT_LENGTH, LABEL_LENGTH, LABELS
from dpnmt.config import RunConfig
from dpnmt.training import pieces, setup, steps
from tests.markers import needs_data
from tests.small_configs import small_config, tiny_model_config

VOCAB, PAD = 40, 0


@pytest.fixture(scope="module")
def tiny():
    config = tiny_model_config()
    tokenizer = types.SimpleNamespace(vocab_size=VOCAB, pad_id=PAD, eos_id=1)
    model, model_config, params = pieces.build_model(
        RunConfig.of(config).model, tokenizer, jax.random.key(0)
    )
    return model, model_config, params


def _example(label_length=4, target_length=7, padding_value=PAD):
    rng = np.random.default_rng(3)
    labels = rng.integers(2, VOCAB, target_length).astype(np.int32)
    labels[label_length:] = padding_value
    return {
        INPUT_IDS: rng.integers(2, VOCAB, 6).astype(np.int32),
        INPUT_LENGTH: np.int32(5),
        LABELS: labels,
        LABEL_LENGTH: np.int32(label_length),
    }


def test_cross_entropy_matches_optax_smooth_labels():
    logits = jax.random.normal(jax.random.key(1), (5, VOCAB)) * 3
    labels = jnp.asarray([3, 0, 7, 39, 12])
    plain = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    np.testing.assert_array_equal(steps.smoothed_cross_entropy(logits, labels, 0.0), plain)
    targets = optax.smooth_labels(jax.nn.one_hot(labels, VOCAB), 0.1)
    np.testing.assert_allclose(
        steps.smoothed_cross_entropy(logits, labels, 0.1),
        optax.softmax_cross_entropy(logits, targets),
        rtol=1e-6,
    )
    with pytest.raises(ValueError, match="label_smoothing"):
        steps.smoothed_cross_entropy(logits, labels, 1.0)


def test_example_loss_off_is_unchanged_and_on_matches_optax(tiny):
    model, model_config, params = tiny
    example = _example()
    key = jax.random.key(5)
    default = training.example_loss(model, model_config, params, example, key)
    off = training.example_loss(model, model_config, params, example, key, label_smoothing=0.0)
    np.testing.assert_array_equal(off, default)

    # The reference: the model's logits, optax's smoothed targets, the mean over the
    # example's 4 real target tokens.
    n = int(example[LABEL_LENGTH])
    labels = jnp.where(jnp.arange(7) < n, example[LABELS], PAD)[None]
    logits = model.apply(
        {"params": params},
        example[INPUT_IDS][None],
        (jnp.arange(6) < example[INPUT_LENGTH])[None].astype(jnp.int32),
        models.decoder_inputs(model_config, labels),
        deterministic=False,
        rngs={"dropout": key},
    )[0]
    targets = optax.smooth_labels(jax.nn.one_hot(labels[0], VOCAB), 0.1)
    expected = jnp.mean(optax.softmax_cross_entropy(logits, targets)[:n])
    smoothed = training.example_loss(model, model_config, params, example, key, label_smoothing=0.1)
    np.testing.assert_allclose(smoothed, expected, rtol=1e-5)
    assert abs(float(smoothed) - float(default)) > 1e-3  # Smoothing changed the loss.


def test_smoothed_loss_ignores_padding_positions(tiny):
    model, model_config, params = tiny
    losses = [
        training.example_loss(
            model,
            model_config,
            params,
            _example(padding_value=value),
            None,
            label_smoothing=0.1,
        )
        for value in (PAD, 17, 33)  # Whatever sits after label_length.
    ]
    np.testing.assert_array_equal(losses[0], losses[1])
    np.testing.assert_array_equal(losses[0], losses[2])


@needs_data
def test_run_trains_on_the_smoothed_loss_and_validates_on_plain_cross_entropy(tmp_path):
    config = small_config("nonprivate")
    config.train.label_smoothing = 0.1
    run = setup.build_run(RunConfig.of(config), str(tmp_path / "run"))
    params = models.merge_params(run.model.trainable, run.model.frozen)
    row = run.data.tokenized["validation"][0]
    example = {
        INPUT_IDS: np.asarray(row["input_ids"], np.int32),
        INPUT_LENGTH: np.int32(len(row["input_ids"])),
        LABELS: np.asarray(row["labels"], np.int32),
        LABEL_LENGTH: np.int32(len(row["labels"])),
    }

    def reference(smoothing):
        return training.example_loss(
            run.model.model,
            run.model.model_config,
            params,
            example,
            None,
            label_smoothing=smoothing,
        )

    np.testing.assert_array_equal(run.model.loss_fn(params, example, None), reference(0.1))
    np.testing.assert_array_equal(run.model.eval_loss_fn(params, example, None), reference(0.0))
    assert abs(float(reference(0.1)) - float(reference(0.0))) > 1e-3
