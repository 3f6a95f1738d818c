"""Length buckets: each micro-batch padded to the smallest static shape that fits it.

Without buckets every micro-batch is `[b, max_source_length]` /
`[b, max_target_length]`, however short its rows. With buckets, a lot's rows
are grouped by length (a stable sort by bucket), cut into the usual ceil(n / b)
micro-batches, and each micro-batch is cropped to the first bucket that fits
all its rows. Buckets are joint: bucket k is one (source, target) shape, so a
step compiles once per bucket, not once per pair of side lengths.

Privacy: grouping only permutes the lot's rows (the same examples, each once)
and cropping only removes padding positions (never a token: a row longer than
its shape is an error). Which shapes a lot uses depends on its private rows,
like the micro-batch count already does: nothing here logs or returns them for
publication.
"""

import dataclasses
import logging
import math
from collections.abc import Mapping

import numpy as np

from dpnmt.bridge.dataset import INPUT_IDS, INPUT_LENGTH, LABEL_LENGTH, LABELS
from dpnmt.bridge.lots import Lot
from dpnmt.bridge.microbatch import EXAMPLE_INDEX, MASK, PADDING_INDEX

AUTO = "auto"
NONE = "none"
_AUTO_FRACTIONS = (0.25, 0.5, 0.75)  # Of the longer max length, then the max itself.
_AUTO_MULTIPLE = 8  # Auto lengths are rounded up to a multiple of this many tokens.
FIELD = "data.length_buckets"


@dataclasses.dataclass(frozen=True)
class LengthBuckets:
    """The static (source, target) shapes micro-batches are cropped to.

    Attributes:
      shapes: `(source_length, target_length)` per bucket in tokens, each side
        non-decreasing; the last is `(max_source_length, max_target_length)`,
        so every row fits some bucket.
    """

    shapes: tuple[tuple[int, int], ...]

    @classmethod
    def from_lengths(
        cls, lengths: tuple[int, ...], max_source_length: int, max_target_length: int
    ) -> "LengthBuckets":
        """Joint buckets: bucket k is `lengths[k]` tokens, capped at each side's max.

        Args:
          lengths: ascending positive token counts; the largest at least
            `max(max_source_length, max_target_length)`.
          max_source_length: the source side's fixed length, in tokens.
          max_target_length: the target side's fixed length, in tokens.

        Raises:
          ValueError: lengths empty, not positive integers, not strictly
            ascending, or their largest is below a max length.
        """
        _check_lengths(lengths, max_source_length, max_target_length)
        shapes = tuple((min(n, max_source_length), min(n, max_target_length)) for n in lengths)
        return cls(tuple(dict.fromkeys(shapes)))  # Capping can repeat a shape.

    def row_buckets(self, source_lengths: np.ndarray, target_lengths: np.ndarray) -> np.ndarray:
        """The smallest bucket each row fits.

        Args:
          source_lengths: `[n]` source tokens per row.
          target_lengths: `[n]` target tokens per row.

        Returns:
          `[n]` int64 bucket indices into `shapes`.

        Raises:
          ValueError: a row is longer than the largest bucket.
        """
        sources = np.array([s for s, _ in self.shapes])
        targets = np.array([t for _, t in self.shapes])
        buckets = np.maximum(
            np.searchsorted(sources, np.asarray(source_lengths), side="left"),
            np.searchsorted(targets, np.asarray(target_lengths), side="left"),
        )
        if buckets.size and buckets.max() >= len(self.shapes):
            raise ValueError(
                f"a row is longer than the largest length bucket {self.shapes[-1]}; "
                "the data layer must truncate rows to the max lengths."
            )
        return buckets.astype(np.int64)

    def group(
        self,
        lot: Lot,
        source_lengths: np.ndarray,
        target_lengths: np.ndarray,
        physical_batch_size: int,
    ) -> tuple[Lot, list[tuple[int, int]]]:
        """Orders a lot's rows by bucket and gives each micro-batch its shape.

        Args:
          lot: the sampled lot (fields, or indices only).
          source_lengths: `[n]` source tokens of the lot's rows, in lot order.
          target_lengths: `[n]` target tokens of the lot's rows, in lot order.
          physical_batch_size: b, rows per micro-batch.

        Returns:
          `(lot, shapes)`: the same rows stably sorted by bucket (a permutation:
          the same examples, each once), and the `(source, target)` shape of
          each of its ceil(n / b) micro-batches (`to_microbatches` order): the
          largest bucket among its rows; padding rows fit any shape.
        """
        buckets = self.row_buckets(source_lengths, target_lengths)
        order = np.argsort(buckets, kind="stable")
        grouped = Lot(
            indices=lot.indices[order],
            batch={name: values[order] for name, values in lot.batch.items()},
        )
        sorted_buckets = buckets[order]
        shapes = [
            self.shapes[int(sorted_buckets[start : start + physical_batch_size].max())]
            for start in range(0, sorted_buckets.size, physical_batch_size)
        ]
        return grouped, shapes


