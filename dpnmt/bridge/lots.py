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

import copy
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any, Literal, Protocol

import jax
import numpy as np
import torch

from dpnmt.bridge.lot import INDEX_DTYPE, Lot, LotCollator, fetch_examples


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


def validate_sampling_rate(sampling_rate: float) -> float:
    """Checks a sampling rate q lies in (0, 1].

    Args:
      sampling_rate: probability q that an example joins a lot.

    Returns:
      `sampling_rate` as a float.

    Raises:
      ValueError: q is not in (0, 1].
    """
    if not 0.0 < sampling_rate <= 1.0:
        raise ValueError(
            f"sampling rate q = {sampling_rate} is not in (0, 1]; q = L / N is the "
            "probability that an example joins a lot."
        )
    return float(sampling_rate)


def lot_sampling_rate(num_examples: int, expected_lot_size: int) -> float:
    """Validates (N, L) and returns the sampling rate q = L / N.

    Args:
      num_examples: dataset size N.
      expected_lot_size: (expected) lot size L, in examples.

    Returns:
      q = L / N, in (0, 1).

    Raises:
      ValueError: empty dataset, L not a positive integer, or L >= N.
    """
    if num_examples <= 0:
        raise ValueError(f"the dataset is empty (N = {num_examples}); nothing to sample lots from.")
    if int(expected_lot_size) != expected_lot_size or expected_lot_size <= 0:
        raise ValueError(
            f"expected_lot_size L = {expected_lot_size} must be a positive integer "
            f"(sampling rate q = L / N = {expected_lot_size / num_examples})."
        )
    if expected_lot_size >= num_examples:
        raise ValueError(
            f"expected_lot_size L = {expected_lot_size} must be smaller than the dataset "
            f"size N = {num_examples} (q = L / N = {expected_lot_size / num_examples}); "
            "lower L or use more data."
        )
    return validate_sampling_rate(expected_lot_size / num_examples)


def _check_seed(seed: int) -> int:
    """`seed` as a Python int, refusing what is not a non-negative integer."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(
            f"seed = {seed!r} must be a non-negative integer (any size: e.g. "
            "core.fresh_seed()'s, or a derived 128-bit seed)."
        )
    return int(seed)


def _seeded_generator(seed: int) -> np.random.Generator:
    """A PCG64 generator whose whole state depends on every bit of `seed`.

    `torch.Generator.manual_seed` keeps 32 of a 63-bit seed's bits, so seeds
    differing above bit 32 draw the same lots. `SeedSequence` hashes an
    integer of any size into its 256-bit pool (pool_size=8 words), which seeds
    PCG64's 128-bit state and 128-bit increment.
    """
    sequence = np.random.SeedSequence(_check_seed(seed), pool_size=8)
    return np.random.Generator(np.random.PCG64(sequence))


def _generator_state(generator: np.random.Generator) -> dict[str, Any]:
    """The bit generator's state: a dict of str and Python ints (JSON-serialisable)."""
    return copy.deepcopy(generator.bit_generator.state)


def _set_generator_state(generator: np.random.Generator, state: Mapping[str, Any]) -> None:
    if not isinstance(state, Mapping):
        raise ValueError(
            "the saved sampler state is not a numpy bit-generator state (a torch generator "
            "state from an older dpnmt?); lots drawn by the old sampler cannot be continued: "
            "start a new workdir."
        )
    generator.bit_generator.state = copy.deepcopy(dict(state))


def _check_state(state: Mapping[str, Any], expected: Mapping[str, Any]) -> None:
    for key, value in expected.items():
        if state.get(key) != value:
            raise ValueError(
                f"cannot restore lot source: saved {key} = {state.get(key)!r} but this "
                f"source has {key} = {value!r}; resume with the same data and lot settings."
            )


def bernoulli_members(words: np.ndarray, sampling_rate: float) -> np.ndarray:
    """Indices whose uniform 64-bit word falls below q * 2**64: independent Bernoulli(q).

    Args:
      words: `[N]` uint64, independent and uniform on [0, 2**64).
      sampling_rate: q in (0, 1].

    Returns:
      `[n]` int64 sorted indices i with words[i] < q * 2**64 (P = q up to 2**-64).
    """
    threshold = int(sampling_rate * 2.0**64)  # Exact: q has a 53-bit mantissa.
    if threshold >= 2**64:
        return np.arange(len(words), dtype=INDEX_DTYPE)
    return np.flatnonzero(words < np.uint64(threshold)).astype(INDEX_DTYPE)


