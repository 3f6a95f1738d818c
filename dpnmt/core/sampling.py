"""JAX-native lot sampling: a key in, fixed-shape masked micro-batches of indices out.

Every sampler here is pure and jit-able, and returns `MicroBatches`: a lot's
example indices split into `[num_microbatches, microbatch_size]` rows plus a
0/1 mask of the same shape. Padding rows point to index 0 (a valid row of the
data, so gathering never goes out of bounds) and have mask 0: they must be
multiplied out by the mask, as `private_grad_sum(..., mask)` and
`clip_and_sum(..., mask=mask)` do. A lot never holds a copy of an example.

Poisson lots (`poisson_lot`) include each of the N examples independently with
probability q = L/N, so the realised lot size is Binomial(N, q) and varies
from step to step. To keep one compiled program, the lot is padded to a fixed
capacity `max_microbatches × microbatch_size` (`lot_capacity` picks one whose
overflow probability is negligible); a lot that does not fit is an error,
never silently truncated. Shuffled lots (`shuffled_lots`) cut one random
permutation per epoch into lots of exactly L examples: they are accounted with
`compute_epsilon_shuffled`, not the Poisson bound.
"""

import dataclasses
import functools
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np

from dpnmt.core import validation

OVERFLOW_POLICIES = ("raise", "flag")


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["indices", "mask", "num_microbatches", "overflow"],
    meta_fields=["num_examples"],
)
@dataclasses.dataclass(frozen=True)
class MicroBatches:
    """One lot as fixed-shape micro-batches of example indices.

    A pytree: the arrays are its leaves, `num_examples` is static (part of
    the tree structure, so `jax.jit` keeps it a Python int).

    Attributes:
      indices: int32 `[num_microbatches, microbatch_size]`, indices into the
        data set; padding rows hold 0, a valid dummy index.
      mask: float32 `[num_microbatches, microbatch_size]`, 1 for real rows and 0
        for padding. Multiply padding out with it (pass each row of it as the
        `mask` of `private_grad_sum`).
      num_microbatches: int32 scalar, the leading micro-batches that hold at
        least one real row; the rest are all padding and may be skipped.
      overflow: bool scalar, True if the lot did not fit (only with
        `on_overflow="flag"`; the lot is then truncated and must not be used).
      num_examples: N, the size of the data set the lot was drawn from
        (static Python int). `gather` (and `private_lot_gradient`, which uses
        it) refuses data of another size: indices drawn for a larger N would
        be clamped to its last row, counting that row many times.

    The realised lot size (`mask.sum()`) and `num_microbatches` are private:
    never log them.
    """

    indices: chex.Array
    mask: chex.Array
    num_microbatches: chex.Array
    overflow: chex.Array
    num_examples: int

    def gather(self, examples: Any, index) -> Any:
        """Micro-batch `index`'s rows of `examples`, checked against the lot's N.

        Use it rather than `examples[lot.indices[k]]`: JAX clamps an index
        past the end onto the last row, so a lot drawn for a larger N, gathered
        by hand from a smaller data set, counts that row many times (the sum's
        sensitivity is then far above C). This refuses data of another size,
        and gathers with `mode="fill"`: an index outside [0, N) (possible only
        for traced indices given to `to_microbatches`) yields a row of fill
        values (NaN for floats: the example is dropped as non-finite), never a
        copy of a real row. Padding rows hold row 0's values: pass
        `lot.mask[index]` with them.

        Args:
          examples: pytree of the whole data set, every leaf `[N, ...]` with
            N = `num_examples`.
          index: the micro-batch, an int in [0, K) or a traced integer (e.g. a
            `fori_loop` counter below `num_microbatches`).

        Returns:
          Pytree like `examples`, every leaf `[microbatch_size, ...]`.

        Raises:
          ValueError: the leaves of `examples` differ in their leading axis,
            it is not `num_examples`, or a concrete `index` is outside [0, K).
          TypeError: `index` is not an integer.
        """
        num_rows = validation.check_batch_axis("examples", examples)
        if num_rows != self.num_examples:
            raise ValueError(
                f"the lot was drawn for num_examples = {self.num_examples} but examples has "
                f"{num_rows} rows: draw the lot for this data set (poisson_lot(key, "
                f"{num_rows}, ...), to_microbatches(..., num_examples={num_rows})) or pass "
                "the data set it was drawn for."
            )
        index = validation.check_step("index", index)  # An integer: 1.5 is refused.
        num_microbatches = self.indices.shape[0]
        if validation.is_concrete(index) and int(index) >= num_microbatches:
            raise ValueError(
                f"micro-batch index {int(index)} is outside [0, {num_microbatches}): the lot "
                f"has {num_microbatches} micro-batches."
            )
        # A traced index past the end must not clamp onto the last micro-batch (a copy of its
        # examples): it gathers fill rows, as an out-of-range example index does.
        past = jnp.where(index < 0, num_microbatches, index)  # take would wrap a negative one.
        rows = jnp.take(self.indices, past, axis=0, mode="fill", fill_value=self.num_examples)
        return jax.tree_util.tree_map(
            lambda leaf: jnp.take(jnp.asarray(leaf), rows, axis=0, mode="fill"), examples
        )


