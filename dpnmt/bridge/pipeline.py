"""Lots to device: split, shard and prefetch in one background pipeline."""

from collections.abc import Iterable, Mapping

import jax
import torch.utils.data
from jax.sharding import Mesh

from dpnmt.bridge.lots import Lot
from dpnmt.bridge.microbatch import to_microbatches
from dpnmt.bridge.prefetch import Prefetcher
from dpnmt.bridge.process_rows import shard_fetched_microbatch
from dpnmt.bridge.sharding import check_physical_batch_size, shard_microbatch


def device_lots(
    source: Iterable[Lot],
    mesh: Mesh,
    physical_batch_size: int,
    *,
    pad_values: Mapping[str, int | float] | None = None,
    depth: int = 2,
    rows_from: torch.utils.data.Dataset | None = None,
) -> Prefetcher[list[dict[str, jax.Array]]]:
    """Prefetches each lot as its list of sharded micro-batches.

    In a background thread, every lot from `source` goes through
    `to_microbatches` and `shard_microbatch`, up to `depth` lots ahead of the
    step. An empty lot arrives as an empty list: still take the step (noise
    only). `state_dict()` of the result resumes after the last lot consumed.

    Args:
      source: a lot source (`PoissonLots`, `ShuffledLots`).
      mesh: the data mesh.
      physical_batch_size: b, rows per micro-batch; a multiple of the devices.
      pad_values: fill values of padding rows (`TokenizedExamples.pad_values`).
      depth: lots kept ready ahead, >= 1.
      rows_from: None if `source`'s lots carry their fields; else the dataset
        this process fetches ITS rows of each micro-batch from (`source` then
        samples an `IndexOnly` view of it), as multi-process runs do.

    Returns:
      A `Prefetcher`; close it (or use `with`) when done.

    Raises:
      ValueError: b is not a positive multiple of the mesh's data devices
        (checked here, before the thread starts).
    """
    check_physical_batch_size(physical_batch_size, mesh)

    def to_device(lot: Lot) -> list[dict[str, jax.Array]]:
        if rows_from is not None:  # Index-only lot: fetch this process's rows only.
            microbatches = to_microbatches(lot, physical_batch_size)
            return [
                shard_fetched_microbatch(microbatch, mesh, rows_from, pad_values)
                for microbatch in microbatches
            ]
        microbatches = to_microbatches(lot, physical_batch_size, pad_values=pad_values)
        return [shard_microbatch(microbatch, mesh) for microbatch in microbatches]

    return Prefetcher(source, transform=to_device, depth=depth)
