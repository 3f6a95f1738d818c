"""Poisson lots of groups (dp.unit="group") and their release's sensitivity.

The sampler: whole groups or nothing, at most k rows each, no example twice,
the rate q (binomial tolerance), a uniform k-subset of a larger group, draws
that follow the secret seed and resume exactly. The step: through
`device_lots` (whole groups per micro-batch, 8 CPU devices) and the training
step with `group_cap`, the noiseless release is Σ_g clip_C(Σ_j ∇ℓ_gj) / L, and
removing one whole group moves the lot's sum by at most C.
"""

import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import stats

from dpnmt import training
from dpnmt.bridge import (
    EXAMPLE_INDEX,
    MASK,
    GroupLot,
    PoissonGroupLots,
    device_lots,
    group_microbatch_rows,
    make_data_mesh,
    to_group_microbatches,
)
from tests.bridge.helpers import MAX_SOURCE_LENGTH, VOCAB_SIZE, random_pairs

# 100 examples in 17 groups of 5 or 6 rows (labels 0..16), and 3 big ones of 12.
GROUPS = [*(i % 17 for i in range(64)), *(17 + i // 12 for i in range(36))]
CAP = 4
L_GROUPS = 5


def _lots(seed, count, **kwargs):
    source = PoissonGroupLots(GROUPS, L_GROUPS, CAP, seed=seed, **kwargs)
    return list(itertools.islice(iter(source), count))


def _members():
    members = {}
    for index, label in enumerate(GROUPS):
        members.setdefault(label, set()).add(index)
    return members


def test_a_lot_holds_whole_groups_capped_at_k_and_no_example_twice():
    members, label_of = _members(), dict(enumerate(GROUPS))
    for lot in _lots(seed=3, count=200):
        assert lot.indices.shape[1] == CAP and not any(c.isdigit() for c in repr(lot))
        rows = lot.indices[lot.indices >= 0]
        assert len(set(rows.tolist())) == rows.size  # No example twice.
        for slots in lot.indices:
            real = slots[slots >= 0]
            group = {label_of[i] for i in real.tolist()}
            assert len(group) == 1  # One slot row = one group, never mixed.
            (label,) = group
            everyone = members[label]
            # Wholly sampled (capped at k), never a part of a small group.
            assert real.size == min(CAP, len(everyone)) and set(real.tolist()) <= everyone
            assert np.all(slots[real.size :] == -1)  # Unused slots after the rows.
        labels = [label_of[int(s[0])] for s in lot.indices]
        assert len(set(labels)) == len(labels)  # A group at most once per lot.


def test_groups_join_at_rate_q_and_big_groups_keep_a_uniform_k_subset():
    lots, num_groups = _lots(seed=11, count=2000), 20
    q = L_GROUPS / num_groups
    joined = sum(lot.indices.shape[0] for lot in lots)
    trials = len(lots) * num_groups
    # Binomial(trials, q): a 5-sigma band (fixed seed).
    assert abs(joined - trials * q) <= 5 * np.sqrt(trials * q * (1 - q))
    # Group 17 (rows 64..75, 12 rows > k): each row kept with probability k / 12.
    counts = np.zeros(12)
    sampled = 0
    for lot in lots:
        for slots in lot.indices:
            if 64 <= slots[0] < 76:
                sampled += 1
                counts[slots[slots >= 0] - 64] += 1
    assert sampled > 300
    assert stats.chisquare(counts).pvalue > 1e-4  # Uniform over the 12 rows.
    assert counts.sum() == sampled * CAP


def test_draws_follow_the_secret_seed_and_resume_exactly():
    same = _lots(seed=5, count=30)
    assert all(
        np.array_equal(a.indices, b.indices) for a, b in zip(same, _lots(5, 30), strict=True)
    )
    other = _lots(seed=5 + 2**100, count=30)  # Differs only above bit 64: every bit counts.
    assert any(
        a.indices.shape != b.indices.shape or np.any(a.indices != b.indices)
        for a, b in zip(same, other, strict=True)
    )
    # A big group's k rows are drawn afresh each time (not its first k rows).
    subsets = {tuple(s) for lot in _lots(5, 200) for s in lot.indices if 64 <= s[0] < 76}
    assert len(subsets) > 10
    source = PoissonGroupLots(GROUPS, L_GROUPS, CAP, seed=5)
    list(itertools.islice(iter(source), 10))
    state = json.loads(json.dumps(source.state_dict()))  # As private/ stores it.
    resumed = PoissonGroupLots(GROUPS, L_GROUPS, CAP, seed=999)
    resumed.load_state_dict(state)
    tail = list(itertools.islice(iter(resumed), 20))
    assert all(np.array_equal(a.indices, b.indices) for a, b in zip(same[10:], tail, strict=True))
    with pytest.raises(ValueError, match="group_cap"):
        PoissonGroupLots(GROUPS, L_GROUPS, CAP + 1, seed=5).load_state_dict(state)


def test_secure_lots_need_no_seed_and_keep_the_rules():
    for lot in _lots(seed=None, count=20, secure_rng=True):
        rows = lot.indices[lot.indices >= 0]
        assert len(set(rows.tolist())) == rows.size
    with pytest.raises(ValueError, match="needs seed"):
        PoissonGroupLots(GROUPS, L_GROUPS, CAP)
    with pytest.raises(ValueError, match="must be smaller"):
        PoissonGroupLots(GROUPS, 20, CAP, seed=1)


def test_group_microbatches_hold_whole_groups_and_padding_is_marked():
    lot = GroupLot(np.array([[3, 4, -1], [7, -1, -1], [9, 10, 11]]))
    micros = to_group_microbatches(lot, 6)
    assert len(micros) == 2
    np.testing.assert_array_equal(micros[0][EXAMPLE_INDEX], [3, 4, -1, 7, -1, -1])
    np.testing.assert_array_equal(micros[0][MASK], [1, 1, 0, 1, 0, 0])
    np.testing.assert_array_equal(micros[1][EXAMPLE_INDEX], [9, 10, 11, -1, -1, -1])
    assert to_group_microbatches(GroupLot(np.zeros((0, 3), np.int64)), 6) == []
    with pytest.raises(ValueError, match="multiple of the group cap k = 3"):
        to_group_microbatches(lot, 8)
    assert group_microbatch_rows(8, 3, 8) == 24 and group_microbatch_rows(16, 4, 8) == 16


# --- the release's sensitivity ------------------------------------------------

L2_CLIP = 0.05
DATASET = random_pairs(100, seed=5)


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


def _direct_sum(params, lot):
    """Σ_g clip_C(Σ_j ∇ℓ_gj), one group at a time (no vmap, no mask, no mesh)."""
    total = np.zeros_like(_flat(params))
    for slots in lot.indices:
        grad = np.zeros_like(total)
        for index in slots[slots >= 0]:
            example = {k: v for k, v in DATASET[int(index)].items() if k != "index"}
            grad += _flat(jax.grad(loss_fn)(params, example))
        total += grad * min(1.0, L2_CLIP / np.linalg.norm(grad))
    return total


@pytest.fixture(scope="module")
def mesh_and_params():
    assert len(jax.devices()) == 8, "tests/conftest.py should force 8 CPU devices"
    return make_data_mesh(), _params()


def _step(mesh):
    return training.make_lot_step(
        lambda params, example, _: loss_fn(params, example),
        optax.identity(),
        training.StepPrivacy(True, L2_CLIP, 0.0, L_GROUPS),
        mesh,
        clipping="vmap",
        group_cap=CAP,
    )


def _lot_sum(step, mesh, params, lots):
    """The noiseless released lot gradient × L of each lot, through device_lots."""
    rows = group_microbatch_rows(8, CAP, 8)
    with device_lots(lots, mesh, rows, pad_values=DATASET.pad_values, rows_from=DATASET) as it:
        return [
            _flat(training.lot_gradient(step, params, next(it), jax.random.key(0))) * L_GROUPS
            for _ in lots
        ]


def test_noiseless_group_release_is_the_clipped_group_sum_over_l(mesh_and_params):
    mesh, params = mesh_and_params
    lots = [lot for lot in _lots(seed=8, count=6) if lot.indices.shape[0]][:2]
    lots.append(GroupLot(np.zeros((0, CAP), np.int64)))  # Empty lot: zero (noise only).
    step = _step(mesh)
    for lot, released in zip(lots, _lot_sum(step, mesh, params, lots), strict=True):
        np.testing.assert_allclose(released, _direct_sum(params, lot), rtol=2e-5, atol=1e-7)


def test_removing_one_whole_group_moves_the_lot_sum_by_at_most_c(mesh_and_params):
    mesh, params = mesh_and_params
    # 9 groups, 2 per micro-batch of 8 rows (5 micro-batches, the last half padding):
    # small groups, full ones, and padding slots.
    lot = GroupLot(
        np.array(
            [
                [0, 17, 34, 51],
                [1, 18, 35, -1],
                [64, 65, 66, 67],
                [76, 77, 78, 79],
                [2, -1, -1, -1],
                [88, 89, 90, 91],
                [3, 20, 37, 54],
                [5, 22, -1, -1],
                [99, -1, -1, -1],
            ]
        )
    )
    neighbours = [GroupLot(np.delete(lot.indices, g, axis=0)) for g in (0, 2, 5, 8)]
    full, *rest = _lot_sum(_step(mesh), mesh, params, [lot, *neighbours])
    for neighbour in rest:
        distance = np.linalg.norm(full - neighbour)
        assert 0 < distance <= L2_CLIP * (1 + 1e-5)
