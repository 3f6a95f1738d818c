"""Lot sources: Poisson lots (Opacus' semantics) and shuffled fixed-size lots.

Both sources share one interface (`LotSource`): iterating yields `Lot`s forever
(epoch after epoch; take as many as the run needs), and `state_dict()` /
`load_state_dict()` save and restore the position in the lot sequence (a
JSON-serialisable dict). Both draw from numpy's PCG64 seeded with every bit of a
secret seed of any size. `Lot` and `LotCollator` live in `dpnmt.bridge.lot`
(importable from here too).

Privacy note: the size of a Poisson lot is private. `Lot.__repr__` hides it, and
nothing in this module logs it.
"""

import logging
from collections.abc import Iterator, Mapping
from typing import Any, Literal, Protocol

import numpy as np
import torch

from dpnmt.bridge.draws import (  # noqa: F401 - lot_sampling_rate & co. re-exported.
    PoissonDraws,
    _check_state,
    _generator_state,
    _seeded_generator,
    _set_generator_state,
    bernoulli_members,
    lot_sampling_rate,
    validate_sampling_rate,
)
from dpnmt.bridge.lot import Lot, LotCollator, fetch_examples


class LotSource(Protocol):
    """What a training loop needs from a lot source."""

    sampling_scheme: str  # "poisson" or "shuffle": selects the privacy accountant.

    def __iter__(self) -> Iterator[Lot]: ...  # noqa: D105

    @property
    def num_steps_per_epoch(self) -> int: ...  # noqa: D102

    @property
    def sampling_rate(self) -> float: ...  # noqa: D102

    @property
    def expected_lot_size(self) -> int: ...  # noqa: D102

    def state_dict(self) -> dict[str, Any]: ...  # noqa: D102

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...  # noqa: D102


class PoissonLots(PoissonDraws):
    """Poisson lots, as Opacus' `DPDataLoader` draws them, from a full-entropy generator.

    Every example joins each lot independently with probability q = L / N
    (one uniform draw per example per lot, as Opacus'
    `UniformWithReplacementSampler`), so lot sizes are Binomial(N, q) and may
    be zero; an empty lot is still a lot (the training step must take it). An
    epoch is `N // L` lots, a bookkeeping unit only: lots are independent draws.

    Opacus' loader is not used: it draws from a `torch.Generator`, whose
    `manual_seed` keeps 32 bits of the secret seed (2**32 possible lot
    sequences to try), and whose secure mode needs torchcsprng, which no longer
    builds. Seeded lots come from numpy's PCG64 seeded with every bit of the
    seed; `secure_rng` lots from `os.urandom`.
    """

    sampling_scheme = "poisson"

    def __init__(
        self,
        dataset: torch.utils.data.Dataset,
        expected_lot_size: int,
        *,
        seed: int | None = None,
        secure_rng: bool = False,
    ):
        """Builds the sampler.

        Args:
          dataset: map-style dataset of dict examples with an `index` field and a
            `field_specs()` method (e.g. `TokenizedExamples`).
          expected_lot_size: L, the expected number of examples per lot.
          seed: secret non-negative integer of any size (every bit counts) that
            seeds the lot draws; every process given it draws the same lots.
          secure_rng: draw lots from the OS's CSPRNG (`os.urandom`) instead.
            Lot sequences are then not reproducible, and `seed` must be None.

        Raises:
          ValueError: bad (N, L), a bad seed, a seed together with `secure_rng`,
            or neither, or `secure_rng` in a multi-process run.
        """
        self._dataset = dataset
        self._num_examples = len(dataset)
        self._start_draws(self._num_examples, expected_lot_size, seed, secure_rng)
        self._collate = LotCollator(dataset.field_specs())

    def __iter__(self) -> Iterator[Lot]:
        """Yields lots forever from the current (epoch, step); one iterator at a time."""
        while True:
            members = bernoulli_members(self._words(self._num_examples), self._sampling_rate)
            lot = self._collate(fetch_examples(self._dataset, members))
            self._advance()
            yield lot

    def _identity(self) -> dict[str, Any]:
        return {
            "sampling_scheme": self.sampling_scheme,
            "num_examples": self._num_examples,
            "expected_lot_size": self._expected_lot_size,
        }


