"""Per-process loading: lots carry indices only; each process fetches its own rows.

In a multi-process run every process draws the same lot (the same example
indices, from one shared secret seed) and splits it into the same masked
micro-batches, but a process only needs the rows its devices hold. The lot
source samples over an `IndexOnly` view of the dataset, and
`shard_fetched_microbatch` gathers this process's rows from the real dataset
just before placing them on the global mesh. On one process that is every row:
the same arrays as fetching the whole lot.
"""

from collections.abc import Mapping, Sequence

import jax
import numpy as np
import torch.utils.data
from jax.sharding import Mesh

from dpnmt.bridge.buckets import crop_to_shape
from dpnmt.bridge.dataset import INDEX, ExampleBlock
from dpnmt.bridge.microbatch import EXAMPLE_INDEX, MASK
from dpnmt.bridge.sharding import local_rows, place_local_rows


class IndexOnly(torch.utils.data.Dataset):
    """A dataset's example indices without their fields (for sampling lots).

    Lot sources (`PoissonLots`, `ShuffledLots`) over this view draw exactly the
    lots they would draw over `dataset` (they only see its length), but their
    `Lot`s hold `indices` and no fields: nothing is loaded until a process
    fetches its own rows.
    """

    def __init__(self, dataset: torch.utils.data.Dataset):
        """Wraps `dataset` (anything with `__len__`)."""
        self._length = len(dataset)

    def __len__(self) -> int:
        """N, the wrapped dataset's size."""
        return self._length

    def __getitem__(self, index: int) -> dict[str, np.int64]:
        """`{"index": index}`."""
        return {INDEX: np.int64(index)}

    def __getitems__(self, indices: Sequence[int]) -> ExampleBlock:
        """The indices as an `ExampleBlock` with no fields."""
        return ExampleBlock(np.asarray(indices, dtype=np.int64).reshape(-1), {})

    def field_specs(self) -> dict:
        """No fields."""
        return {}


def shard_fetched_microbatch(
    microbatch: Mapping[str, np.ndarray],
    mesh: Mesh,
    dataset: torch.utils.data.Dataset,
    pad_values: Mapping[str, int | float] | None = None,
    bucket_shape: tuple[int, int] | None = None,
) -> dict[str, jax.Array]:
    """Fetches this process's rows of an index-only micro-batch and shards them.

    Args:
      microbatch: `mask` `[b]` and `example_index` `[b]` (from `to_microbatches`
        of an `IndexOnly` lot; padding rows have mask 0, index -1).
      mesh: the global data mesh.
      dataset: the real examples: `__getitems__` returning an `ExampleBlock`
        and `field_specs()` (e.g. `TokenizedExamples`).
      pad_values: fill value per field for padding rows (default 0).
      bucket_shape: `(source, target)` tokens to crop the token fields to (its length
        bucket, `buckets.crop_to_shape`); None keeps the dataset's max lengths.
        Every process must pass the same shape.

    Returns:
      Field name -> global `[b, ...]` `jax.Array` sharded `P('data')`: every
      dataset field, `mask` and `example_index`, as `shard_microbatch` gives
      for the fully loaded micro-batch (cropped to `bucket_shape`).

    Raises:
      ValueError: b is not a multiple of the devices, a row is marked real
        but has no valid index, or a row is longer than `bucket_shape`.
    """
    mask, indices = microbatch[MASK], microbatch[EXAMPLE_INDEX]
    physical_batch_size = mask.shape[0]
    rows = local_rows(mesh, physical_batch_size)
    local_mask, local_indices = mask[rows], indices[rows]
    real = local_mask != 0
    if np.any(local_indices[real] < 0):
        raise ValueError("a micro-batch row is marked real but has no example index.")
    block = dataset.__getitems__(local_indices[real].tolist())
    pad_values = dict(pad_values or {})
    local = {MASK: local_mask, EXAMPLE_INDEX: local_indices}
    for name, (shape, dtype) in dataset.field_specs().items():
        values = np.full((local_mask.shape[0], *shape), pad_values.get(name, 0), dtype=dtype)
        values[real] = block.fields[name]
        local[name] = values
    if bucket_shape is not None:
        local = crop_to_shape(local, bucket_shape)
    return place_local_rows(local, mesh, physical_batch_size)
