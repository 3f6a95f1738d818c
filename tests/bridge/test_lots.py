import itertools
import json

import numpy as np
import pytest
from scipy import stats

from dpnmt.bridge import (
    IndexOnly,
    LotCollator,
    PoissonLots,
    Prefetcher,
    ShuffledLots,
    lot_sampling_rate,
    to_microbatches,
    validate_sampling_rate,
)
from tests.bridge.helpers import MAX_SOURCE_LENGTH, MAX_TARGET_LENGTH, random_pairs


def take(source, count):
    return list(itertools.islice(iter(source), count))


def assert_same_lots(lots_a, lots_b):
    assert len(lots_a) == len(lots_b)
    for lot_a, lot_b in zip(lots_a, lots_b, strict=True):
        np.testing.assert_array_equal(lot_a.indices, lot_b.indices)
        assert lot_a.batch.keys() == lot_b.batch.keys()
        for name in lot_a.batch:
            np.testing.assert_array_equal(lot_a.batch[name], lot_b.batch[name])


# --- validation --------------------------------------------------------------


def test_sampling_rate_is_lot_size_over_dataset_size():
    assert lot_sampling_rate(1000, 10) == 0.01
    source = PoissonLots(random_pairs(50), 5, seed=0)
    assert source.sampling_rate == 0.1
    assert source.expected_lot_size == 5
    assert source.num_steps_per_epoch == 10


@pytest.mark.parametrize(
    "num_examples, lot_size, message",
    [
        (0, 4, r"dataset is empty \(N = 0\)"),
        (10, 10, r"L = 10 must be smaller than the dataset size N = 10"),
        (10, 11, r"L = 11 must be smaller.*N = 10"),
        (10, 0, r"L = 0 must be a positive integer"),
        (10, -3, r"L = -3 must be a positive integer"),
        (10, 2.5, r"L = 2.5 must be a positive integer"),
    ],
)
def test_bad_lot_settings_are_errors_naming_the_values(num_examples, lot_size, message):
    with pytest.raises(ValueError, match=message):
        lot_sampling_rate(num_examples, lot_size)


@pytest.mark.parametrize("rate", [0.0, -0.1, 1.5, float("nan")])
def test_sampling_rate_outside_unit_interval_is_an_error(rate):
    with pytest.raises(ValueError, match=r"sampling rate q = .* is not in \(0, 1\]"):
        validate_sampling_rate(rate)


def test_sources_reject_lot_size_at_least_dataset_size():
    dataset = random_pairs(8)
    with pytest.raises(ValueError, match="L = 8 must be smaller than the dataset size N = 8"):
        PoissonLots(dataset, 8, seed=0)
    with pytest.raises(ValueError, match="L = 9 must be smaller"):
        ShuffledLots(dataset, 9, seed=0)


def test_poisson_needs_a_seed_or_secure_rng():
    dataset = random_pairs(8)
    with pytest.raises(ValueError, match="seed=<int>"):
        PoissonLots(dataset, 2)
    with pytest.raises(ValueError, match="not allowed with secure_rng"):
        PoissonLots(dataset, 2, seed=1, secure_rng=True)


@pytest.mark.parametrize("seed", [-1, 1.5, "7", True])
def test_bad_seeds_are_errors_naming_the_seed(seed):
    with pytest.raises(ValueError, match=r"seed = .* must be a non-negative integer"):
        PoissonLots(random_pairs(8), 2, seed=seed)
    with pytest.raises(ValueError, match=r"seed = .* must be a non-negative integer"):
        ShuffledLots(random_pairs(8), 2, seed=seed)


def test_secure_lots_come_from_the_os_and_restore_only_counters():
    first, second = (PoissonLots(random_pairs(50), 5, secure_rng=True) for _ in range(2))
    lots_first, lots_second = take(first, 20), take(second, 20)
    # 20 lots of Bernoulli(0.1) over 50 examples: equal by chance with p < 1e-100.
    assert any(
        not np.array_equal(a.indices, b.indices)
        for a, b in zip(lots_first, lots_second, strict=True)
    )
    state = json.loads(json.dumps(first.state_dict()))
    assert state["bit_generator_state"] is None and (state["epoch"], state["step"]) == (2, 0)
    second.load_state_dict(state)
    assert second.state_dict() == state


# --- seeds: every bit counts -------------------------------------------------

BASE_SEED = 0x5EED_1234_ABCD_0001


