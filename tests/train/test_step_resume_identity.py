"""A run started before the core-owned DP step (issue 28 item 3) resumes bit for bit.

`frozen_lot_step` and `frozen_loop_lots` below are a frozen copy of
`training.steps.make_lot_step` and of the loop's key schedule as of commit
a528993 (before the step moved into `dpnmt.core.dp_step`). They call only the
lower-level pieces that move did not touch (`core.private_grad_sum`,
`core.accumulate`, `core.noisy_average`, `core.noise_key_for_step`). The
trainer's step and key schedule must give the same parameters and optimizer
state, bit for bit, lot after lot (dropout on, Adam, an empty lot, the
non-private baseline; a small Flax model with ghost-clipped Embed and Dense
layers keeps it cheap): a checkpoint written by the old code then continues
exactly as it would have.
"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

from dpnmt import bridge, core, models, training
from dpnmt.bridge.dataset import INPUT_IDS, INPUT_LENGTH, LABEL_LENGTH, LABELS
from dpnmt.bridge.microbatch import EXAMPLE_INDEX, MASK
from dpnmt.bridge.sharding import batch_sharding, replicated_sharding
from tests.small_configs import small_plan

SOURCE_LENGTH, TARGET_LENGTH, ROWS, VOCAB = 6, 5, 4, 32
# Lots as micro-batch masks: two micro-batches, an empty lot, one padded micro-batch.
LOTS = ([[1, 1, 1, 0], [1, 0, 0, 0]], [], [[0, 1, 1, 0]])


def frozen_lot_step(loss_fn, tx, privacy_, mesh, *, clipping="ghost", clipping_chunk=0):
    """`make_lot_step` as of a528993 (add_microbatch and apply_lot), verbatim in substance."""
    replicated, data = replicated_sharding(mesh), batch_sharding(mesh)

    def add_microbatch(acc, trainable, frozen, micro, key):
        batch = {k: v for k, v in micro.items() if k not in (MASK, EXAMPLE_INDEX)}
        mask = micro[MASK]

        def one_loss(params, example, example_key):
            return loss_fn(models.merge_params(params, frozen), example, example_key)

        real = jnp.sum(mask != 0).astype(jnp.int32)
        if privacy_.private:
            grad_sum, _, mean_loss = core.private_grad_sum(
                one_loss,
                trainable,
                batch,
                mask,
                l2_clip=privacy_.l2_clip,
                dropout_key=key,
                clipping=clipping,
                microbatch_size=clipping_chunk or None,
            )
            loss_sum = mean_loss * real
        else:
            keys = jax.random.split(key, mask.shape[0])

            def summed(params):
                losses = jax.vmap(one_loss, in_axes=(None, 0, 0))(params, batch, keys)
                return jnp.sum(jnp.where(mask != 0, losses, 0.0))

            loss_sum, grad_sum = jax.value_and_grad(summed)(trainable)
        return core.accumulate(acc, grad_sum, real), loss_sum

    def release(acc, noise_key):
        if privacy_.private:
            return core.noisy_average(
                acc,
                noise_key,
                noise_multiplier=privacy_.noise_multiplier,
                l2_clip=privacy_.l2_clip,
                expected_lot_size=privacy_.expected_lot_size,
                noise_mode=privacy_.noise_mode,
            )
        return jax.tree.map(lambda g: g / privacy_.expected_lot_size, acc.grad_sum)

    def apply_lot(trainable, opt_state, acc, noise_key):
        updates, opt_state = tx.update(release(acc, noise_key), opt_state, trainable)
        return optax.apply_updates(trainable, updates), opt_state

    return types.SimpleNamespace(
        add_microbatch=jax.jit(
            add_microbatch,
            in_shardings=(replicated, replicated, replicated, data, replicated),
            out_shardings=(replicated, replicated),
        ),
        apply_lot=jax.jit(
            apply_lot,
            in_shardings=(replicated,) * 4,
            out_shardings=(replicated, replicated),
        ),
    )


def frozen_loop_lots(step_fns, trainable, opt_state, lots, noise_base, dropout_base, start):
    """The loop's lots as of a528993: keys from Python-int steps, outside the step."""
    for step, microbatches in enumerate(lots, start=start):
        acc = core.init_accumulator(trainable)
        for index, micro in enumerate(microbatches):
            key = jax.random.fold_in(jax.random.fold_in(dropout_base, step), index)
            acc, _ = step_fns.add_microbatch(acc, trainable, {}, micro, key)
        trainable, opt_state = step_fns.apply_lot(
            trainable, opt_state, acc, core.noise_key_for_step(noise_base, step)
        )
    return trainable, opt_state


