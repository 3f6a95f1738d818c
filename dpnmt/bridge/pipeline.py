"""Lots to device: group by length, split, shard and prefetch in one background pipeline."""

from collections.abc import Iterable, Mapping

import jax
import numpy as np
import torch.utils.data
from jax.sharding import Mesh

from dpnmt.bridge.buckets import LengthBuckets, crop_to_shape
from dpnmt.bridge.dataset import INPUT_LENGTH, LABEL_LENGTH
from dpnmt.bridge.group_lots import GroupLot, to_group_microbatches
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
    length_buckets: LengthBuckets | None = None,
) -> Prefetcher[list[dict[str, jax.Array]]]:
    """Prefetches each lot as its list of sharded micro-batches.

    In a background thread, every lot from `source` goes through
    `to_microbatches` and `shard_microbatch`, up to `depth` lots ahead of the
    step. An empty lot arrives as an empty list: still take the step (noise
    only). `state_dict()` of the result resumes after the last lot consumed.

    With `length_buckets`, the lot's rows are first grouped by length
    (`LengthBuckets.group`: the same rows, reordered) and each micro-batch is
    cropped to its bucket's shape, so the step compiles once per bucket. Which
    shapes a lot uses depends on its rows: never log or publish them.

    Args:
      source: a lot source (`PoissonLots`, `ShuffledLots`, or `PoissonGroupLots`,
        whose `GroupLot`s need `rows_from` and no `length_buckets`).
      mesh: the data mesh.
      physical_batch_size: b, rows per micro-batch; a multiple of the devices
        (for group lots also of k: `group_microbatch_rows`).
      pad_values: fill values of padding rows (`TokenizedExamples.pad_values`).
      depth: lots kept ready ahead, >= 1.
      rows_from: None if `source`'s lots carry their fields; else the dataset
        this process fetches ITS rows of each micro-batch from (`source` then
        samples an `IndexOnly` view of it), as multi-process runs do.
      length_buckets: None pads every micro-batch to the max lengths. With
        `rows_from`, that dataset must know its rows' lengths before fetching
        (`TokenizedExamples.lengths`), the same on every process.

    Returns:
      A `Prefetcher`; close it (or use `with`) when done.

    Raises:
      ValueError: b is not a positive multiple of the mesh's data devices, or
        buckets are asked of a dataset that cannot tell lengths before
        fetching (checked here, before the thread starts).
    """
    check_physical_batch_size(physical_batch_size, mesh)
    if length_buckets is not None and rows_from is not None and not hasattr(rows_from, "lengths"):
        raise ValueError(
            f"length buckets need row lengths before fetching, which {type(rows_from).__name__} "
            "cannot give (per-lot tokenization); pass length_buckets=None."
        )

    def to_device(lot: Lot | GroupLot) -> list[dict[str, jax.Array]]:
        if isinstance(lot, GroupLot):  # Whole groups per micro-batch, at the max lengths.
            if rows_from is None or length_buckets is not None:
                raise ValueError(
                    "group lots need rows_from (the dataset to fetch rows from) and no "
                    "length buckets."
                )
            return [
                shard_fetched_microbatch(micro, mesh, rows_from, pad_values)
                for micro in to_group_microbatches(lot, physical_batch_size)
            ]
        shapes = None
        if length_buckets is not None:
            if rows_from is not None:
                source_lengths, target_lengths = rows_from.lengths(lot.indices)
            else:
                source_lengths, target_lengths = lot.batch[INPUT_LENGTH], lot.batch[LABEL_LENGTH]
            lot, shapes = length_buckets.group(
                lot, np.asarray(source_lengths), np.asarray(target_lengths), physical_batch_size
            )
        if rows_from is not None:  # Index-only lot: fetch this process's rows only.
            microbatches = to_microbatches(lot, physical_batch_size)
            shapes = shapes or [None] * len(microbatches)
            return [
                shard_fetched_microbatch(micro, mesh, rows_from, pad_values, bucket_shape=shape)
                for micro, shape in zip(microbatches, shapes, strict=True)
            ]
        microbatches = to_microbatches(lot, physical_batch_size, pad_values=pad_values)
        if shapes:
            microbatches = [
                crop_to_shape(micro, shape)
                for micro, shape in zip(microbatches, shapes, strict=True)
            ]
        return [shard_microbatch(microbatch, mesh) for microbatch in microbatches]

    return Prefetcher(source, transform=to_device, depth=depth)
