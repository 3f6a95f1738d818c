"""Splits a lot of any size into fixed-shape, masked physical micro-batches."""

import math
from collections.abc import Mapping

import numpy as np

from dpnmt.bridge.lots import Lot

MASK = "mask"
EXAMPLE_INDEX = "example_index"
PADDING_INDEX = -1


def to_microbatches(
    lot: Lot,
    physical_batch_size: int,
    *,
    pad_values: Mapping[str, int | float] | None = None,
) -> list[dict[str, np.ndarray]]:
    """Splits a lot of n examples into ceil(n / b) micro-batches of exactly b rows.

    Every example of the lot lands in exactly one row of one micro-batch, in lot
    order. The last micro-batch is filled up with padding rows: mask 0, every
    field set to its pad value, never a copy of a real example. An empty lot
    gives an empty list (the step still applies a noise-only update).

    Args:
      lot: the sampled examples (`Lot.batch` fields are `[n, ...]`).
      physical_batch_size: b, rows per micro-batch (what fits in memory at once).
      pad_values: field name -> fill value for padding rows (e.g.
        `TokenizedExamples.pad_values`); fields not named are filled with 0.

    Returns:
      A list of ceil(n / b) dicts, each with every lot field as `[b, ...]`,
      `mask` `[b]` float32 (1 = real example, 0 = padding) and `example_index`
      `[b]` int32 (dataset position; -1 on padding rows).

    Raises:
      ValueError: `physical_batch_size` is not positive, a lot field uses a
        reserved name (`mask`, `example_index`), or `pad_values` names a field
        the lot does not have.
    """
    if int(physical_batch_size) != physical_batch_size or physical_batch_size <= 0:
        raise ValueError(f"physical_batch_size = {physical_batch_size} must be a positive integer.")
    reserved = {MASK, EXAMPLE_INDEX} & set(lot.batch)
    if reserved:
        raise ValueError(f"lot fields {sorted(reserved)} clash with names to_microbatches adds.")
    if lot.indices.size and lot.indices.max() > np.iinfo(np.int32).max:
        raise ValueError("example indices exceed int32; shard the dataset below 2**31 rows.")
    pad_values = dict(pad_values or {})
    unknown = set(pad_values) - set(lot.batch)
    if unknown:
        raise ValueError(
            f"pad_values names fields {sorted(unknown)} that the lot does not have "
            f"(fields: {sorted(lot.batch)})."
        )
    num_examples = lot.indices.shape[0]
    num_microbatches = math.ceil(num_examples / physical_batch_size)
    padded_size = num_microbatches * physical_batch_size
    num_padding = padded_size - num_examples

    def padded(values: np.ndarray, fill: int | float) -> np.ndarray:
        padding = np.full((num_padding, *values.shape[1:]), fill, dtype=values.dtype)
        return np.concatenate([values, padding])

    fields = {name: padded(values, pad_values.get(name, 0)) for name, values in lot.batch.items()}
    fields[MASK] = padded(np.ones(num_examples, np.float32), 0.0)
    fields[EXAMPLE_INDEX] = padded(lot.indices.astype(np.int32), PADDING_INDEX)
    return [
        {name: values[start : start + physical_batch_size] for name, values in fields.items()}
        for start in range(0, padded_size, physical_batch_size)
    ]