def padding_microbatches(
    buckets: LengthBuckets,
    field_specs: Mapping[str, tuple[tuple[int, ...], np.dtype]],
    physical_batch_size: int,
    pad_values: Mapping[str, int | float],
) -> list[dict[str, np.ndarray]]:
    """One all-padding micro-batch per bucket shape (mask 0): data-free warm-up.

    The training loop compiles the step for each (lowered on these rows,
    never run) before the first lot, so every bucket shape compiles up front.
    Which shapes compile, and when, then no longer depends on the private lots
    (compile times would otherwise show when a lot first needed a shape, in
    rates and in a compilation cache).

    Args:
      buckets: the run's length buckets.
      field_specs: field name -> (per-example shape, dtype), e.g.
        `TokenizedExamples.field_specs()`.
      physical_batch_size: b, rows per micro-batch.
      pad_values: fill value per field (`TokenizedExamples.pad_values`).

    Returns:
      One `[b, ...]` micro-batch per bucket, cropped to its shape, every row
      padding (`mask` 0, `example_index` -1).
    """
    b = physical_batch_size
    full = {
        name: np.full((b, *shape), pad_values.get(name, 0), dtype=dtype)
        for name, (shape, dtype) in field_specs.items()
    }
    full[MASK] = np.zeros((b,), np.float32)
    full[EXAMPLE_INDEX] = np.full((b,), PADDING_INDEX, np.int32)
    return [crop_to_shape(full, shape) for shape in buckets.shapes]


def crop_to_shape(fields: Mapping[str, np.ndarray], shape: tuple[int, int]) -> dict:
    """A micro-batch's token fields cut to `shape`; only padding positions go.

    Args:
      fields: `input_ids [b, S]`, `input_length [b]`, `labels [b, T]`,
        `label_length [b]` and any other `[b, ...]` fields (kept as they are).
      shape: `(source_length, target_length)` to cut to, at most (S, T).

    Returns:
      The fields with `input_ids [b, shape[0]]` and `labels [b, shape[1]]`.

    Raises:
      ValueError: a row is longer than the shape (cropping would cut tokens).
    """
    source_length, target_length = shape
    for name, length, limit in (
        (INPUT_LENGTH, fields[INPUT_LENGTH], source_length),
        (LABEL_LENGTH, fields[LABEL_LENGTH], target_length),
    ):
        if length.size and int(length.max()) > limit:
            raise ValueError(
                f"a row's {name} exceeds its length bucket ({limit} tokens): "
                "it would be truncated; this is a bug in the bucketing."
            )
    return {
        **fields,
        INPUT_IDS: np.ascontiguousarray(fields[INPUT_IDS][:, :source_length]),
        LABELS: np.ascontiguousarray(fields[LABELS][:, :target_length]),
    }


def auto_lengths(max_length: int) -> tuple[int, ...]:
    """A few bucket lengths up to `max_length`: 1/4, 1/2 and 3/4 of it (rounded up to 8), itself.

    Example: 48 -> (16, 24, 40, 48); 64 -> (16, 32, 48, 64); 16 -> (8, 16).
    """
    rounded = {_AUTO_MULTIPLE * math.ceil(max_length * f / _AUTO_MULTIPLE) for f in _AUTO_FRACTIONS}
    return tuple(sorted(n for n in rounded if n < max_length)) + (max_length,)


