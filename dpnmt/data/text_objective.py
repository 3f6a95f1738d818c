"""A pre-training objective applied to a corpus: monolingual rows, seeded per text.

`data.objective` = "span_corruption" or "prefix_lm" turns each text of one
language (`monolingual_corpus`) into a seq2seq example with
`dpnmt.data.objectives`; `TextObjective` is what the tokenizer's encoder calls.

Randomness: the generator of a text is seeded with SHA-256(b"dpnmt-objective",
the PUBLIC `data.objective_seed` (8 bytes), the text's int64 token ids), so an
example is a deterministic public function of its own text: the same on every
process, on a resumed run, whether train is tokenized up front or per lot, in
decode (zero-shot included), noise-to-signal, the memorization audit and a
published copy of the run (no `private/` needed), and independent of every
other text (no position in the split enters it; adding or removing one text
changes one example). The seed is public by design: DP-SGD's guarantee holds
for any fixed per-example map x -> f(x), as for tokenization, so a secret seed
buys nothing; and since validation/test scores and decoded hypotheses (which
show the masked tokens) are published, a secret seed would leak through them.
A text's corruption is drawn once per run, not per epoch (T5 redraws it each
time a text is seen); duplicated texts get the same corruption.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import datasets
import numpy as np

from dpnmt.data import objectives

_DOMAIN = b"dpnmt-objective"  # Separates these draws from any other use of SHA-256.


def example_unit(data) -> str:
    """What one training example of a run is, in words (results.json's privacy "example").

    Args:
      data: the run's `DataConfig`.
    """
    if data.objective == "translation":
        return "one sentence pair"
    return (
        f"one text (a line of {data.text_language} text; data.objective={data.objective}, "
        "its example built from that text alone)"
    )


def monolingual_corpus(corpus: datasets.DatasetDict, language: str) -> datasets.DatasetDict:
    """Every split with both sides of each row set to its `language` text.

    The row count and order are kept (a row empty in `language` is dropped by
    preprocessing, counted as empty); the other language's text is discarded.
    """
    out = {}
    for name, split in corpus.items():

        def mono(batch, pair=tuple(split.features["translation"])):
            rows = batch["translation"]
            return {"translation": [{lang: row[language] for lang in pair} for row in rows]}

        out[name] = split.map(mono, batched=True, desc=f"monolingual {name} ({language})")
    return datasets.DatasetDict(out)


def sentinel_ids(tokenizer, count: int) -> list[int]:
    """A tokenizer's first `count` T5 sentinels (`objectives.find_sentinel_ids`).

    Raises:
      ValueError: the tokenizer lacks them (naming `tokenizer.sentinels`).
    """
    piece_id = getattr(tokenizer, "piece_id", None)
    if piece_id is None:
        raise ValueError(
            f"A {type(tokenizer).__name__} tokenizer has no sentinel lookup; span corruption "
            "needs a SentencePiece or transformers tokenizer."
        )
    return objectives.find_sentinel_ids(piece_id, count, vocabulary="The run's tokenizer")


class TextObjective:
    """Maps one text's ids (no eos) to (inputs, targets) by `data.objective`.

    `seed`: the public `data.objective_seed` (not a secret: see the module docstring).
    """

    def __init__(
        self,
        name: str,
        seed: int,
        *,
        sentinel_ids: Sequence[int] = (),
        noise_density: float = 0.15,
        mean_span_length: float = 3.0,
        prefix_min_fraction: float = 0.0,
        prefix_max_fraction: float = 1.0,
    ):
        """Keeps the objective's name ("span_corruption" or "prefix_lm") and options."""
        if name not in objectives.OBJECTIVES[1:]:
            raise ValueError(
                f"data.objective={name!r} is no pre-training objective; use one of "
                f"{objectives.OBJECTIVES[1:]}."
            )
        self.name = name
        self._seed = int(seed)
        if not 0 <= self._seed < 2**63:
            raise ValueError(f"data.objective_seed={seed} must lie in [0, 2**63).")
        self._sentinels = list(sentinel_ids)
        self._span = dict(noise_density=noise_density, mean_span_length=mean_span_length)
        self._prefix = dict(min_fraction=prefix_min_fraction, max_fraction=prefix_max_fraction)

    def __repr__(self) -> str:
        return f"TextObjective({self.name!r}, seed={self._seed})"

    def options(self) -> dict:
        """Every parameter the examples depend on (preprocessing's cache key)."""
        return {
            "name": self.name,
            "seed": self._seed,
            "sentinel_ids": [int(i) for i in self._sentinels],
            **self._span,
            **{f"prefix_{k}": v for k, v in self._prefix.items()},
        }

    def rng(self, ids: np.ndarray) -> np.random.Generator:
        """The text's generator: SHA-256(b"dpnmt-objective" ‖ seed (8 bytes) ‖ int64 ids)."""
        text = np.asarray(ids, "<i8").tobytes()
        digest = hashlib.sha256(_DOMAIN + self._seed.to_bytes(8, "little") + text).digest()
        return np.random.default_rng(int.from_bytes(digest, "little"))

    def __call__(self, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, targets) of one text's ids (no eos); see `dpnmt.data.objectives`."""
        ids = np.asarray(ids, np.int64)
        if self.name == "span_corruption":
            return objectives.span_corruption(
                ids, self.rng(ids), sentinel_ids=self._sentinels, **self._span
            )
        return objectives.prefix_lm(ids, self.rng(ids), **self._prefix)

    def encode(self, tokenizer, texts: Sequence[str], max_source: int, max_target: int):
        """(input_ids, labels, source full lengths, target full lengths) of `texts`.

        Each text's ids (`tokenizer.encode`, the trailing eos dropped) are cut to max_source - 1
        ids, goes through the objective, and gets eos on both sides; the target is
        cut to max_target ids (eos kept). Full lengths: the text's ids + eos
        (source), the uncut target + eos (target).
        """
        eos, input_ids, labels, source_full, target_full = tokenizer.eos_id, [], [], [], []
        for row in tokenizer.encode(texts):
            text = list(row[:-1]) if row and row[-1] == eos else list(row)
            inputs, targets = self(text[: max_source - 1])
            input_ids.append(inputs.tolist() + [eos])
            labels.append(targets[: max_target - 1].tolist() + [eos])
            source_full.append(len(text) + 1)
            target_full.append(len(targets) + 1)
        return input_ids, labels, source_full, target_full
