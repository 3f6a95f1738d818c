"""Secret-seeded lot draws: the generator, q = L / N, and what the Poisson samplers share.

`PoissonDraws` is the base of `lots.PoissonLots` (examples) and
`group_lots.PoissonGroupLots` (groups): q, L, lots per epoch, the secret
generator (numpy's PCG64 seeded with every bit of a seed of any size, or
`os.urandom`), the (epoch, step) position and the state dict. The helpers here
(seeding, saving and restoring a generator, Bernoulli membership) serve
`lots.ShuffledLots` too.
"""

import copy
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from dpnmt.bridge.lot import INDEX_DTYPE


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


class PoissonDraws:
    """What the Poisson samplers share (`PoissonLots`, `group_lots.PoissonGroupLots`).

    N units (examples, or groups) each join a lot independently with
    probability q = L / N. This holds q, L, the lots per epoch N // L, the
    secret generator (numpy's PCG64 seeded with every bit of the seed, or
    None: `os.urandom`), the (epoch, step) position and the state dict:
    `_identity()` (the subclass's public settings, checked on restore), then
    epoch, step and the generator state.
    """

    sampling_scheme: str

    def _start_draws(
        self, num_units: int, expected_lot_size: int, seed: int | None, secure_rng: bool
    ) -> None:
        """Sets q, L, lots per epoch, the generator and the position (0, 0).

        Raises:
          ValueError: bad (N, L), a bad seed, a seed with `secure_rng` or
            neither, or `secure_rng` in a multi-process run.
        """
        self._sampling_rate = lot_sampling_rate(num_units, expected_lot_size)
        self._expected_lot_size = int(expected_lot_size)
        self._num_steps_per_epoch = num_units // self._expected_lot_size
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
        elif seed is None:
            raise ValueError(
                f"{type(self).__name__} needs seed=<int> (a secret seed, e.g. from the OS) or "
                "secure_rng=True (lots straight from os.urandom)."
            )
        else:
            self._generator = _seeded_generator(seed)
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

    def _words(self, count: int) -> np.ndarray:
        """`[count]` independent uniform uint64 words: the secret generator's, else the OS's."""
        if self._generator is None:
            return _os_words(count)
        return np.asarray(self._generator.bit_generator.random_raw(count), dtype=np.uint64)

    def _advance(self) -> None:
        """One lot drawn: the next (epoch, step)."""
        self._step += 1
        if self._step == self._num_steps_per_epoch:
            self._epoch, self._step = self._epoch + 1, 0

    def _identity(self) -> dict[str, Any]:
        """The public settings a saved state must match (scheme, N, L, ...)."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """Position after the last lot drawn: epoch, step and generator state.

        Returns:
          A JSON-serialisable dict (str, Python ints, nested dicts). The
          generator state determines every later lot: keep it private.
        """
        return {
            **self._identity(),
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
          ValueError: the state is from different settings (`_identity()`), or
            has no (or an old torch) generator state.
        """
        _check_state(state, self._identity())
        if self._generator is not None:
            if state.get("bit_generator_state") is None:
                raise ValueError(
                    "the saved sampler state has no generator state (a secure_rng run, or "
                    "an older dpnmt's torch state); resume it with the same settings."
                )
            _set_generator_state(self._generator, state["bit_generator_state"])
        self._epoch, self._step = int(state["epoch"]), int(state["step"])
