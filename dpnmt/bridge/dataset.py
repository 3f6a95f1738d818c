"""A torch `Dataset` view over tokenized translation pairs, padded to fixed lengths.

Truncation policy: the data layer (tokenization) truncates; this view never cuts
a row. A row longer than the fixed length it is padded to is an error naming the
row, its length and the limit, so no example is ever shortened silently here.
"""

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch.utils.data

INPUT_IDS = "input_ids"
INPUT_LENGTH = "input_length"
LABELS = "labels"
LABEL_LENGTH = "label_length"
INDEX = "index"

TOKEN_DTYPE = np.int32


def _pad_rows(
    rows: Sequence[Sequence[int] | np.ndarray],
    max_length: int,
    pad_id: int,
    name: str,
    row_indices: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Packs ragged token rows into a `[num_rows, max_length]` array.

    Args:
      rows: token id sequences, one per example.
      max_length: fixed length every row is padded to.
      pad_id: token id written after each row's end.
      name: field name, used in error messages.
      row_indices: `[num_rows]` example indices of the rows, for error messages
        (default: their positions).

    Returns:
      `(padded [num_rows, max_length] int32, lengths [num_rows] int32)`.

    Raises:
      ValueError: a row is longer than `max_length`.
    """
    lengths = np.fromiter((len(row) for row in rows), dtype=np.int64, count=len(rows))
    too_long = np.flatnonzero(lengths > max_length)
    if too_long.size:
        first = int(too_long[0])
        row = first if row_indices is None else int(row_indices[first])
        raise ValueError(
            f"{too_long.size} row(s) of {name} are longer than max length {max_length}; "
            f"first: row {row} has {int(lengths[first])} tokens. The bridge never "
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
        _check_max_lengths(max_source_length, max_target_length)
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
        return _pair_block(
            rows,
            (self._input_ids[rows], self._input_length[rows]),
            (self._labels[rows], self._label_length[rows]),
        )

    def lengths(self, indices: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """`([n] source, [n] target)` token counts of rows `indices` (for length buckets)."""
        rows = np.asarray(indices, dtype=np.int64).reshape(-1)
        return self._input_length[rows], self._label_length[rows]

    def field_specs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Per-example shape and dtype of every field except `index`."""
        return _field_specs(self._input_ids.shape[1], self._labels.shape[1])

    @property
    def pad_values(self) -> Mapping[str, int]:
        """Fill value per field for padding rows: `pad_id` for ids, 0 for lengths."""
        return _pad_values(self.pad_id)


class TokenizedOnDemand(torch.utils.data.Dataset):
    """Like `TokenizedExamples`, but each row is tokenized when it is fetched.

    A multi-process run samples lots over indices and each process fetches only
    its rows of each micro-batch, so with this view a process tokenizes only
    those rows, never the whole split. Fetched rows are the arrays
    `TokenizedExamples` would hold for the same ids.
    """

    def __init__(
        self,
        encode: Callable[[np.ndarray], tuple[Sequence[Sequence[int]], Sequence[Sequence[int]]]],
        num_examples: int,
        *,
        max_source_length: int,
        max_target_length: int,
        pad_id: int = 0,
    ):
        """Wraps an encoder of rows.

        Args:
          encode: `[n]` int64 row indices -> (source ids, target ids), one
            sequence per row, already truncated (e.g. `OnDemandSplit.encode`).
          num_examples: N, rows in the split.
          max_source_length: fixed length of `input_ids`, in tokens.
          max_target_length: fixed length of `labels`, in tokens.
          pad_id: token id used for padding.

        Raises:
          ValueError: no examples, or a non-positive max length.
        """
        if num_examples <= 0:
            raise ValueError(
                f"TokenizedOnDemand got {num_examples} examples; check the corpus path and filters."
            )
        _check_max_lengths(max_source_length, max_target_length)
        self._encode, self._num_examples = encode, int(num_examples)
        self._max_source_length, self._max_target_length = max_source_length, max_target_length
        self.pad_id = int(pad_id)

    def __len__(self) -> int:
        """Number of examples N."""
        return self._num_examples

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        """Example `index`, tokenized now (see `TokenizedExamples.__getitem__`)."""
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> ExampleBlock:
        """Examples `indices`, tokenized in one call and padded.

        Raises:
          IndexError: an index outside [0, N).
          ValueError: the encoder returned a row longer than its max length.
        """
        rows = np.asarray(indices, dtype=np.int64).reshape(-1)
        if rows.size and (rows.min() < 0 or rows.max() >= self._num_examples):
            raise IndexError(f"row indices must lie in [0, {self._num_examples}).")
        source_ids, target_ids = self._encode(rows)
        input_ids, input_length = _pad_rows(
            source_ids, self._max_source_length, self.pad_id, "source_ids", rows
        )
        labels, label_length = _pad_rows(
            target_ids, self._max_target_length, self.pad_id, "target_ids", rows
        )
        return _pair_block(rows, (input_ids, input_length), (labels, label_length))

    def field_specs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Per-example shape and dtype of every field except `index`."""
        return _field_specs(self._max_source_length, self._max_target_length)

    @property
    def pad_values(self) -> Mapping[str, int]:
        """Fill value per field for padding rows: `pad_id` for ids, 0 for lengths."""
        return _pad_values(self.pad_id)


def _check_max_lengths(max_source_length: int, max_target_length: int) -> None:
    for name, value in (
        ("max_source_length", max_source_length),
        ("max_target_length", max_target_length),
    ):
        if value <= 0:
            raise ValueError(f"{name} must be a positive number of tokens, got {value}.")


def _pair_block(rows: np.ndarray, source: tuple, target: tuple) -> ExampleBlock:
    """An `ExampleBlock` of `rows` from (ids, lengths) of each side."""
    (input_ids, input_length), (labels, label_length) = source, target
    return ExampleBlock(
        rows,
        {
            INPUT_IDS: input_ids,
            INPUT_LENGTH: input_length,
            LABELS: labels,
            LABEL_LENGTH: label_length,
        },
    )


def _field_specs(max_source_length: int, max_target_length: int) -> dict:
    token, length = np.dtype(TOKEN_DTYPE), np.dtype(TOKEN_DTYPE)
    return {
        INPUT_IDS: ((max_source_length,), token),
        INPUT_LENGTH: ((), length),
        LABELS: ((max_target_length,), token),
        LABEL_LENGTH: ((), length),
    }


def _pad_values(pad_id: int) -> dict[str, int]:
    return {INPUT_IDS: pad_id, INPUT_LENGTH: 0, LABELS: pad_id, LABEL_LENGTH: 0}
