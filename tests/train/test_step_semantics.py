"""How the trainer uses dpnmt.core: one noisy release per lot, fixed divisor L,
per-example losses that ignore padding and never couple examples.

Uses `training.make_lot_step` (the step `dpnmt.train` runs) on a tiny from-scratch
T5 on a one-device mesh (two jit compiles).
"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dpnmt import bridge, core, training
from dpnmt.bridge.dataset import INPUT_IDS, INPUT_LENGTH, LABEL_LENGTH, LABELS
from dpnmt.config import RunConfig
from dpnmt.training import pieces
from tests.small_configs import small_plan, tiny_model_config

SOURCE_LENGTH, TARGET_LENGTH, ROWS = 6, 5, 4
PAD, EOS, VOCAB = 0, 1, 32


@pytest.fixture(scope="module")
def tiny():
    config = tiny_model_config()
    config.model.dropout_rate = 0.0
    tokenizer = types.SimpleNamespace(vocab_size=VOCAB, pad_id=PAD, eos_id=EOS)
    model, model_config, params = pieces.build_model(
        RunConfig.of(config).model, tokenizer, jax.random.key(0)
    )
    plan = small_plan()
    tx = optax.sgd(1.0)
    steps = training.make_lot_step(
        lambda p, example, key: training.example_loss(model, model_config, p, example, key),
        tx,
        training.StepPrivacy.from_plan(plan),
        bridge.make_data_mesh(jax.devices()[:1]),
    )
    return types.SimpleNamespace(params=params, steps=steps, tx=tx, plan=plan)


def _micro(rows, mask):
    """A [ROWS, ...] micro-batch from (source, target) token lists; masked rows get garbage."""
    rng = np.random.default_rng(7)
    micro = {
        INPUT_IDS: rng.integers(2, VOCAB, (ROWS, SOURCE_LENGTH)).astype(np.int32),
        INPUT_LENGTH: np.full((ROWS,), SOURCE_LENGTH, np.int32),
        LABELS: rng.integers(2, VOCAB, (ROWS, TARGET_LENGTH)).astype(np.int32),
        LABEL_LENGTH: np.full((ROWS,), TARGET_LENGTH, np.int32),
        bridge.MASK: np.asarray(mask, np.int32),
    }
    for index, (source, target) in enumerate(rows):
        if source is None:
            continue
        micro[INPUT_IDS][index] = PAD
        micro[INPUT_IDS][index, : len(source)] = source
        micro[INPUT_LENGTH][index] = len(source)
        micro[LABELS][index] = PAD
        micro[LABELS][index, : len(target)] = target
        micro[LABEL_LENGTH][index] = len(target)
    return {k: jnp.asarray(v) for k, v in micro.items()}


A = ([5, 6, 7, EOS], [9, 10, EOS])
B = ([11, 12, EOS], [13, 14, 15, EOS])
NONE = (None, None)


def _grad_sum(tiny, micro, key=1):
    acc = core.init_accumulator(tiny.params)
    acc, _ = tiny.steps.add_microbatch(acc, tiny.params, {}, micro, jax.random.key(key))
    return acc


def test_examples_do_not_couple_and_padding_rows_and_tokens_contribute_zero(tiny):
    both = _grad_sum(tiny, _micro([A, B, NONE, NONE], [1, 1, 0, 0]))
    only_a = _grad_sum(tiny, _micro([A, NONE, NONE, NONE], [1, 0, 0, 0]))
    only_b = _grad_sum(tiny, _micro([NONE, B, NONE, NONE], [0, 1, 0, 0]))
    # Different garbage in the padded token positions of A and in masked rows.
    a_other_padding = _micro([A, NONE, NONE, NONE], [1, 0, 0, 0])
    a_other_padding[INPUT_IDS] = a_other_padding[INPUT_IDS].at[0, 4:].set(17)
    a_other_padding[LABELS] = a_other_padding[LABELS].at[0, 3:].set(23)
    a_other_padding[INPUT_IDS] = a_other_padding[INPUT_IDS].at[1:].set(3)
    only_a_again = _grad_sum(tiny, a_other_padding, key=99)

    assert int(both.num_examples) == 2 and int(only_a.num_examples) == 1
    jax.tree.map(
        lambda s, a, b: np.testing.assert_allclose(s, a + b, rtol=1e-4, atol=1e-6),
        both.grad_sum,
        only_a.grad_sum,
        only_b.grad_sum,
    )
    jax.tree.map(
        lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7),
        only_a.grad_sum,
        only_a_again.grad_sum,
    )
    # Each clipped example has norm <= C, so the sum has norm <= 2C.
    norm = float(core.per_example_l2_norms(jax.tree.map(lambda g: g[None], both.grad_sum))[0])
    assert norm <= 2 * tiny.plan.l2_clip + 1e-5


def test_update_is_noisy_sum_over_fixed_l_whatever_the_realised_size(tiny):
    grad_sum = jax.tree.map(lambda p: jnp.full(p.shape, 0.25, jnp.float32), tiny.params)
    noise_base = core.key_from_seed(1234, allow_fixed_seed_for_testing=True)
    key = core.noise_key_for_step(noise_base, 3)  # Lot 3's key, as the step derives it.
    noisy_sum = core.add_gaussian_noise(
        grad_sum, tiny.plan.noise_multiplier * tiny.plan.l2_clip, key
    )
    expected = jax.tree.map(
        lambda p, g: p - g / tiny.plan.expected_lot_size, tiny.params, noisy_sum
    )
    for realised in (0, 3, 8, 20):
        acc = core.AccumulatorState(grad_sum, jnp.asarray(realised, jnp.int32))
        params = jax.tree.map(jnp.copy, tiny.params)
        state = core.TrainState(jnp.int32(3), params, tiny.tx.init(params))
        updated = tiny.steps.apply_lot(state, acc, noise_base).params
        jax.tree.map(
            lambda u, e: np.testing.assert_allclose(u, e, rtol=1e-5, atol=1e-6),
            updated,
            expected,
        )
    # An empty lot (zero micro-batches) is still a noisy step.
    empty = core.init_accumulator(tiny.params)
    params = jax.tree.map(jnp.copy, tiny.params)
    state = core.TrainState(jnp.int32(3), params, tiny.tx.init(params))
    updated = tiny.steps.apply_lot(state, empty, noise_base).params
    moved = jax.tree.map(lambda u, p: float(jnp.max(jnp.abs(u - p))), updated, tiny.params)
    assert min(jax.tree.leaves(moved)) > 0.0
