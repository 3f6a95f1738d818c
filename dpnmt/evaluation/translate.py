"""Translate sentences by autoregressive generation in fixed-shape batches.

This is the only path to hypotheses for BLEU: the model generates with
`dpnmt.models.decoding.generate` (greedy or beam search, no teacher forcing).
Every batch has the shape [batch_size, max_source_length] — the last one is
filled up with dummy rows whose outputs are discarded — so one compiled
function serves the whole corpus. Sentences are decoded longest first (a batch
stops once all its rows end) and returned in input order.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

import chex
import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import tqdm
from absl import logging

from dpnmt import distributed
from dpnmt.data.tokenizers import Tokenizer
from dpnmt.models.decoding import GenerationConfig, generate


def encode_sources(
    tokenizer: Tokenizer,
    sources: Sequence[str] | Sequence[Sequence[int]],
    *,
    max_source_length: int,
    source_prefix: str = "",
) -> tuple[list[list[int]], int]:
    """Source token ids, each at most `max_source_length` long.

    Args:
        tokenizer: Encodes text sources (ends each with eos).
        sources: Sentences, or already-encoded token-id lists.
        max_source_length: Longest id list allowed, eos included.
        source_prefix: Text put before every sentence (e.g. T5's
            "translate German to English: "); text sources only.

    Returns:
        (id lists, number of text sources truncated to max_source_length).

    Raises:
        ValueError: Mixed text and ids, a prefix with id sources, an empty id list,
            or an id list longer than max_source_length.
    """
    if not sources:
        return [], 0
    is_text = [isinstance(source, str) for source in sources]
    if all(is_text):
        texts = [source_prefix + source for source in sources]
        ids = tokenizer.encode(texts)
        too_long = [i for i, row in enumerate(ids) if len(row) > max_source_length]
        if too_long:
            # The tokenizer truncates itself, keeping its special tokens.
            truncated = tokenizer.encode([texts[i] for i in too_long], max_length=max_source_length)
            for i, row in zip(too_long, truncated, strict=True):
                ids[i] = row
        return [list(row) for row in ids], len(too_long)
    if any(is_text):
        raise ValueError("sources mixes strings and token-id lists; give one kind.")
    if source_prefix:
        raise ValueError(
            "source_prefix applies to text sources only; prepend its ids to the id lists instead."
        )
    ids = [[int(i) for i in row] for row in sources]
    for index, row in enumerate(ids):
        if not row or len(row) > max_source_length:
            raise ValueError(
                f"sources[{index}] has {len(row)} token ids; each id list needs 1 to "
                f"max_source_length={max_source_length} ids (truncate it, keeping eos)."
            )
    return ids, 0


def _batch_arrays(
    rows: Sequence[Sequence[int]], batch_size: int, max_source_length: int, pad_id: int, eos_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """[batch_size, max_source_length] int32 ids and mask; rows beyond len(rows) are dummies.

    A dummy row is a lone eos (mask 1 on it): a well-formed input whose output is
    thrown away, so it cannot disturb numerics or the real rows.
    """
    input_ids = np.full((batch_size, max_source_length), pad_id, np.int32)
    attention_mask = np.zeros((batch_size, max_source_length), np.int32)
    for r, row in enumerate(rows):
        input_ids[r, : len(row)] = row
        attention_mask[r, : len(row)] = 1
    input_ids[len(rows) :, 0] = eos_id
    attention_mask[len(rows) :, 0] = 1
    return input_ids, attention_mask


def translate(
    model: nn.Module,
    params: chex.ArrayTree,
    tokenizer: Tokenizer,
    sources: Sequence[str] | Sequence[Sequence[int]],
    *,
    gen: GenerationConfig,
    batch_size: int,
    max_source_length: int,
    source_prefix: str = "",
    show_progress: bool | None = None,
) -> list[str]:
    """Generates a translation for every source sentence.

    Args:
        model: T5ForConditionalGeneration or MBartForConditionalGeneration.
        params: Its parameters.
        tokenizer: Encodes text sources and decodes outputs (`Tokenizer` protocol).
        sources: [num_sentences] sentences, or token-id lists ending in eos.
        gen: Decoding settings (greedy when num_beams == 1, else beam search).
        batch_size: Sentences per generate call (fixed; the last batch is padded
            with dummy rows that are discarded).
        max_source_length: Source positions per row (fixed); longer text sources
            are truncated by the tokenizer and counted in the log.
        source_prefix: Text put before every text source.
        show_progress: Progress bar; None shows it when there is more than one batch
          (on process 0 only). Only ever on a terminal (stderr a TTY).

    Returns:
        [num_sentences] decoded translations, in the order of `sources`.

    Raises:
        ValueError: batch_size or max_source_length below 1, or bad `sources`
            (see `encode_sources`).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1.")
    if max_source_length < 1:
        raise ValueError(f"max_source_length={max_source_length} must be >= 1.")
    ids, num_truncated = encode_sources(
        tokenizer, sources, max_source_length=max_source_length, source_prefix=source_prefix
    )
    if num_truncated:
        logging.info(
            "translate: %d of %d sources truncated to max_source_length=%d tokens.",
            num_truncated,
            len(ids),
            max_source_length,
        )
    if not ids:
        return []

    # Longest first: a batch of similar lengths stops generating sooner.
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    if show_progress is None:  # In a multi-process run, process 0 alone shows it.
        show_progress = len(batches) > 1 and distributed.is_primary()
    translations: list[str | None] = [None] * len(ids)
    started = time.perf_counter()

    terminal = sys.stderr.isatty()  # A log file gets no carriage-return bars.
    with tqdm.tqdm(
        total=len(ids), unit="sent", desc="translate", disable=not (show_progress and terminal)
    ) as progress:

        def collect(indices: list[int], tokens: chex.Array) -> None:
            # Only real rows are decoded; dummy rows are dropped here.
            texts = tokenizer.decode(np.asarray(tokens)[: len(indices)].tolist())
            for index, text in zip(indices, texts, strict=True):
                translations[index] = text
            progress.update(len(indices))

        pending = None  # (indices, device tokens) of the batch in flight.
        for indices in batches:
            input_ids, attention_mask = _batch_arrays(
                [ids[i] for i in indices],
                batch_size,
                max_source_length,
                tokenizer.pad_id,
                tokenizer.eos_id,
            )
            tokens, _ = generate(
                model, params, jnp.asarray(input_ids), jnp.asarray(attention_mask), gen
            )
            # Dispatch is asynchronous: decode the previous batch while this one runs.
            if pending is not None:
                collect(*pending)
            pending = (indices, tokens)
        collect(*pending)

    seconds = time.perf_counter() - started
    logging.info(
        "translate: %d sentences in %d batches of %d, %.1f s (%.1f sentences/s).",
        len(ids),
        len(batches),
        batch_size,
        seconds,
        len(ids) / max(seconds, 1e-9),
    )
    return translations