def parse_lengths(spec: str, max_source_length: int, max_target_length: int) -> tuple[int, ...]:
    """Bucket lengths from `data.length_buckets`; () for none.

    Args:
      spec: "auto" (`auto_lengths` of the longer max length), "none" or ""
        (no buckets), or comma-separated ascending token counts, e.g.
        "16,32,48"; the largest at least both max lengths.
      max_source_length: `data.max_source_length`.
      max_target_length: `data.max_target_length`.

    Returns:
      Ascending lengths, or () for no buckets.

    Raises:
      ValueError: a message naming `data.length_buckets` and the fix.
    """
    if not isinstance(spec, str):
        raise ValueError(f"{FIELD}={spec!r} must be a string: 'auto', 'none' or e.g. '16,32,48'.")
    text = spec.strip().lower()
    if text in ("", NONE):
        return ()
    if text == AUTO:
        return auto_lengths(max(max_source_length, max_target_length))
    try:
        lengths = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(
            f"{FIELD}={spec!r} is not 'auto', 'none' or comma-separated token counts "
            "such as '16,32,48'."
        ) from None
    _check_lengths(lengths, max_source_length, max_target_length, spec)
    return lengths


def resolve_length_buckets(
    spec: str, max_source_length: int, max_target_length: int, *, lengths_known: bool
) -> LengthBuckets | None:
    """The buckets a training run uses, or None (every micro-batch at the max lengths).

    Args:
      spec: `data.length_buckets` (see `parse_lengths`).
      max_source_length: `data.max_source_length`.
      max_target_length: `data.max_target_length`.
      lengths_known: whether every row's lengths are known before its fields
        are fetched (the train split tokenized up front). Per-lot tokenization
        knows them only after fetching, so "auto" means none there.

    Raises:
      ValueError: a bad spec, or explicit lengths while `lengths_known` is
        False (`length_bucket_problems` refuses that combination first).
    """
    lengths = parse_lengths(spec, max_source_length, max_target_length)
    if not lengths:
        return None
    if not lengths_known:
        if spec.strip().lower() == AUTO:
            logging.info(
                "Length buckets off: the train split is tokenized per lot, so row lengths "
                "are unknown until fetched (%s=auto); every micro-batch has the max lengths.",
                FIELD,
            )
            return None
        raise ValueError(
            f"{FIELD}={spec!r} needs row lengths before fetching; set "
            f"data.tokenize_train='upfront' or {FIELD}='none'."
        )
    buckets = LengthBuckets.from_lengths(lengths, max_source_length, max_target_length)
    logging.info("Length buckets (source, target tokens): %s.", list(buckets.shapes))
    return buckets


def _check_lengths(
    lengths: tuple[int, ...], max_source_length: int, max_target_length: int, shown: str = ""
):
    shown = shown or ",".join(map(str, lengths))
    longest = max(max_source_length, max_target_length)
    if not lengths or any(not isinstance(n, int) or n <= 0 for n in lengths):
        raise ValueError(f"{FIELD}={shown!r}: bucket lengths must be positive integers.")
    if any(b <= a for a, b in zip(lengths, lengths[1:], strict=False)):
        raise ValueError(f"{FIELD}={shown!r}: bucket lengths must be strictly ascending.")
    if lengths[-1] < longest:
        raise ValueError(
            f"{FIELD}={shown!r}: the largest bucket must cover the max lengths "
            f"(data.max_source_length={max_source_length}, data.max_target_length="
            f"{max_target_length}); end the list with {longest}."
        )


def length_bucket_problems(data, process_count: int) -> list[str]:
    """Problems of `data.length_buckets` (`data`: a `dpnmt.config.DataConfig`) on N processes."""
    spec = data.length_buckets
    max_source, max_target = data.max_source_length, data.max_target_length
    if not (isinstance(max_source, int) and isinstance(max_target, int)):
        return []  # Reported by the ranges.
    try:
        lengths = parse_lengths(spec, max_source, max_target)
    except ValueError as error:
        return [str(error)]
    mode = data.tokenize_train
    if lengths and data.tokenize_per_lot(process_count) and spec.strip().lower() != AUTO:
        return [
            f"{FIELD}={spec!r} needs every row's lengths before its lot is fetched, but the "
            f"train split is tokenized per lot (data.tokenize_train={mode!r}"
            f"{' on several processes' if mode == 'auto' else ''}); set "
            "data.tokenize_train='upfront' (every process tokenizes the whole split) or "
            f"{FIELD}='none'."
        ]
    return []