@pytest.mark.parametrize("bit", [0, 31, 32, 40, 62, 100, 200])
@pytest.mark.parametrize(
    "make",
    [
        lambda seed: PoissonLots(random_pairs(100), 10, seed=seed),
        lambda seed: ShuffledLots(random_pairs(100), 10, seed=seed),
    ],
    ids=["poisson", "shuffle"],
)
def test_seeds_differing_in_one_bit_draw_different_lots(make, bit):
    """torch's manual_seed kept 32 of 63 bits: seeds 2**40 apart drew the same lots."""
    lots = take(make(BASE_SEED), 10)
    other = take(make(BASE_SEED ^ (1 << bit)), 10)
    # Same lots by chance: at most 1 / (100! / (10!)^10) for shuffled, far less for Poisson.
    assert any(not np.array_equal(a.indices, b.indices) for a, b in zip(lots, other, strict=True))


def test_a_seed_draws_the_same_lots_in_every_process():
    """Multi-process runs rely on it: lots are a function of the seed alone.

    Fixed lots for a 128-bit seed, as any process (or a later session) draws
    them: no hidden per-process state (hash seeds, global generators). numpy
    keeps PCG64's raw stream and SeedSequence stable across versions.
    """
    seed = (1 << 127) + 12345
    lots = take(PoissonLots(IndexOnly(random_pairs(40)), 4, seed=seed), 4)
    assert [lot.indices.tolist() for lot in lots] == [
        [22, 33],
        [2, 18],
        [18],
        [1, 2, 9, 12, 17, 21, 22],
    ]


def test_lot_repr_hides_the_lot_size():
    lot = next(iter(PoissonLots(random_pairs(50), 5, seed=0)))
    assert "private" in repr(lot)
    assert str(len(lot.indices)) not in repr(lot)


# --- Poisson sampling --------------------------------------------------------


def test_poisson_inclusion_and_lot_sizes_are_binomial():
    num_examples, lot_size, num_lots = 200, 20, 2000
    q = lot_size / num_examples
    lots = take(PoissonLots(random_pairs(num_examples), lot_size, seed=7), num_lots)
    sizes = np.array([len(lot.indices) for lot in lots])
    counts = np.zeros(num_examples)
    for lot in lots:
        assert len(np.unique(lot.indices)) == len(lot.indices)  # no repeats within a lot
        counts[lot.indices] += 1

    # Per-example inclusion counts: independent Binomial(T, q). Under H0 their
    # standardized squares sum to ~chi2(N) (T q = 200, normal approximation).
    alpha = 1e-3
    z = (counts - num_lots * q) / np.sqrt(num_lots * q * (1 - q))
    statistic = float(np.sum(z**2))
    assert (
        stats.chi2.ppf(alpha / 2, num_examples)
        < statistic
        < stats.chi2.isf(alpha / 2, num_examples)
    )
    assert np.max(np.abs(z)) < 5.0

    # Lot sizes: i.i.d. Binomial(N, q). Chi-square goodness of fit over bins
    # with expected count >= 5 (tails pooled), alpha = 1e-3.
    support = np.arange(num_examples + 1)
    expected = num_lots * stats.binom.pmf(support, num_examples, q)
    low = support[np.argmax(expected >= 5)]
    high = support[len(expected) - 1 - np.argmax(expected[::-1] >= 5)]
    observed = np.array(
        [np.sum(sizes <= low)]
        + [np.sum(sizes == k) for k in range(low + 1, high)]
        + [np.sum(sizes >= high)]
    )
    expected_binned = np.concatenate(
        [[expected[: low + 1].sum()], expected[low + 1 : high], [expected[high:].sum()]]
    )
    assert stats.chisquare(observed, expected_binned).pvalue > alpha
    sd_of_mean = np.sqrt(num_examples * q * (1 - q) / num_lots)
    assert abs(sizes.mean() - lot_size) < 5 * sd_of_mean


def test_empty_poisson_lot_is_a_valid_lot_with_zero_microbatches():
    # q = 1/30: a lot is empty with probability (29/30)^30 ~ 0.36.
    lots = take(PoissonLots(random_pairs(30), 1, seed=0), 40)
    empty = [lot for lot in lots if len(lot.indices) == 0]
    assert empty, "expected some empty lots at q = 1/30"
    lot = empty[0]
    assert lot.indices.shape == (0,) and lot.indices.dtype == np.int64
    assert lot.batch["input_ids"].shape == (0, MAX_SOURCE_LENGTH)
    assert lot.batch["labels"].shape == (0, MAX_TARGET_LENGTH)
    assert lot.batch["input_length"].shape == (0,)
    assert all(values.dtype == np.int32 for values in lot.batch.values())
    assert to_microbatches(lot, 4) == []


def test_collator_stacks_examples_in_order():
    dataset = random_pairs(10)
    collate = LotCollator(dataset.field_specs())
    lot = collate([dataset[7], dataset[2]])
    np.testing.assert_array_equal(lot.indices, [7, 2])
    np.testing.assert_array_equal(lot.batch["labels"][0], dataset[7]["labels"])
    np.testing.assert_array_equal(lot.batch["input_ids"][1], dataset[2]["input_ids"])
    # The batched fetch (torch's __getitems__) gives the same lot.
    assert_same_lots([collate(dataset.__getitems__([7, 2]))], [lot])
    block = dataset.__getitems__([7, 2])
    assert_same_lots([collate(list(block))], [lot])


