"""Poisson lots of GROUPS (user-level DP-SGD): whole groups in, at most k rows each.

`PoissonGroupLots` draws each lot as `PoissonLots` draws examples, but over
groups: every one of the N_groups groups (a user, a case report, a dialogue)
joins independently with probability q = L_groups / N_groups, and a sampled
group brings at most k = `group_cap` of its examples, chosen uniformly from
the same secret generator when it has more. A lot is a `GroupLot`: `[G, k]`
example indices, -1 in the unused slots. `to_group_microbatches` cuts it into
fixed-shape micro-batches of whole groups, flat `[G_micro · k]` rows with a
mask, so sharding and per-process fetching are the example path's
(`shard_fetched_microbatch`); the step reshapes them to `[G_micro, k]` and
clips each group once (`core.dp_step.add_group_microbatch`).

Privacy note: which groups and rows a lot holds, and how many, are private.
`GroupLot.__repr__` hides them, and nothing here logs them.
"""

import dataclasses
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from dpnmt.bridge.draws import PoissonDraws, bernoulli_members
from dpnmt.bridge.lot import INDEX_DTYPE
from dpnmt.bridge.microbatch import EXAMPLE_INDEX, MASK, PADDING_INDEX


@dataclasses.dataclass(frozen=True, repr=False)
class GroupLot:
    """One lot of sampled groups, as example indices.

    Attributes:
      indices: `[G, k]` int64: row j of sampled group g is example
        `indices[g, j]`, or -1 for an unused slot (the group has fewer than k
        examples). G (possibly 0) is the number of sampled groups.
    """

    indices: np.ndarray

    @property
    def group_cap(self) -> int:
        """k, rows per group."""
        return int(self.indices.shape[1])

    def __repr__(self) -> str:
        """No sizes: which groups and rows a lot holds is private."""
        return "GroupLot(size=<private>)"


def group_members(groups: Sequence[Any]) -> list[np.ndarray]:
    """The example indices of each group, groups in order of first appearance.

    Args:
      groups: `[N]` group label of each example (any hashable values).

    Returns:
      N_groups sorted int64 arrays partitioning range(N).
    """
    labels = np.asarray(groups, dtype=object)
    members: dict[Any, list[int]] = {}
    for index, label in enumerate(labels.tolist()):
        members.setdefault(label, []).append(index)
    return [np.asarray(rows, dtype=INDEX_DTYPE) for rows in members.values()]


