"""Lot sources: Poisson lots (Opacus' sampler) and shuffled fixed-size lots.

Both sources share one interface (`LotSource`): iterating yields `Lot`s forever
(epoch after epoch; take as many as the run needs), and `state_dict()` /
`load_state_dict()` save and restore the position in the lot sequence.

Privacy note: the size of a Poisson lot is private. `Lot.__repr__` hides it, and
nothing in this module logs it.
"""

import dataclasses
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, Protocol

import jax
import numpy as np
import torch
from opacus.data_loader import DPDataLoader

from dpnmt.bridge.dataset import INDEX, ExampleBlock

INDEX_DTYPE = np.int64


@dataclasses.dataclass(frozen=True, repr=False)
class Lot:
    """One logical batch: the sampled example indices and their fields.

    Attributes:
      indices: `[n]` int64 dataset positions of the sampled examples (n may be 0).
      batch: field name -> `[n, ...]` numpy array, rows aligned with `indices`.
    """

    indices: np.ndarray
    batch: dict[str, np.ndarray]

    def __repr__(self) -> str:
        """Names the fields only: a Poisson lot's size is private, never print it."""
        return f"Lot(fields={sorted(self.batch)}, size=<private>)"


class LotCollator:
    """Collates a list of per-example dicts into a `Lot`, including the empty lot.

    Replaces Opacus' empty-batch collate, which fails for dict-of-numpy samples
    (it needs tensors, or passes a Python type as a torch dtype). An empty list
    gives a `Lot` with zero rows and the right per-field shapes and dtypes.
    """

    def __init__(self, field_specs: Mapping[str, tuple[tuple[int, ...], np.dtype]]):
        """Stores the per-example field layout.

        Args:
          field_specs: field name -> (per-example shape, dtype), without `index`
            (e.g. `TokenizedExamples.field_specs()`).
        """
        self._field_specs = {
            name: (tuple(shape), np.dtype(dtype)) for name, (shape, dtype) in field_specs.items()
        }

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> Lot:
        """Stacks `samples` (each with an `index` and every field) into a `Lot`.

        Args:
          samples: per-example dicts (or an `ExampleBlock`); may be empty.

        Returns:
          A `Lot` with `[n]` indices and `[n, *shape]` arrays of the spec dtypes.

        Raises:
          ValueError: a field's per-example shape differs from its spec.
        """
        if isinstance(samples, ExampleBlock):
            indices = samples.indices.astype(INDEX_DTYPE)
        else:
            indices = np.fromiter((int(s[INDEX]) for s in samples), INDEX_DTYPE, count=len(samples))
        batch = {}
        for name, (shape, dtype) in self._field_specs.items():
            if isinstance(samples, ExampleBlock):
                stacked = samples.fields[name].astype(dtype, copy=False)
            elif len(samples):
                stacked = np.stack([np.asarray(s[name], dtype=dtype) for s in samples])
            else:
                stacked = np.zeros((0, *shape), dtype=dtype)
            if stacked.shape[1:] != shape:
                raise ValueError(
                    f"field {name!r} has per-example shape {stacked.shape[1:]}, expected "
                    f"{shape}; pad examples to the fixed length before collating."
                )
            batch[name] = stacked
        return Lot(indices=indices, batch=batch)


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


def _fetch(dataset: torch.utils.data.Dataset, indices: np.ndarray) -> Sequence[Any]:
    """The examples at `indices`, batched when the dataset supports it (as torch does)."""
    if hasattr(dataset, "__getitems__"):
        return dataset.__getitems__(indices.tolist())
    return [dataset[int(i)] for i in indices]


def _generator_state(generator: torch.Generator) -> np.ndarray:
    return generator.get_state().numpy().copy()


def _set_generator_state(generator: torch.Generator, state: np.ndarray) -> None:
    generator.set_state(torch.from_numpy(np.array(state, dtype=np.uint8)))


def _check_state(state: Mapping[str, Any], expected: Mapping[str, Any]) -> None:
    for key, value in expected.items():
        if state.get(key) != value:
            raise ValueError(
                f"cannot restore lot source: saved {key} = {state.get(key)!r} but this "
                f"source has {key} = {value!r}; resume with the same data and lot settings."
            )


def _secure_generator() -> torch.Generator:
    """Opacus' secure RNG (`PrivacyEngine(secure_mode=True)` uses the same)."""
    try:
        import torchcsprng  # noqa: PLC0415
    except ImportError as error:
        raise RuntimeError(
            "secure_rng=True needs torchcsprng (Opacus' secure generator, "
            "`torchcsprng.create_random_device_generator('/dev/urandom')`), which is not "
            "installed. Its releases do not support this torch version; install a "
            "compatible build, or use secure_rng=False (seeded, NOT for releases)."
        ) from error
    return torchcsprng.create_random_device_generator("/dev/urandom")


