import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpnmt.bridge import EXAMPLE_INDEX, MASK, PADDING_INDEX, LotCollator, to_microbatches
from tests.bridge.helpers import random_pairs

DATASET = random_pairs(64, seed=1)
COLLATE = LotCollator(DATASET.field_specs())


def lot_of(indices):
    return COLLATE([DATASET[int(i)] for i in indices])


@given(
    indices=st.lists(st.integers(0, len(DATASET) - 1), unique=True, max_size=40),
    physical_batch_size=st.integers(1, 17),
)
def test_every_example_appears_once_and_padding_is_never_a_real_example(
    indices, physical_batch_size
):
    lot = lot_of(indices)
    microbatches = to_microbatches(lot, physical_batch_size, pad_values=DATASET.pad_values)
    assert len(microbatches) == math.ceil(len(indices) / physical_batch_size)
    seen = []
    for microbatch in microbatches:
        assert set(microbatch) == set(lot.batch) | {MASK, EXAMPLE_INDEX}
        for name, values in microbatch.items():
            assert values.shape[0] == physical_batch_size, name
        for name in lot.batch:
            assert microbatch[name].shape[1:] == lot.batch[name].shape[1:]
            assert microbatch[name].dtype == lot.batch[name].dtype
        real = microbatch[MASK] == 1
        assert np.all((microbatch[MASK] == 0) | real)
        for row in np.flatnonzero(real):
            index = int(microbatch[EXAMPLE_INDEX][row])
            seen.append(index)
            for name, values in DATASET[index].items():
                if name != "index":
                    np.testing.assert_array_equal(microbatch[name][row], values)
        for row in np.flatnonzero(~real):
            assert microbatch[EXAMPLE_INDEX][row] == PADDING_INDEX
            for name, fill in DATASET.pad_values.items():
                assert np.all(microbatch[name][row] == fill), name
    assert seen == list(indices)  # each sampled example exactly once, in lot order
    assert sum(int(mb[MASK].sum()) for mb in microbatches) == len(indices)


def test_padding_rows_only_in_the_last_microbatch():
    microbatches = to_microbatches(lot_of(range(10)), 4)
    assert [int(mb[MASK].sum()) for mb in microbatches] == [4, 4, 2]


def test_empty_lot_gives_no_microbatches():
    assert to_microbatches(lot_of([]), 8) == []


@pytest.mark.parametrize("bad", [0, -1, 2.5])
def test_bad_physical_batch_size_is_an_error(bad):
    with pytest.raises(ValueError, match=f"physical_batch_size = {bad}"):
        to_microbatches(lot_of([1, 2]), bad)


def test_pad_values_for_unknown_fields_are_an_error():
    with pytest.raises(ValueError, match=r"pad_values names fields \['input_idz'\]"):
        to_microbatches(lot_of([1, 2]), 4, pad_values={"input_idz": 0})
