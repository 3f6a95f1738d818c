"""The sharded lot release's sensitivity, end to end through `dpnmt.bridge`.

Poisson lots -> `device_lots` (split, pad, shard over 8 devices, prefetch) ->
`training.lot_gradient` (the step training runs) with σ = 0, compared with a
direct per-example computation:
every sampled example counted once, padding contributes nothing, the sum is
divided by the fixed L, and removing one example moves the release by <= C / L.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dpnmt import training
from dpnmt.bridge import (
    EXAMPLE_INDEX,
    MASK,
    LotCollator,
    PoissonLots,
    device_lots,
    make_data_mesh,
    shard_microbatch,
    to_microbatches,
)
from tests.bridge.helpers import MAX_SOURCE_LENGTH, VOCAB_SIZE, random_pairs

L2_CLIP = 0.05
EXPECTED_LOT_SIZE = 20
PHYSICAL_BATCH_SIZE = 8
DATASET = random_pairs(100, seed=5)


def make_dp_lot_step(loss_fn, mesh, *, l2_clip, noise_multiplier, expected_lot_size):
    """The training step (`training.make_lot_step`) with a key-free per-example loss."""
    return training.make_lot_step(
        lambda params, example, _: loss_fn(params, example),
        optax.identity(),
        training.StepPrivacy(True, l2_clip, noise_multiplier, expected_lot_size),
        mesh,
    )


def loss_fn(params, example):
    valid = (jnp.arange(MAX_SOURCE_LENGTH) < example["input_length"]).astype(jnp.float32)
    pooled = jnp.sum(params["embed"][example["input_ids"]] * valid[:, None], axis=0)
    target = example["labels"][0].astype(jnp.float32) / VOCAB_SIZE
    return (pooled @ params["w"] - target) ** 2


def _params():
    k1, k2 = jax.random.split(jax.random.key(3))
    return {
        "embed": jax.random.normal(k1, (VOCAB_SIZE, 4)) * 0.5,
        "w": jax.random.normal(k2, (4,)) * 0.5,
    }


def _flat(tree):
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


def _direct_release(params, indices):
    """Σ_i clip(∇ loss_i, C) / L, one example at a time (no vmap, no mask, no mesh)."""
    total = np.zeros_like(_flat(params))
    for index in indices:
        example = {k: v for k, v in DATASET[int(index)].items() if k != "index"}
        grad = _flat(jax.grad(loss_fn)(params, example))
        total += grad * min(1.0, L2_CLIP / np.linalg.norm(grad))
    return total / EXPECTED_LOT_SIZE


@pytest.fixture(scope="module")
def setup():
    assert len(jax.devices()) == 8, "tests/conftest.py should force 8 CPU devices"
    mesh = make_data_mesh()
    step = make_dp_lot_step(
        loss_fn, mesh, l2_clip=L2_CLIP, noise_multiplier=0.0, expected_lot_size=EXPECTED_LOT_SIZE
    )
    return mesh, step, _params()


def test_sharded_noiseless_release_equals_direct_clipped_sum_over_l(setup):
    mesh, step, params = setup
    reference_lots = list(itertools.islice(PoissonLots(DATASET, EXPECTED_LOT_SIZE, seed=8), 3))
    source = PoissonLots(DATASET, EXPECTED_LOT_SIZE, seed=8)
    with device_lots(source, mesh, PHYSICAL_BATCH_SIZE, pad_values=DATASET.pad_values) as lots:
        for lot in reference_lots:
            microbatches = next(lots)
            rows = np.concatenate([np.asarray(mb[EXAMPLE_INDEX]) for mb in microbatches] or [[]])
            real = np.concatenate([np.asarray(mb[MASK]) for mb in microbatches] or [[]]) != 0
            np.testing.assert_array_equal(np.sort(rows[real]), np.sort(lot.indices))
            assert np.all(rows[~real] == -1)  # Padding rows are never real examples.
            released = _flat(training.lot_gradient(step, params, microbatches, jax.random.key(0)))
            np.testing.assert_allclose(
                released, _direct_release(params, lot.indices), rtol=2e-5, atol=1e-8
            )


def test_removing_one_example_moves_the_sharded_release_by_at_most_c_over_l(setup):
    mesh, step, params = setup
    collate = LotCollator(DATASET.field_specs())
    lot_indices = np.arange(0, 60, 3)  # 20 examples: 3 micro-batches of 8, 4 padding rows.

    def release(indices):
        lot = collate([DATASET[int(i)] for i in indices])
        microbatches = [
            shard_microbatch(mb, mesh)
            for mb in to_microbatches(lot, PHYSICAL_BATCH_SIZE, pad_values=DATASET.pad_values)
        ]
        return _flat(training.lot_gradient(step, params, microbatches, jax.random.key(0)))

    full = release(lot_indices)
    for removed in (0, 9, 19):  # First, middle and last micro-batch.
        neighbour = release(np.delete(lot_indices, removed))
        distance = np.linalg.norm(full - neighbour)
        assert 0 < distance <= L2_CLIP / EXPECTED_LOT_SIZE * (1 + 1e-5)