class PoissonLots:
    """Poisson lots from Opacus' `DPDataLoader` (`UniformWithReplacementSampler`).

    Every example joins each lot independently with probability q = L / N, so
    lot sizes are Binomial(N, q) and may be zero; an empty lot is still a lot
    (the training step must take it). An epoch is `N // L` lots, a bookkeeping
    unit only: lots are independent draws.
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
          seed: seed of the `torch.Generator` that draws lots (research runs).
          secure_rng: draw lots from Opacus' cryptographically secure generator
            (for releases). Lot sequences are then not reproducible, and `seed`
            must be None.

        Raises:
          ValueError: bad (N, L), a seed together with `secure_rng`, or neither.
          RuntimeError: `secure_rng` without the secure generator installed.
        """
        self._num_examples = len(dataset)
        self._sampling_rate = lot_sampling_rate(self._num_examples, expected_lot_size)
        self._expected_lot_size = int(expected_lot_size)
        self._num_steps_per_epoch = self._num_examples // self._expected_lot_size
        self._secure_rng = secure_rng
        if secure_rng:
            if jax.process_count() > 1:
                raise ValueError(
                    "secure_rng=True draws different lots in each of the "
                    f"{jax.process_count()} processes; multi-process runs need one lot per "
                    "step: pass the same secret seed (e.g. core.fresh_seed() on process 0, "
                    "broadcast) to every process instead."
                )
            if seed is not None:
                raise ValueError(f"seed = {seed} is not allowed with secure_rng=True.")
            self._generator = _secure_generator()
        else:
            if seed is None:
                raise ValueError(
                    "PoissonLots needs seed=<int> (reproducible research runs) or "
                    "secure_rng=True (releases)."
                )
            self._generator = torch.Generator().manual_seed(int(seed))
        self._loader = DPDataLoader(
            dataset, sample_rate=self._sampling_rate, generator=self._generator
        )
        # Own the collate (Opacus' empty-batch wrapper fails on dict-of-numpy
        # samples), and give the DataLoader its own generator: it draws a base
        # seed from it on every `iter()`, which would otherwise shift the lot
        # sequence on resume.
        self._loader.collate_fn = LotCollator(dataset.field_specs())
        self._loader.generator = torch.Generator().manual_seed(0)
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

    def __iter__(self) -> Iterator[Lot]:
        """Yields lots forever from the current (epoch, step); one iterator at a time."""
        batch_sampler = self._loader.batch_sampler
        while True:
            batch_sampler.steps = self._num_steps_per_epoch - self._step
            for lot in self._loader:
                self._step += 1
                if self._step == self._num_steps_per_epoch:
                    self._epoch, self._step = self._epoch + 1, 0
                yield lot

    def state_dict(self) -> dict[str, Any]:
        """Position after the last lot drawn: epoch, step and generator state."""
        return {
            "sampling_scheme": self.sampling_scheme,
            "num_examples": self._num_examples,
            "expected_lot_size": self._expected_lot_size,
            "epoch": self._epoch,
            "step": self._step,
            "generator_state": None if self._secure_rng else _generator_state(self._generator),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a `state_dict()`; a new `iter()` continues the saved sequence.

        With `secure_rng` only the counters are restored (fresh secure draws).

        Raises:
          ValueError: the state is from a different scheme, N or L.
        """
        _check_state(
            state,
            {
                "sampling_scheme": self.sampling_scheme,
                "num_examples": self._num_examples,
                "expected_lot_size": self._expected_lot_size,
            },
        )
        if not self._secure_rng:
            if state["generator_state"] is None:
                raise ValueError("the saved state has no generator state (secure run).")
            _set_generator_state(self._generator, state["generator_state"])
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
          seed: seed of the `torch.Generator` that draws the permutations.
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
        self._generator = torch.Generator().manual_seed(int(seed))
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
                self._permutation = torch.randperm(
                    self._num_examples, generator=self._generator
                ).numpy()
            start = self._step * self._lot_size
            indices = self._permutation[start : start + self._lot_size]
            lot = self._collate(_fetch(self._dataset, indices))
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
            "generator_state": (
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
        _set_generator_state(self._generator, state["generator_state"])
        self._permutation = None
        self._epoch, self._step = int(state["epoch"]), int(state["step"])