def poisson_mask(key: chex.PRNGKey, num_examples: int, sampling_rate: float) -> chex.Array:
    """Poisson sampling: each example joins the lot independently with probability q.

    Args:
      key: this step's sampling key (e.g. `jax.random.fold_in(key, step)`); a
        fresh key per step makes the steps' lots independent.
      num_examples: N, the data set size (static).
      sampling_rate: q in (0, 1], usually L/N.

    Returns:
      bool `[N]`: True for the examples of this lot.

    Formal guarantee: each example is included with probability exactly
    floor(q · 2**64) / 2**64 <= q (a 64-bit uniform integer below a threshold),
    independently. `jax.random.bernoulli` compares a float32 uniform on a 2**-23
    grid, which rounds the probability UP (q = 1e-6 gave 1.07e-6): a larger q
    than the accountant's.
    """
    num_examples = validation.check_num_steps("num_examples", num_examples)
    q = validation.check_sampling_rate(sampling_rate)
    threshold = int(q * 2.0**64)  # Exact: a power-of-two scaling of a float.
    if threshold >= 2**64:
        return jnp.ones((num_examples,), bool)
    high, low = divmod(threshold, 2**32)
    words = jax.random.bits(key, (num_examples, 2), jnp.uint32)
    return (words[:, 0] < jnp.uint32(high)) | (
        (words[:, 0] == jnp.uint32(high)) & (words[:, 1] < jnp.uint32(low))
    )


