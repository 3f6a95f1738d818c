"""Opacus -> JAX bridge: Poisson lots as fixed-shape, masked, sharded arrays.

Data flow: `TokenizedExamples` (torch Dataset view) -> `PoissonLots` or
`ShuffledLots` (a `Lot` per step, possibly empty) -> `to_microbatches`
(ceil(n / b) fixed `[b, ...]` micro-batches with a `mask`) -> `shard_microbatch`
(global arrays sharded `P('data')`) -> `dpnmt.training.steps` (noise once per lot).
`Prefetcher` runs the host part in a background thread; `device_lots` chains
split, shard and prefetch. With `IndexOnly` lots, each process fetches only the
rows its devices hold (`shard_fetched_microbatch`); over `TokenizedOnDemand`
it also tokenizes only those rows. `LengthBuckets` (optional) group a lot's
rows by length and crop each micro-batch to the smallest static shape that fits.
`PoissonGroupLots` (dp.unit="group") samples whole groups instead: `GroupLot`s,
cut by `to_group_microbatches` into micro-batches of whole groups of k rows.
"""

from dpnmt.bridge.buckets import (
    LengthBuckets,
    padding_microbatches,
    resolve_length_buckets,
)
from dpnmt.bridge.dataset import TokenizedExamples, TokenizedOnDemand
from dpnmt.bridge.group_lots import (
    GroupLot,
    PoissonGroupLots,
    group_microbatch_rows,
    to_group_microbatches,
)
from dpnmt.bridge.lots import (
    Lot,
    LotCollator,
    LotSource,
    PoissonLots,
    ShuffledLots,
    lot_sampling_rate,
    validate_sampling_rate,
)
from dpnmt.bridge.microbatch import EXAMPLE_INDEX, MASK, PADDING_INDEX, to_microbatches
from dpnmt.bridge.pipeline import device_lots
from dpnmt.bridge.prefetch import Prefetcher
from dpnmt.bridge.process_rows import IndexOnly, shard_fetched_microbatch
from dpnmt.bridge.sharding import (
    DATA_AXIS,
    batch_sharding,
    check_physical_batch_size,
    make_data_mesh,
    replicated_sharding,
    shard_microbatch,
)

__all__ = [
    "DATA_AXIS",
    "EXAMPLE_INDEX",
    "MASK",
    "PADDING_INDEX",
    "GroupLot",
    "IndexOnly",
    "Lot",
    "LengthBuckets",
    "padding_microbatches",
    "LotCollator",
    "LotSource",
    "PoissonGroupLots",
    "PoissonLots",
    "Prefetcher",
    "ShuffledLots",
    "TokenizedExamples",
    "TokenizedOnDemand",
    "batch_sharding",
    "check_physical_batch_size",
    "device_lots",
    "group_microbatch_rows",
    "lot_sampling_rate",
    "make_data_mesh",
    "replicated_sharding",
    "resolve_length_buckets",
    "shard_fetched_microbatch",
    "shard_microbatch",
    "to_group_microbatches",
    "to_microbatches",
    "validate_sampling_rate",
]