class ShuffledLots:
    """Fixed lots of exactly L examples from a fresh permutation each epoch.

    The last N mod L examples of each epoch's permutation do not fill a lot.
    `last_lot="drop"` (default) skips them: every lot then has exactly L
    examples, each example is in at most one lot per epoch (what
    `compute_epsilon_shuffled` assumes), and the dropped count N mod L is public
    (it depends on N and L only), logged once, and exposed as
    `num_dropped_per_epoch`; a fresh permutation drops different examples each
    epoch. `last_lot="smaller"` keeps them as a final lot of N mod L examples;
    the update is still divided by L, so the per-example sensitivity bound C / L
    holds unchanged. There is no Poisson amplification here: account with the
    shuffled accountant, not with `sampling_rate`.
    """

    sampling_scheme = "shuffle"

    def __init__(
        self,
        dataset: torch.utils.data.Dataset,
        lot_size: int,
        *,
        seed: int,
        last_lot: Literal["drop", "smaller"] = "drop",
    ):
        """Builds the sampler.

        Args:
          dataset: map-style dataset of dict examples with an `index` field and a
            `field_specs()` method (e.g. `TokenizedExamples`).
          lot_size: L, examples per lot.
          seed: secret non-negative integer of any size (every bit counts) that
            seeds the permutations.
          last_lot: "drop" or "smaller", see the class docstring.

        Raises:
          ValueError: bad (N, L) or an unknown `last_lot`.
        """
        self._num_examples = len(dataset)
        self._sampling_rate = lot_sampling_rate(self._num_examples, lot_size)
        if last_lot not in ("drop", "smaller"):
            raise ValueError(f"last_lot = {last_lot!r}; valid: 'drop', 'smaller'.")
        self._dataset = dataset
        self._lot_size = int(lot_size)
        num_full_lots, remainder = divmod(self._num_examples, self._lot_size)
        keep_partial = last_lot == "smaller" and remainder > 0
        self._num_steps_per_epoch = num_full_lots + int(keep_partial)
        self.num_dropped_per_epoch = 0 if keep_partial else remainder
        if self.num_dropped_per_epoch:
            logging.info(
                "ShuffledLots: %d of %d examples (N mod L) are left out of each epoch.",
                self.num_dropped_per_epoch,
                self._num_examples,
            )
        self._collate = LotCollator(dataset.field_specs())
        self._generator = _seeded_generator(seed)
        self._epoch_start_state = _generator_state(self._generator)
        self._permutation: np.ndarray | None = None
        self._epoch = 0
        self._step = 0

    @property
    def num_steps_per_epoch(self) -> int:
        """Lots per epoch: N // L, plus one with `last_lot="smaller"` and N mod L > 0."""
        return self._num_steps_per_epoch

    @property
    def sampling_rate(self) -> float:
        """Nominal L / N (not a Poisson rate: no amplification by sampling)."""
        return self._sampling_rate

    @property
    def expected_lot_size(self) -> int:
        """L, the lot size and the constant the noisy lot gradient is divided by."""
        return self._lot_size

    def __iter__(self) -> Iterator[Lot]:
        """Yields lots forever from the current (epoch, step); one iterator at a time."""
        while True:
            if self._permutation is None:
                self._epoch_start_state = _generator_state(self._generator)
                self._permutation = self._generator.permutation(self._num_examples)
            start = self._step * self._lot_size
            indices = self._permutation[start : start + self._lot_size]
            lot = self._collate(fetch_examples(self._dataset, indices))
            self._step += 1
            if self._step == self._num_steps_per_epoch:
                self._epoch, self._step, self._permutation = self._epoch + 1, 0, None
            yield lot

    def state_dict(self) -> dict[str, Any]:
        """Position after the last lot drawn (generator state at the epoch's start)."""
        in_epoch = self._permutation is not None
        return {
            "sampling_scheme": self.sampling_scheme,
            "num_examples": self._num_examples,
            "expected_lot_size": self._lot_size,
            "num_steps_per_epoch": self._num_steps_per_epoch,
            "epoch": self._epoch,
            "step": self._step,
            "bit_generator_state": (
                self._epoch_start_state if in_epoch else _generator_state(self._generator)
            ),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a `state_dict()`; a new `iter()` continues the saved sequence.

        Raises:
          ValueError: the state is from a different scheme, N, L or `last_lot`.
        """
        _check_state(
            state,
            {
                "sampling_scheme": self.sampling_scheme,
                "num_examples": self._num_examples,
                "expected_lot_size": self._lot_size,
                "num_steps_per_epoch": self._num_steps_per_epoch,
            },
        )
        _set_generator_state(self._generator, state.get("bit_generator_state"))
        self._permutation = None
        self._epoch, self._step = int(state["epoch"]), int(state["step"])