def to_microbatches(
    indices: chex.Array,
    valid: chex.Array,
    microbatch_size: int,
    num_microbatches: int,
    *,
    num_examples: int,
) -> MicroBatches:
    """Packs a lot's indices into `[num_microbatches, microbatch_size]` masked rows.

    The real rows (`valid` True) are packed first, in their order, then the
    padding; `valid` may be any mask (not only a prefix), and no real row is
    ever left out of the leading `num_microbatches` micro-batches.

    Args:
      indices: int `[M]`, M <= num_microbatches × microbatch_size, each real
        one in [0, num_examples); padding entries may hold any value (they
        become 0).
      valid: bool `[M]`, True for real rows.
      microbatch_size: b, rows per micro-batch (static).
      num_microbatches: K, micro-batches in the result (static).
      num_examples: N, the size of the data set the indices point into
        (static); the lot carries it so that a step refuses data of another
        size.

    Returns:
      `MicroBatches` with `overflow` False.

    Raises:
      ValueError: more than K·b indices, `valid` not `[M]`, or (for concrete
        indices) a real index outside [0, N). Traced indices cannot be
        checked: keep them in range (`poisson_lot` and `shuffled_lots` do).
    """
    microbatch_size = validation.check_num_steps("microbatch_size", microbatch_size)
    num_microbatches = validation.check_num_steps("num_microbatches", num_microbatches)
    num_examples = validation.check_num_steps("num_examples", num_examples)
    capacity = microbatch_size * num_microbatches
    if jnp.ndim(indices) != 1:
        raise ValueError(f"indices must be 1-D [M], got shape {jnp.shape(indices)}.")
    if jnp.shape(valid) != jnp.shape(indices):
        raise ValueError(
            f"valid has shape {jnp.shape(valid)} but indices {jnp.shape(indices)}: pass one "
            "bool per index (True: a real row)."
        )
    if indices.shape[0] > capacity:
        raise ValueError(
            f"{indices.shape[0]} indices do not fit in num_microbatches × microbatch_size = "
            f"{capacity}; raise num_microbatches."
        )
    if validation.is_concrete(indices) and validation.is_concrete(valid):
        real = np.asarray(indices)[np.asarray(valid, bool)]
        if real.size and (real.min() < 0 or real.max() >= num_examples):
            raise ValueError(
                f"a real index lies outside [0, num_examples = {num_examples}): the lot was "
                "drawn for another data set; pass that data set's size as num_examples."
            )
    valid = jnp.asarray(valid, bool)
    # Stable compaction: real rows first, in order, so the leading micro-batches hold them all.
    order = jnp.argsort(~valid, stable=True)
    pad = capacity - indices.shape[0]
    valid = jnp.pad(valid[order], (0, pad))
    indices = jnp.where(valid, jnp.pad(jnp.asarray(indices, jnp.int32)[order], (0, pad)), 0)
    shape = (num_microbatches, microbatch_size)
    lot_size = jnp.sum(valid, dtype=jnp.int32)
    return MicroBatches(
        indices=indices.reshape(shape),
        mask=valid.astype(jnp.float32).reshape(shape),
        num_microbatches=(lot_size + microbatch_size - 1) // microbatch_size,
        overflow=jnp.zeros((), bool),
        num_examples=num_examples,
    )


def _raise_on_overflow(overflow, capacity: int) -> None:
    # Runs on the host inside the compiled step. The message must not carry the
    # realised lot size: it is private and error messages end up in logs.
    if overflow:
        raise OverflowError(
            f"A Poisson lot exceeded its capacity of {capacity} rows "
            "(max_microbatches × microbatch_size); no step was taken with it. Raise "
            "max_microbatches (dpnmt.core.lot_capacity picks one with a negligible "
            "overflow probability)."
        )


def poisson_lot(
    key: chex.PRNGKey,
    num_examples: int,
    sampling_rate: float,
    *,
    microbatch_size: int,
    max_microbatches: int,
    on_overflow: str = "raise",
) -> MicroBatches:
    """A Poisson lot as a fixed number of masked micro-batches (one compiled shape).

    Each example is included independently with probability q
    (`poisson_mask`); the included indices, in increasing order, fill the
    first rows, and the rest is padding. The shape does not depend on the
    realised lot size, so a step taking these micro-batches compiles once.

    Formal guarantee: if the lot fits (no overflow), the real indices are
    exactly the examples of a Poisson(q) sample, each once, which is the
    sampling `compute_epsilon` accounts for. A run stopped by an overflow has
    revealed that one lot was large: choose `max_microbatches` so that the
    overflow probability over the whole run is far below δ (`lot_capacity`).

    Args:
      key: this step's sampling key; use a fresh one per step.
      num_examples: N (static).
      sampling_rate: q in (0, 1].
      microbatch_size: b, rows per micro-batch (static).
      max_microbatches: K, micro-batches in the result (static); the lot holds
        at most K·b examples.
      on_overflow: what a lot of more than K·b examples does. `"raise"`: a
        host callback raises `OverflowError` (its message does not contain
        the lot size). Called eagerly, that `OverflowError` reaches the
        caller. Inside `jax.jit` a compiled program cannot raise a Python
        exception: the call (or the first `block_until_ready` of its result)
        raises `jax.errors.JaxRuntimeError` (a `RuntimeError`) whose message
        contains `OverflowError: A Poisson lot exceeded its capacity`, and
        returns no value. `"flag"`: the result's `overflow` is True and the
        lot is truncated: the caller must check it and discard the lot
        (e.g. under `jax.experimental.checkify`). Never silently dropped.

    Returns:
      `MicroBatches` with indices and mask `[max_microbatches, microbatch_size]`.
    """
    if on_overflow not in OVERFLOW_POLICIES:
        raise ValueError(f"on_overflow={on_overflow!r}: use one of {OVERFLOW_POLICIES}.")
    num_examples = validation.check_num_steps("num_examples", num_examples)
    microbatch_size = validation.check_num_steps("microbatch_size", microbatch_size)
    max_microbatches = validation.check_num_steps("max_microbatches", max_microbatches)
    capacity = microbatch_size * max_microbatches
    selected = poisson_mask(key, num_examples, sampling_rate)
    lot_size = jnp.sum(selected, dtype=jnp.int32)
    (indices,) = jnp.nonzero(selected, size=capacity, fill_value=0)
    overflow = lot_size > capacity
    if on_overflow == "raise":
        jax.debug.callback(_raise_on_overflow, overflow, capacity)
    batches = to_microbatches(
        indices,
        jnp.arange(capacity) < lot_size,
        microbatch_size,
        max_microbatches,
        num_examples=num_examples,
    )
    return dataclasses.replace(batches, overflow=overflow)