class PoissonGroupLots(PoissonDraws):
    """Poisson lots of whole groups, each bringing at most k of its examples.

    Each lot: one uniform 64-bit word per group decides (independently, with
    probability q = L_groups / N_groups) whether the group joins; a joining
    group with more than k examples then keeps k of them, chosen uniformly
    without replacement (its rows ranked by fresh uniform words from the same
    secret generator). No example appears twice in a lot. An empty lot is
    still a lot. An epoch is N_groups // L_groups lots (bookkeeping only).
    Seeded draws come from numpy's PCG64 seeded with every bit of the secret
    seed; `secure_rng` draws from `os.urandom`.
    """

    sampling_scheme = "poisson_groups"

    def __init__(
        self,
        groups: Sequence[Any],
        expected_lot_size: int,
        group_cap: int,
        *,
        seed: int | None = None,
        secure_rng: bool = False,
    ):
        """Builds the sampler.

        Args:
          groups: `[N]` group label of each example of the training set (the
            privacy unit: one label per user, case report, dialogue).
          expected_lot_size: L_groups, the expected number of groups per lot.
          group_cap: k >= 1, the most examples one group adds to a lot.
          seed: secret non-negative integer of any size (every bit counts);
            never the public `config.seed`.
          secure_rng: draw from the OS's CSPRNG instead (`seed` must be None).

        Raises:
          ValueError: bad (N_groups, L_groups) or k, a bad seed, a seed with
            `secure_rng` or neither, or `secure_rng` with several processes.
        """
        self._members = group_members(groups)
        self._num_examples = int(len(groups))
        self._num_groups = len(self._members)
        if isinstance(group_cap, bool) or int(group_cap) != group_cap or group_cap < 1:
            raise ValueError(f"group_cap k = {group_cap!r} must be an int >= 1.")
        self._group_cap = int(group_cap)
        self._start_draws(self._num_groups, expected_lot_size, seed, secure_rng)

    @property
    def num_groups(self) -> int:
        """N_groups."""
        return self._num_groups

    @property
    def group_cap(self) -> int:
        """k, the most examples one group adds to a lot."""
        return self._group_cap

    def _draw(self) -> GroupLot:
        sampled = bernoulli_members(self._words(self._num_groups), self._sampling_rate)
        indices = np.full((len(sampled), self._group_cap), PADDING_INDEX, dtype=INDEX_DTYPE)
        for slot, group in enumerate(sampled):
            rows = self._members[group]
            if len(rows) > self._group_cap:
                # A uniform k-subset: the k rows with the smallest fresh words.
                rows = np.sort(
                    rows[np.argsort(self._words(len(rows)), kind="stable")][: self._group_cap]
                )
            indices[slot, : len(rows)] = rows
        return GroupLot(indices)

    def __iter__(self) -> Iterator[GroupLot]:
        """Yields lots forever from the current (epoch, step); one iterator at a time."""
        while True:
            lot = self._draw()
            self._advance()
            yield lot

    def _identity(self) -> dict[str, Any]:
        return {
            "sampling_scheme": self.sampling_scheme,
            "num_examples": self._num_examples,
            "num_groups": self._num_groups,
            "expected_lot_size": self._expected_lot_size,
            "group_cap": self._group_cap,
        }


def to_group_microbatches(lot: GroupLot, physical_batch_size: int) -> list[dict[str, np.ndarray]]:
    """Splits a lot of G groups into ceil(G / G_micro) micro-batches of whole groups.

    A micro-batch holds G_micro = b / k groups as b flat rows: group g's k
    slots are rows `g·k … g·k + k - 1`. Unused slots and padding groups have
    mask 0 and index -1; an empty lot gives an empty list (noise-only step).

    Args:
      lot: the sampled groups.
      physical_batch_size: b, rows per micro-batch, a positive multiple of k.

    Returns:
      A list of dicts with `mask` `[b]` float32 and `example_index` `[b]`
      int32 (fetch the rows with `shard_fetched_microbatch`).

    Raises:
      ValueError: b is not a positive multiple of k.
    """
    k = lot.group_cap
    if physical_batch_size <= 0 or physical_batch_size % k:
        raise ValueError(
            f"physical_batch_size = {physical_batch_size} must be a positive multiple of the "
            f"group cap k = {k} (whole groups per micro-batch)."
        )
    per_micro = physical_batch_size // k
    count = math.ceil(lot.indices.shape[0] / per_micro)
    padded = np.full((count * per_micro, k), PADDING_INDEX, dtype=np.int64)
    padded[: lot.indices.shape[0]] = lot.indices
    if padded.size and padded.max() > np.iinfo(np.int32).max:
        raise ValueError("example indices exceed int32; shard the dataset below 2**31 rows.")
    flat = padded.reshape(count, physical_batch_size)
    return [
        {MASK: (rows != PADDING_INDEX).astype(np.float32), EXAMPLE_INDEX: rows.astype(np.int32)}
        for rows in flat
    ]


def group_microbatch_rows(physical_batch_size: int, group_cap: int, num_devices: int) -> int:
    """Rows of a group micro-batch: whole groups of k, about b rows, a multiple of the devices.

    G_micro = max(1, b // k) groups, raised until G_micro · k splits evenly
    over `num_devices`.
    """
    groups = max(1, physical_batch_size // group_cap)
    while (groups * group_cap) % num_devices:
        groups += 1
    return groups * group_cap