def _micro(mask, seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, SOURCE_LENGTH + 1, ROWS), rng.integers(2, TARGET_LENGTH + 1, ROWS)
    return {
        INPUT_IDS: jnp.asarray(rng.integers(2, VOCAB, (ROWS, SOURCE_LENGTH)), jnp.int32),
        INPUT_LENGTH: jnp.asarray(lengths[0], jnp.int32),
        LABELS: jnp.asarray(rng.integers(2, VOCAB, (ROWS, TARGET_LENGTH)), jnp.int32),
        LABEL_LENGTH: jnp.asarray(lengths[1], jnp.int32),
        MASK: jnp.asarray(mask, jnp.int32),
    }


class _Tiny(nn.Module):
    """Embed, dropout, Dense: ghost-clipped layers and a dropout key per example."""

    @nn.compact
    def __call__(self, example, dropout_key):
        valid = (jnp.arange(SOURCE_LENGTH) < example[INPUT_LENGTH]).astype(jnp.float32)
        hidden = nn.Embed(VOCAB, 8)(example[INPUT_IDS]) * valid[:, None]
        hidden = nn.Dropout(0.3, deterministic=dropout_key is None)(hidden, rng=dropout_key)
        logits = nn.Dense(VOCAB)(jnp.sum(hidden, axis=0) / jnp.maximum(jnp.sum(valid), 1.0))
        return optax.softmax_cross_entropy_with_integer_labels(logits, example[LABELS][0])


@pytest.fixture(scope="module")
def tiny():
    model = _Tiny()
    example = jax.tree.map(lambda v: v[0], _micro([1] * ROWS, seed=0))
    params = model.init(jax.random.key(0), example, None)["params"]

    def loss_fn(p, example, key):
        return model.apply({"params": p}, example, key)

    lots = [
        [_micro(mask, seed=10 * lot + k) for k, mask in enumerate(masks)]
        for lot, masks in enumerate(LOTS)
    ]
    seed = 2**100 + 12345  # Stand-ins for the run's secret derived seeds.
    return types.SimpleNamespace(
        params=params,
        loss_fn=loss_fn,
        lots=lots,
        noise_base=core.key_from_seed(seed),
        dropout_base=core.key_from_seed(seed + 1),
        mesh=bridge.make_data_mesh(jax.devices()[:1]),
    )


def _plan(private):
    return small_plan(private=private, sigma=1.5, clip=0.3, lot_size=6, steps_per_epoch=16)


def _trainer_lots(tiny, step_fns, trainable, opt_state, start):
    """The lots as `training.loop` runs them today, through the core's key schedule."""
    state = core.TrainState(jnp.asarray(start, jnp.int32), trainable, opt_state)
    for offset, microbatches in enumerate(tiny.lots):
        step = start + offset
        acc = core.init_accumulator(state.params)
        for index, micro in enumerate(microbatches):
            key = core.dropout_key(tiny.dropout_base, step, index)
            acc, _ = step_fns.add_microbatch(acc, state.params, {}, micro, key)
        state = step_fns.apply_lot(state, acc, tiny.noise_base)
        assert int(state.step) == step + 1
    return state.params, state.opt_state


def _bits(tree):
    return [np.asarray(leaf).tobytes() for leaf in jax.tree.leaves(tree)]


@pytest.mark.slow  # About 40 s a case on 2 loaded cores: four small jit compiles.
@pytest.mark.parametrize("private", [True, False])
def test_lots_after_a_resume_are_bit_identical_to_the_old_step(tiny, private):
    privacy_ = training.StepPrivacy.from_plan(_plan(private))
    tx = optax.adam(1e-2)
    start = 7  # A resumed run: the key schedule continues at the checkpoint's step.
    old = frozen_lot_step(tiny.loss_fn, tx, privacy_, tiny.mesh)
    expected = frozen_loop_lots(
        old, tiny.params, tx.init(tiny.params), tiny.lots, tiny.noise_base, tiny.dropout_base, start
    )
    new = training.make_lot_step(tiny.loss_fn, tx, privacy_, tiny.mesh)
    params = jax.tree.map(jnp.copy, tiny.params)  # apply_lot donates its state.
    got = _trainer_lots(tiny, new, params, tx.init(params), start)
    assert _bits(got) == _bits(expected)
    moved = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), got[0], tiny.params)
    assert all(jax.tree.leaves(moved))  # The lots did train every parameter.
