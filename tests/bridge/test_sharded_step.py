"""The one DP lot step (`dpnmt.training.steps`, what `dpnmt.train` runs) on 8 devices:
noise once on the global sum, padding exactly zero, empty lots noise-only.
"""

import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import stats

from dpnmt import core, training
from dpnmt.bridge import (
    DATA_AXIS,
    MASK,
    LotCollator,
    PoissonLots,
    batch_sharding,
    check_physical_batch_size,
    device_lots,
    make_data_mesh,
    shard_microbatch,
    to_microbatches,
)
from tests.bridge.helpers import MAX_SOURCE_LENGTH, VOCAB_SIZE, random_pairs

NUM_DEVICES = 8
PHYSICAL_BATCH_SIZE = 16
L2_CLIP = 0.05
NOISE_MULTIPLIER = 1.3
EXPECTED_LOT_SIZE = 40
LEARNING_RATE = 0.5

DATASET = random_pairs(100, seed=2)
COLLATE = LotCollator(DATASET.field_specs())


def make_dp_lot_step(loss_fn, mesh, *, l2_clip, noise_multiplier, expected_lot_size):
    """The training step (`training.make_lot_step`) with a key-free per-example loss."""
    return training.make_lot_step(
        lambda params, example, _: loss_fn(params, example),
        optax.identity(),
        training.StepPrivacy(True, l2_clip, noise_multiplier, expected_lot_size),
        mesh,
    )


def loss_fn(params, example):
    """Squared error of a mean-pooled embedding; depends on this example only."""
    valid = (jnp.arange(MAX_SOURCE_LENGTH) < example["input_length"]).astype(jnp.float32)
    embedded = params["embed"][example["input_ids"]]
    pooled = jnp.sum(embedded * valid[:, None], axis=0) / jnp.maximum(jnp.sum(valid), 1.0)
    target = example["labels"][0].astype(jnp.float32) / VOCAB_SIZE
    return (pooled @ params["w"] + params["b"] - target) ** 2


def init_params(seed=0):
    k1, k2 = jax.random.split(jax.random.key(seed))
    return {
        "embed": jax.random.normal(k1, (VOCAB_SIZE, 8)) * 0.3,
        "w": jax.random.normal(k2, (8,)) * 0.3,
        "b": jnp.zeros(()),
    }


def sgd(params, grads):
    return jax.tree_util.tree_map(lambda p, g: p - LEARNING_RATE * g, params, grads)


def lot_of(indices):
    return COLLATE([DATASET[int(i)] for i in indices])


@pytest.fixture(scope="module")
def meshes():
    assert len(jax.devices()) == NUM_DEVICES, "tests/conftest.py should force 8 CPU devices"
    return {8: make_data_mesh(), 1: make_data_mesh(jax.devices()[:1])}


@pytest.fixture(scope="module")
def steps(meshes):
    return {
        count: make_dp_lot_step(
            loss_fn,
            mesh,
            l2_clip=L2_CLIP,
            noise_multiplier=NOISE_MULTIPLIER,
            expected_lot_size=EXPECTED_LOT_SIZE,
        )
        for count, mesh in meshes.items()
    }


def sharded_microbatches(lot, mesh):
    return [
        shard_microbatch(mb, mesh)
        for mb in to_microbatches(lot, PHYSICAL_BATCH_SIZE, pad_values=DATASET.pad_values)
    ]


def test_microbatches_are_global_arrays_split_over_the_data_axis(meshes):
    mesh = meshes[8]
    assert mesh.shape[DATA_AXIS] == NUM_DEVICES
    (microbatch,) = sharded_microbatches(lot_of(range(10)), mesh)
    for values in microbatch.values():
        assert values.shape[0] == PHYSICAL_BATCH_SIZE
        assert values.sharding == batch_sharding(mesh)
        assert len(values.addressable_shards) == NUM_DEVICES
        assert {shard.data.shape[0] for shard in values.addressable_shards} == {2}
    np.testing.assert_array_equal(
        np.asarray(microbatch["input_ids"])[:10], lot_of(range(10)).batch["input_ids"]
    )


