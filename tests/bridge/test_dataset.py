import numpy as np
import pytest
import torch.utils.data

from dpnmt.bridge import TokenizedExamples, TokenizedOnDemand
from tests.bridge.helpers import PAD_ID, random_pairs


def test_examples_are_padded_numpy_rows_with_lengths():
    dataset = TokenizedExamples(
        [[5, 6, 7], [8]], [[9], [10, 11]], max_source_length=4, max_target_length=3, pad_id=0
    )
    assert isinstance(dataset, torch.utils.data.Dataset)
    assert len(dataset) == 2
    example = dataset[1]
    np.testing.assert_array_equal(example["input_ids"], [8, 0, 0, 0])
    np.testing.assert_array_equal(example["labels"], [10, 11, 0])
    assert example["input_length"] == 1 and example["label_length"] == 2
    assert example["index"] == 1
    assert example["input_ids"].dtype == np.int32
    specs = dataset.field_specs()
    assert specs["input_ids"] == ((4,), np.dtype(np.int32))
    assert specs["label_length"] == ((), np.dtype(np.int32))


def test_rows_keep_their_tokens_and_pad_after_length():
    dataset = random_pairs(40)
    for index in range(len(dataset)):
        example = dataset[index]
        length = example["input_length"]
        assert np.all(example["input_ids"][length:] == PAD_ID)
        assert np.all(example["input_ids"][:length] != PAD_ID)


def test_over_long_row_is_an_error_not_truncated():
    with pytest.raises(ValueError, match=r"row 1 has 5 tokens.*never\s+truncates"):
        TokenizedExamples(
            [[1], [1, 2, 3, 4, 5]], [[1], [1]], max_source_length=4, max_target_length=2
        )


def test_empty_and_misaligned_datasets_are_errors():
    with pytest.raises(ValueError, match="empty dataset"):
        TokenizedExamples([], [], max_source_length=4, max_target_length=4)
    with pytest.raises(ValueError, match="2 rows but target_ids has 1"):
        TokenizedExamples([[1], [2]], [[1]], max_source_length=4, max_target_length=4)
    with pytest.raises(ValueError, match="max_target_length must be a positive"):
        TokenizedExamples([[1]], [[1]], max_source_length=4, max_target_length=0)


class RecordingEncoder:
    """Encodes rows of fixed id lists (as `OnDemandSplit.encode` does) and records the asks."""

    def __init__(self, source, target):
        self.source, self.target, self.asked = source, target, []

    def __call__(self, rows):
        self.asked.append(rows.tolist())
        return [self.source[i] for i in rows], [self.target[i] for i in rows]


def _on_demand_twin(num_examples=30, seed=4):
    """(TokenizedExamples, TokenizedOnDemand, encoder) over the same random id lists."""
    rng = np.random.default_rng(seed)
    source = [rng.integers(2, 50, rng.integers(1, 7)).tolist() for _ in range(num_examples)]
    target = [rng.integers(2, 50, rng.integers(1, 6)).tolist() for _ in range(num_examples)]
    lengths = dict(max_source_length=6, max_target_length=5, pad_id=PAD_ID)
    encoder = RecordingEncoder(source, target)
    on_demand = TokenizedOnDemand(encoder, num_examples, **lengths)
    return TokenizedExamples(source, target, **lengths), on_demand, encoder


def test_on_demand_rows_equal_upfront_rows_and_only_asked_rows_are_encoded():
    upfront, on_demand, encoder = _on_demand_twin()
    assert len(on_demand) == len(upfront)
    assert on_demand.field_specs() == upfront.field_specs()
    assert on_demand.pad_values == upfront.pad_values
    rows = [29, 3, 3, 0, 17]
    got, want = on_demand.__getitems__(rows), upfront.__getitems__(rows)
    np.testing.assert_array_equal(got.indices, want.indices)
    assert set(got.fields) == set(want.fields)
    for name, values in want.fields.items():
        np.testing.assert_array_equal(got.fields[name], values)
        assert got.fields[name].dtype == values.dtype
    assert encoder.asked == [rows]
    for name, value in upfront[17].items():
        np.testing.assert_array_equal(on_demand[17][name], value)


def test_on_demand_empty_fetch_and_bad_rows():
    _, on_demand, encoder = _on_demand_twin()
    empty = on_demand.__getitems__([])
    assert len(empty) == 0 and empty.fields["input_ids"].shape == (0, 6)
    with pytest.raises(IndexError, match=r"\[0, 30\)"):
        on_demand.__getitems__([30])
    encoder.source[2] = [3] * 7  # An encoder that did not truncate: an error, never cut here.
    with pytest.raises(ValueError, match="longer than max length 6; first: row 2 has 7"):
        on_demand.__getitems__([5, 2])  # Named by its example index, not its position.
    with pytest.raises(ValueError, match="0 examples"):
        TokenizedOnDemand(encoder, 0, max_source_length=6, max_target_length=5)
