"""A torch `Dataset` view over tokenized translation pairs, padded to fixed lengths.

Truncation policy: the data layer (tokenization) truncates; this view never cuts
a row. A row longer than the fixed length it is padded to is an error naming the
row, its length and the limit, so no example is ever shortened silently here.
"""

from collections.abc import Mapping, Sequence

import numpy as np
import torch.utils.data

INPUT_IDS = "input_ids"
INPUT_LENGTH = "input_length"
LABELS = "labels"
LABEL_LENGTH = "label_length"
INDEX = "index"

TOKEN_DTYPE = np.int32


def _pad_rows(
    rows: Sequence[Sequence[int] | np.ndarray], max_length: int, pad_id: int, name: str
) -> tuple[np.ndarray, np.ndarray]:
    """Packs ragged token rows into a `[num_rows, max_length]` array.

    Args:
      rows: token id sequences, one per example.
      max_length: fixed length every row is padded to.
      pad_id: token id written after each row's end.
      name: field name, used in error messages.

    Returns:
      `(padded [num_rows, max_length] int32, lengths [num_rows] int32)`.

    Raises:
      ValueError: a row is longer than `max_length`.
    """
    lengths = np.fromiter((len(row) for row in rows), dtype=np.int64, count=len(rows))
    too_long = np.flatnonzero(lengths > max_length)
    if too_long.size:
        first = int(too_long[0])
        raise ValueError(
            f"{too_long.size} row(s) of {name} are longer than max length {max_length}; "
            f"first: row {first} has {int(lengths[first])} tokens. The bridge never "
            "truncates: truncate in the data layer (tokenization) or raise the max length."
        )
    padded = np.full((len(rows), max_length), pad_id, dtype=TOKEN_DTYPE)
    for row_index, row in enumerate(rows):
        padded[row_index, : len(row)] = row
    return padded, lengths.astype(TOKEN_DTYPE)


class ExampleBlock(Sequence):
    """Several examples gathered at once: a sequence of per-example dicts.

    Returned by `TokenizedExamples.__getitems__` (torch's batched fetch). Any
    collate can treat it as a list of samples; `LotCollator` takes the stacked
    arrays directly instead of re-stacking row by row.

    Attributes:
      indices: `[n]` int64 dataset positions.
      fields: field name -> `[n, ...]` array, rows aligned with `indices`.
    """

    def __init__(self, indices: np.ndarray, fields: dict[str, np.ndarray]):
        """Wraps already-gathered rows."""
        self.indices = indices
        self.fields = fields

    def __len__(self) -> int:
        """Number of examples n."""
        return self.indices.shape[0]

    def __getitem__(self, position: int) -> dict[str, np.ndarray]:
        """The example at `position` in the block, as `TokenizedExamples` gives it."""
        example = {name: values[position] for name, values in self.fields.items()}
        example[INDEX] = self.indices[position]
        return example


class TokenizedExamples(torch.utils.data.Dataset):
    """Tokenized (source, target) pairs as fixed-length numpy examples.

    Each example is a dict of numpy values: `input_ids` `[max_source_length]`,
    `input_length` `[]`, `labels` `[max_target_length]`, `label_length` `[]`
    (all int32; ids padded with `pad_id` after each row's length) and `index`
    `[]` int64, the example's position in the dataset. The padded arrays are
    built once, so `dataset[i]` is a cheap row view.
    """

    def __init__(
        self,
        source_ids: Sequence[Sequence[int] | np.ndarray],
        target_ids: Sequence[Sequence[int] | np.ndarray],
        *,
        max_source_length: int,
        max_target_length: int,
        pad_id: int = 0,
    ):
        """Builds the padded view.

        Args:
          source_ids: source token ids, one sequence per example.
          target_ids: target token ids (the labels), one sequence per example.
          max_source_length: fixed length of `input_ids`, in tokens.
          max_target_length: fixed length of `labels`, in tokens.
          pad_id: token id used for padding.

        Raises:
          ValueError: no examples, source and target counts differ, a non-positive
            max length, or a row longer than its max length.
        """
        if len(source_ids) == 0:
            raise ValueError(
                "TokenizedExamples got an empty dataset (0 source rows); "
                "check the corpus path and filters."
            )
        if len(source_ids) != len(target_ids):
            raise ValueError(
                f"source_ids has {len(source_ids)} rows but target_ids has "
                f"{len(target_ids)}; they must be aligned pairs."
            )
        for name, value in (
            ("max_source_length", max_source_length),
            ("max_target_length", max_target_length),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be a positive number of tokens, got {value}.")
        self.pad_id = int(pad_id)
        self._input_ids, self._input_length = _pad_rows(
            source_ids, max_source_length, pad_id, "source_ids"
        )
        self._labels, self._label_length = _pad_rows(
            target_ids, max_target_length, pad_id, "target_ids"
        )

    def __len__(self) -> int:
        """Number of examples N."""
        return self._input_ids.shape[0]

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        """Example `index` as a dict of numpy values (see the class docstring)."""
        return {
            INDEX: np.int64(index),
            INPUT_IDS: self._input_ids[index],
            INPUT_LENGTH: self._input_length[index],
            LABELS: self._labels[index],
            LABEL_LENGTH: self._label_length[index],
        }

    def __getitems__(self, indices: Sequence[int]) -> ExampleBlock:
        """Examples `indices` gathered with one fancy index per field (fast path)."""
        rows = np.asarray(indices, dtype=np.int64).reshape(-1)
        return ExampleBlock(
            rows,
            {
                INPUT_IDS: self._input_ids[rows],
                INPUT_LENGTH: self._input_length[rows],
                LABELS: self._labels[rows],
                LABEL_LENGTH: self._label_length[rows],
            },
        )

    def field_specs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Per-example shape and dtype of every field except `index`."""
        return {
            INPUT_IDS: (self._input_ids.shape[1:], self._input_ids.dtype),
            INPUT_LENGTH: ((), self._input_length.dtype),
            LABELS: (self._labels.shape[1:], self._labels.dtype),
            LABEL_LENGTH: ((), self._label_length.dtype),
        }

    @property
    def pad_values(self) -> Mapping[str, int]:
        """Fill value per field for padding rows: `pad_id` for ids, 0 for lengths."""
        return {INPUT_IDS: self.pad_id, INPUT_LENGTH: 0, LABELS: self.pad_id, LABEL_LENGTH: 0}
