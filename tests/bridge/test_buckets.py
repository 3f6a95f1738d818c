"""Length buckets (`dpnmt.bridge.buckets`): the same lot, only padding removed.

Grouping by length permutes a lot's rows (each example exactly once, none
dropped, none copied); each micro-batch is cropped to the smallest bucket that
fits its rows, never cutting a token; padding rows stay masked; an empty lot
stays empty. Host-only checks plus `device_lots` on the 8-device mesh.
"""

import collections
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpnmt.bridge import (
    EXAMPLE_INDEX,
    MASK,
    PADDING_INDEX,
    IndexOnly,
    LengthBuckets,
    LotCollator,
    PoissonLots,
    TokenizedExamples,
    TokenizedOnDemand,
    device_lots,
    make_data_mesh,
    resolve_length_buckets,
)
from dpnmt.bridge.buckets import auto_lengths, parse_lengths
from dpnmt.bridge.dataset import INPUT_IDS, INPUT_LENGTH, LABEL_LENGTH, LABELS

MAX_SOURCE, MAX_TARGET, PAD = 24, 20, 1
BUCKETS = LengthBuckets.from_lengths((4, 8, 16, 24), MAX_SOURCE, MAX_TARGET)
PHYSICAL_BATCH = 8


def _pairs(num_examples, seed=0):
    """Random pairs, lengths 1..max, most short (like captions)."""
    rng = np.random.default_rng(seed)

    def rows(max_length):
        lengths = np.minimum(rng.geometric(0.15, num_examples), max_length)
        return [rng.integers(2, 50, n) for n in lengths]

    return TokenizedExamples(
        rows(MAX_SOURCE),
        rows(MAX_TARGET),
        max_source_length=MAX_SOURCE,
        max_target_length=MAX_TARGET,
        pad_id=PAD,
    )


DATASET = _pairs(300)


def _lot(indices):
    return LotCollator(DATASET.field_specs())(DATASET.__getitems__(list(indices)))


def test_shapes_are_joint_and_capped_per_side():
    assert BUCKETS.shapes == ((4, 4), (8, 8), (16, 16), (24, 20))
    rows = BUCKETS.row_buckets(np.array([1, 5, 4, 20, 3]), np.array([4, 2, 9, 1, 20]))
    np.testing.assert_array_equal(rows, [0, 1, 2, 3, 3])  # The smallest shape both sides fit.
    with pytest.raises(ValueError, match="longer than the largest length bucket"):
        BUCKETS.row_buckets(np.array([25]), np.array([1]))