def test_batch_not_divisible_by_devices_is_an_error(meshes):
    with pytest.raises(ValueError, match=r"physical_batch_size = 12 .* 8 devices"):
        check_physical_batch_size(12, meshes[8])
    (microbatch,) = to_microbatches(lot_of(range(5)), 12)
    with pytest.raises(ValueError, match="physical_batch_size = 12"):
        shard_microbatch(microbatch, meshes[8])


def test_sharded_step_equals_one_device_step_for_the_same_key(meshes, steps):
    params = init_params()
    lot = lot_of(np.random.default_rng(0).choice(len(DATASET), 37, replace=False))
    key = jax.random.key(42)
    updated = {}
    for count in (8, 1):
        microbatches = sharded_microbatches(lot, meshes[count])
        assert len(microbatches) == 3
        updated[count] = sgd(params, training.lot_gradient(steps[count], params, microbatches, key))
    chex.assert_trees_all_close(updated[8], updated[1], rtol=1e-6, atol=1e-7)
    # The update is not noise alone: the clipped gradients moved the params.
    noise_only = sgd(params, training.lot_gradient(steps[1], params, [], key))
    assert not np.allclose(updated[1]["w"], noise_only["w"], rtol=0, atol=1e-6)


def test_masked_rows_change_the_gradient_sum_by_exactly_zero(meshes, steps):
    params = init_params()
    step, mesh = steps[8], meshes[8]
    (microbatch,) = to_microbatches(lot_of(range(11)), PHYSICAL_BATCH_SIZE)
    assert microbatch[MASK].sum() == 11
    # Same rows, but the 5 masked rows now hold real examples: still masked out.
    filled = {name: values.copy() for name, values in microbatch.items()}
    donor = lot_of(range(50, 55)).batch
    for name, values in donor.items():
        filled[name][11:] = values

    def grad_sum(batch):
        state = core.init_accumulator(params)
        key = jax.random.key(0)
        state, _ = step.add_microbatch(state, params, {}, shard_microbatch(batch, mesh), key)
        return jax.device_get(state)

    padded, with_donors = grad_sum(microbatch), grad_sum(filled)
    for a, b in zip(jax.tree.leaves(padded), jax.tree.leaves(with_donors), strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(padded.num_examples) == 11
    # And it is the clipped sum of the 11 real examples alone.
    unpadded, _, _ = core.private_grad_sum(
        loss_fn, params, lot_of(range(11)).batch, jnp.ones(11), l2_clip=L2_CLIP
    )
    chex.assert_trees_all_close(padded.grad_sum, unpadded, rtol=1e-5, atol=1e-7)


def test_sharded_noise_std_is_sigma_c_not_sigma_c_sqrt_devices(meshes):
    """Zero gradients: the release is pure noise / L; its std must be σC / L."""
    num_noise = 2**18

    def zero_grad_loss(params, example):
        return 0.0 * params["big"][0] * example["input_length"]

    params = {"big": jnp.zeros((num_noise,))}
    step = make_dp_lot_step(
        zero_grad_loss,
        meshes[8],
        l2_clip=L2_CLIP,
        noise_multiplier=NOISE_MULTIPLIER,
        expected_lot_size=EXPECTED_LOT_SIZE,
    )
    microbatches = sharded_microbatches(lot_of(range(20)), meshes[8])
    released = training.lot_gradient(step, params, microbatches, jax.random.key(3))
    noise = np.asarray(released["big"], np.float64) * EXPECTED_LOT_SIZE
    stddev = NOISE_MULTIPLIER * L2_CLIP
    # sum(x^2) / s^2 ~ chi2(n) for zero-mean normal noise of std s; alpha = 1e-6.
    alpha = 1e-6
    low, high = stats.chi2.ppf(alpha / 2, num_noise), stats.chi2.isf(alpha / 2, num_noise)
    assert low < np.sum(noise**2) / stddev**2 < high
    # The same interval rejects the per-device-noise bug (std σC·√8).
    assert not low < np.sum(noise**2) / (stddev**2 * NUM_DEVICES) < high
    assert abs(np.mean(noise)) < 5 * stddev / np.sqrt(num_noise)


def test_empty_lot_still_steps_and_only_noise_moves_params(meshes, steps):
    # Find an empty Poisson lot (q = 1/100 on 100 examples: ~37% of lots).
    lots = PoissonLots(DATASET, 1, seed=0)
    lot = next(lot for lot in lots if len(lot.indices) == 0)
    microbatches = sharded_microbatches(lot, meshes[8])
    assert microbatches == []
    params = init_params()
    key = jax.random.key(9)
    updated = sgd(params, training.lot_gradient(steps[8], params, microbatches, key))
    noise = core.add_gaussian_noise(
        jax.tree.map(jnp.zeros_like, params), NOISE_MULTIPLIER * L2_CLIP, key
    )
    expected = sgd(params, jax.tree.map(lambda n: n / EXPECTED_LOT_SIZE, noise))
    chex.assert_trees_all_close(updated, expected, rtol=1e-6, atol=1e-8)
    assert not np.allclose(updated["embed"], params["embed"])

    noiseless = make_dp_lot_step(
        loss_fn, meshes[8], l2_clip=L2_CLIP, noise_multiplier=0.0, expected_lot_size=40
    )
    unchanged = sgd(params, training.lot_gradient(noiseless, params, [], key))
    chex.assert_trees_all_equal(unchanged, params)


def test_secure_noise_mode_reaches_the_sharded_step(meshes):
    """StepPrivacy(noise_mode="secure"): the step's noise is the core's secure noise, drawn once."""
    step = training.make_lot_step(
        lambda params, example, _: loss_fn(params, example),
        optax.identity(),
        training.StepPrivacy(True, L2_CLIP, NOISE_MULTIPLIER, EXPECTED_LOT_SIZE, "secure"),
        meshes[8],
    )
    params, key = init_params(), jax.random.key(9)
    released = training.lot_gradient(step, params, [], key)
    noise = core.add_gaussian_noise(
        jax.tree.map(jnp.zeros_like, params),
        NOISE_MULTIPLIER * L2_CLIP,
        key,
        noise_mode="secure",
        l2_sensitivity=L2_CLIP,
    )
    expected = jax.tree.map(lambda n: n / EXPECTED_LOT_SIZE, noise)
    chex.assert_trees_all_close(released, expected, rtol=1e-6, atol=0)
    size = sum(leaf.size for leaf in jax.tree.leaves(params))
    grid = core.secure_noise.secure_grid(size, NOISE_MULTIPLIER * L2_CLIP, L2_CLIP).grid
    steps = np.asarray(noise["embed"], np.float64) / grid  # On the grid: not float draws.
    np.testing.assert_array_equal(steps, np.round(steps))


def test_device_lots_delivers_each_lot_as_sharded_microbatches(meshes):
    mesh = meshes[8]
    reference = itertools.islice(PoissonLots(DATASET, 20, seed=4), 4)
    source = PoissonLots(DATASET, 20, seed=4)
    with device_lots(source, mesh, PHYSICAL_BATCH_SIZE, pad_values=DATASET.pad_values) as lots:
        for lot in reference:
            expected = to_microbatches(lot, PHYSICAL_BATCH_SIZE, pad_values=DATASET.pad_values)
            delivered = next(lots)
            assert len(delivered) == len(expected)
            for got, want in zip(delivered, expected, strict=True):
                assert got.keys() == want.keys()
                for name, values in got.items():
                    assert values.sharding == batch_sharding(mesh)
                    np.testing.assert_array_equal(np.asarray(values), want[name])
    with pytest.raises(ValueError, match="physical_batch_size = 12"):
        device_lots(source, mesh, 12)