def _os_words(count: int) -> np.ndarray:
    """`[count]` uint64 from the operating system's CSPRNG (`os.urandom`)."""
    return np.frombuffer(os.urandom(8 * count), dtype="<u8").astype(np.uint64)


class PoissonLots:
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
        self._sampling_rate = lot_sampling_rate(self._num_examples, expected_lot_size)
        self._expected_lot_size = int(expected_lot_size)
        self._num_steps_per_epoch = self._num_examples // self._expected_lot_size
        self._secure_rng = secure_rng
        self._generator: np.random.Generator | None = None
        if secure_rng:
            if jax.process_count() > 1:
                raise ValueError(
                    "secure_rng=True draws different lots in each of the "
                    f"{jax.process_count()} processes; multi-process runs need one lot per "
                    "step: pass the same secret seed (e.g. core.fresh_seed() on process 0, "
                    "broadcast) to every process instead."
                )
            if seed is not None:
                raise ValueError("a seed is not allowed with secure_rng=True.")
        else:
            if seed is None:
                raise ValueError(
                    "PoissonLots needs seed=<int> (a secret seed, e.g. from the OS) or "
                    "secure_rng=True (lots straight from os.urandom)."
                )
            self._generator = _seeded_generator(seed)
        self._collate = LotCollator(dataset.field_specs())
        self._epoch = 0
        self._step = 0

    @property
    def num_steps_per_epoch(self) -> int:
        """Lots per epoch, N // L."""
        return self._num_steps_per_epoch

    @property
    def sampling_rate(self) -> float:
        """The sampling rate q = L / N."""
        return self._sampling_rate

    @property
    def expected_lot_size(self) -> int:
        """L, the constant the noisy lot gradient is divided by."""
        return self._expected_lot_size

    def _draw_members(self) -> np.ndarray:
        if self._generator is None:
            words = _os_words(self._num_examples)
        else:
            words = self._generator.bit_generator.random_raw(self._num_examples)
        return bernoulli_members(np.asarray(words, dtype=np.uint64), self._sampling_rate)

    def __iter__(self) -> Iterator[Lot]:
        """Yields lots forever from the current (epoch, step); one iterator at a time."""
        while True:
            lot = self._collate(fetch_examples(self._dataset, self._draw_members()))
            self._step += 1
            if self._step == self._num_steps_per_epoch:
                self._epoch, self._step = self._epoch + 1, 0
            yield lot

    def state_dict(self) -> dict[str, Any]:
        """Position after the last lot drawn: epoch, step and generator state.

        Returns:
          A JSON-serialisable dict (str, Python ints, nested dicts). The
          generator state determines every later lot: keep it private.
        """
        return {
            "sampling_scheme": self.sampling_scheme,
            "num_examples": self._num_examples,
            "expected_lot_size": self._expected_lot_size,
            "epoch": self._epoch,
            "step": self._step,
            "bit_generator_state": (
                None if self._generator is None else _generator_state(self._generator)
            ),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a `state_dict()`; a new `iter()` continues the saved sequence.

        With `secure_rng` only the counters are restored (fresh secure draws).

        Raises:
          ValueError: the state is from a different scheme, N or L, or has no
            (or an old torch) generator state.
        """
        _check_state(
            state,
            {
                "sampling_scheme": self.sampling_scheme,
                "num_examples": self._num_examples,
                "expected_lot_size": self._expected_lot_size,
            },
        )
        if self._generator is not None:
            if state.get("bit_generator_state") is None:
                raise ValueError(
                    "the saved sampler state has no generator state (a secure_rng run, or "
                    "an older dpnmt's torch state); resume it with the same settings."
                )
            _set_generator_state(self._generator, state["bit_generator_state"])
        self._epoch, self._step = int(state["epoch"]), int(state["step"])


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