@settings(max_examples=30)
@given(
    indices=st.lists(st.integers(0, len(DATASET) - 1), max_size=60, unique=True),
    physical_batch=st.sampled_from([1, 3, 8]),
)
def test_grouping_keeps_every_example_once_and_fits_each_microbatch(indices, physical_batch):
    lot = _lot(indices)
    source, target = DATASET.lengths(lot.indices)
    grouped, shapes = BUCKETS.group(lot, source, target, physical_batch)
    # Membership: a permutation of the lot (same examples, each once).
    assert sorted(grouped.indices.tolist()) == sorted(indices)
    assert len(shapes) == -(-len(indices) // physical_batch)  # ceil(n / b), as without buckets.
    for name, values in grouped.batch.items():  # Rows travel with their index.
        np.testing.assert_array_equal(values, DATASET.__getitems__(grouped.indices).fields[name])
    for number, (source_length, target_length) in enumerate(shapes):
        rows = slice(number * physical_batch, (number + 1) * physical_batch)
        assert grouped.batch[INPUT_LENGTH][rows].max() <= source_length
        assert grouped.batch[LABEL_LENGTH][rows].max() <= target_length
        # The smallest bucket that fits: the one below does not.
        smaller = [s for s in BUCKETS.shapes if s < (source_length, target_length)]
        if smaller:
            assert (
                grouped.batch[INPUT_LENGTH][rows].max() > smaller[-1][0]
                or grouped.batch[LABEL_LENGTH][rows].max() > smaller[-1][1]
            )


@pytest.fixture(scope="module")
def mesh():
    return make_data_mesh()  # 8 devices (tests/conftest.py).


@pytest.mark.parametrize("index_only", [False, True])
def test_device_lots_crop_padding_only_and_keep_membership(mesh, index_only):
    lots = PoissonLots(IndexOnly(DATASET) if index_only else DATASET, 40, seed=3)
    with device_lots(
        lots,
        mesh,
        PHYSICAL_BATCH,
        pad_values=DATASET.pad_values,
        rows_from=DATASET if index_only else None,
        length_buckets=BUCKETS,
    ) as prefetched:
        lot_microbatches = [next(prefetched) for _ in range(6)]
    reference = PoissonLots(DATASET, 40, seed=3)  # The same lots, drawn again.
    shapes_seen = set()
    for microbatches, lot in zip(lot_microbatches, reference, strict=False):
        seen = collections.Counter()
        for micro in microbatches:
            micro = {name: np.asarray(values) for name, values in micro.items()}
            shape = (micro[INPUT_IDS].shape[1], micro[LABELS].shape[1])
            assert shape in BUCKETS.shapes
            shapes_seen.add(shape)
            real = micro[MASK] != 0
            seen.update(micro[EXAMPLE_INDEX][real].tolist())
            # Padding rows: masked, no index, pad values only.
            assert np.all(micro[EXAMPLE_INDEX][~real] == PADDING_INDEX)
            assert np.all(micro[INPUT_IDS][~real] == PAD) and np.all(micro[LABELS][~real] == PAD)
            assert np.all(micro[INPUT_LENGTH][~real] == 0)
            # Real rows: the dataset row up to the shape; what was cut was padding.
            full = DATASET.__getitems__(micro[EXAMPLE_INDEX][real]).fields
            for name, length in ((INPUT_IDS, shape[0]), (LABELS, shape[1])):
                np.testing.assert_array_equal(micro[name][real], full[name][:, :length])
                assert np.all(full[name][:, length:] == PAD)
        assert max(seen.values(), default=1) == 1  # No example twice.
        assert sorted(seen) == sorted(lot.indices.tolist())  # None dropped, none added.
        assert len(microbatches) == -(-len(lot.indices) // PHYSICAL_BATCH)
    assert len(shapes_seen) >= 2  # Short micro-batches did get short shapes.


def test_an_empty_lot_stays_empty(mesh):
    """An empty Poisson lot gives no micro-batch (the loop still takes a noise-only step)."""
    lots = PoissonLots(DATASET, 1, seed=0)
    sizes = [len(lot.indices) for lot in itertools.islice(lots, 8)]
    assert 0 in sizes and any(sizes)  # q = 1/300: ~37% of lots are empty.
    lots = PoissonLots(IndexOnly(DATASET), 1, seed=0)  # The same lots.
    with device_lots(
        lots, mesh, PHYSICAL_BATCH, rows_from=DATASET, length_buckets=BUCKETS
    ) as prefetched:
        for size in sizes:
            assert len(next(prefetched)) == -(-size // PHYSICAL_BATCH)


def test_buckets_refuse_a_dataset_without_lengths(mesh):
    on_demand = TokenizedOnDemand(
        lambda rows: ([[2]] * len(rows), [[2]] * len(rows)),
        10,
        max_source_length=MAX_SOURCE,
        max_target_length=MAX_TARGET,
    )
    with pytest.raises(ValueError, match="length buckets need row lengths"):
        device_lots(
            PoissonLots(IndexOnly(on_demand), 4, seed=0),
            mesh,
            PHYSICAL_BATCH,
            rows_from=on_demand,
            length_buckets=BUCKETS,
        )


def test_parse_and_resolve():
    assert auto_lengths(48) == (16, 24, 40, 48) and auto_lengths(16) == (8, 16)
    assert parse_lengths("auto", 48, 32) == (16, 24, 40, 48)
    assert parse_lengths("none", 48, 48) == parse_lengths("", 48, 48) == ()
    assert parse_lengths("16, 32,64", 64, 40) == (16, 32, 64)
    for spec, message in (
        ("32,16,64", "strictly ascending"),
        ("0,64", "positive"),
        ("16,32", "must cover the max lengths"),
        ("short", "comma-separated"),
    ):
        with pytest.raises(ValueError, match=f"data.length_buckets=.*{message}"):
            parse_lengths(spec, 64, 40)
    assert resolve_length_buckets("none", 48, 48, lengths_known=True) is None
    assert resolve_length_buckets("auto", 48, 48, lengths_known=False) is None  # Per lot.
    with pytest.raises(ValueError, match="data.tokenize_train='upfront'"):
        resolve_length_buckets("16,48", 48, 48, lengths_known=False)
    assert resolve_length_buckets("16,48", 48, 40, lengths_known=True).shapes == (
        (16, 16),
        (48, 40),
    )