@pytest.mark.parametrize("empty", [[], "block"])
def test_collator_empty_input_keeps_field_shapes(empty):
    dataset = random_pairs(10)
    samples = dataset.__getitems__([]) if empty == "block" else empty
    lot = LotCollator(dataset.field_specs())(samples)
    assert lot.indices.shape == (0,)
    assert lot.batch["input_ids"].shape == (0, MAX_SOURCE_LENGTH)
    assert lot.batch["label_length"].shape == (0,)


# --- shuffled lots -----------------------------------------------------------


@pytest.mark.parametrize(
    "last_lot, expected_steps, expected_dropped", [("drop", 4, 2), ("smaller", 5, 0)]
)
def test_shuffled_epochs_cover_each_example_at_most_once(
    last_lot, expected_steps, expected_dropped
):
    dataset = random_pairs(22)
    source = ShuffledLots(dataset, 5, seed=3, last_lot=last_lot)
    assert source.num_steps_per_epoch == expected_steps
    assert source.num_dropped_per_epoch == expected_dropped
    assert source.expected_lot_size == 5
    epochs = []
    iterator = iter(source)
    for _ in range(3):
        lots = [next(iterator) for _ in range(expected_steps)]
        sizes = [len(lot.indices) for lot in lots]
        assert sizes[: 22 // 5] == [5] * (22 // 5)
        if last_lot == "smaller":
            assert sizes[-1] == 22 % 5
        indices = np.concatenate([lot.indices for lot in lots])
        assert len(np.unique(indices)) == len(indices) == 22 - expected_dropped
        epochs.append(indices)
    assert not np.array_equal(epochs[0], epochs[1])  # a fresh permutation each epoch


def test_shuffled_rejects_unknown_last_lot_policy():
    with pytest.raises(ValueError, match="last_lot = 'pad'"):
        ShuffledLots(random_pairs(10), 3, seed=0, last_lot="pad")


# --- save / restore ------------------------------------------------------------


def make_poisson(seed):
    return PoissonLots(random_pairs(50), 5, seed=seed)  # 10 lots per epoch


def make_shuffled(seed):
    return ShuffledLots(random_pairs(23), 5, seed=seed)  # 4 lots per epoch


def test_a_state_from_the_old_torch_sampler_is_refused_clearly():
    source = make_poisson(0)
    state = {**source.state_dict(), "bit_generator_state": None, "generator_state": [0] * 8}
    with pytest.raises(ValueError, match="older dpnmt"):
        source.load_state_dict(state)
    shuffled = make_shuffled(0)
    with pytest.raises(ValueError, match="older dpnmt"):
        shuffled.load_state_dict({**shuffled.state_dict(), "bit_generator_state": [1, 2]})


@pytest.mark.parametrize("make_source", [make_poisson, make_shuffled])
@pytest.mark.parametrize("consumed", [0, 3, 4, 10, 13])
def test_restored_state_continues_the_lot_sequence(make_source, consumed):
    reference = take(make_source(seed=(11 << 100) + 11), consumed + 12)
    source = make_source(seed=(11 << 100) + 11)
    iterator = iter(source)
    assert_same_lots([next(iterator) for _ in range(consumed)], reference[:consumed])
    # Round-trip through JSON, as the trainer saves it under private/.
    state = json.loads(json.dumps(source.state_dict()))
    resumed = make_source(seed=(1 << 130) + 5)  # a different seed: the state must win
    resumed.load_state_dict(state)
    assert_same_lots(take(resumed, 12), reference[consumed:])


def test_restoring_into_a_different_setup_is_an_error():
    state = make_poisson(0).state_dict()
    with pytest.raises(ValueError, match="expected_lot_size = 5 but this source has"):
        PoissonLots(random_pairs(50), 6, seed=0).load_state_dict(state)
    with pytest.raises(ValueError, match="sampling_scheme"):
        make_shuffled(0).load_state_dict(state)


@pytest.mark.parametrize("make_source", [make_poisson, make_shuffled])
def test_prefetcher_state_is_after_the_last_consumed_lot(make_source):
    consumed = 6
    reference = take(make_source(seed=5), consumed + 8)
    with Prefetcher(make_source(seed=5), depth=3) as prefetcher:
        assert_same_lots([next(prefetcher) for _ in range(consumed)], reference[:consumed])
        state = prefetcher.state_dict()
    resumed = make_source(seed=0)
    resumed.load_state_dict(state)
    assert_same_lots(take(resumed, 8), reference[consumed:])
