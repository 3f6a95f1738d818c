import numpy as np
import pytest
import torch.utils.data

from dpnmt.bridge import TokenizedExamples
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