def shuffled_lots(key: chex.PRNGKey, num_examples: int, lot_size: int) -> chex.Array:
    """One epoch of shuffled lots: a random permutation cut into lots of exactly L.

    The N mod L examples left over by this epoch's permutation sit it out;
    the next epoch (a new key, e.g. `jax.random.fold_in(key, epoch)`) draws a
    new permutation. Account such runs with `compute_epsilon_shuffled`: the
    Poisson bound does not hold for them.

    Args:
      key: this epoch's key.
      num_examples: N (static).
      lot_size: L, examples per lot (static), 1 <= L <= N.

    Returns:
      int32 `[N // L, L]`: row s holds the distinct indices of the epoch's lot s.
      Pack one with `to_microbatches(row, jnp.ones(L, bool), b, ceil(L / b),
      num_examples=N)`.
    """
    num_examples = validation.check_num_steps("num_examples", num_examples)
    lot_size = validation.check_num_steps("lot_size", lot_size)
    if lot_size > num_examples:
        raise ValueError(f"lot_size={lot_size} exceeds num_examples={num_examples}; lower it.")
    num_lots = num_examples // lot_size
    order = jax.random.permutation(key, num_examples)
    return order[: num_lots * lot_size].reshape(num_lots, lot_size).astype(jnp.int32)


def lot_capacity(
    num_examples: int,
    sampling_rate: float,
    microbatch_size: int,
    *,
    num_steps: int,
    overflow_probability: float = 1e-12,
) -> int:
    """Micro-batches that hold a whole Poisson lot in all but a negligible fraction of runs.

    Host-side (not jit-able). Picks the smallest K such that
    P(Binomial(N, q) > K·b) · num_steps <= overflow_probability, a union bound
    over the run's steps.

    Args:
      num_examples: N.
      sampling_rate: q in (0, 1].
      microbatch_size: b.
      num_steps: T, the run's steps.
      overflow_probability: the accepted chance that any step overflows; keep
        it far below δ.

    Returns:
      `max_microbatches` for `poisson_lot`.
    """
    from scipy import stats  # scipy comes with jax; imported here to keep import light.

    validation.check_num_steps("num_examples", num_examples)
    validation.check_sampling_rate(sampling_rate)
    validation.check_num_steps("microbatch_size", microbatch_size)
    validation.check_num_steps("num_steps", num_steps)
    if not 0 < overflow_probability < 1:
        raise ValueError(f"overflow_probability={overflow_probability} must lie in (0, 1).")
    rows = int(stats.binom.isf(overflow_probability / num_steps, num_examples, sampling_rate))
    while stats.binom.sf(rows, num_examples, sampling_rate) * num_steps > overflow_probability:
        rows += 1
    rows = min(max(rows, 1), num_examples)
    return -(-rows // microbatch_size)
