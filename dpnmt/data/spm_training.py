"""Training a SentencePiece model with this project's options; its failures as one line.

Every SentencePiece model here (public, private, DP) is trained with
`sentencepiece_trainer_args` (ids pad=0, eos=1, unk=2, byte fallback, no
silent drops) through `train_model`, which turns SentencePiece's
"vocab_size smaller than required_chars" into a `ConfigError` naming the fix.
"""

import os
import re
from typing import Any

import sentencepiece as spm

from dpnmt.data.objectives import sentinel_pieces
from dpnmt.errors import ConfigError

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2


def sentencepiece_trainer_args(
    *,
    vocab_size: int,
    model_type: str,
    character_coverage: float,
    byte_fallback: bool,
    seed: int,
    sentinels: int = 0,
) -> dict[str, Any]:
    """Trainer options shared by every SentencePiece model here (ids pad=0, eos=1, unk=2).

    `sentinels` > 0 reserves T5's `<extra_id_i>` as control symbols (ids 3, 4, ...).
    """
    if model_type not in ("unigram", "bpe"):
        raise ValueError(f"model_type must be 'unigram' or 'bpe', not {model_type!r}.")
    spm.set_random_generator_seed(seed)
    extra = {"control_symbols": sentinel_pieces(sentinels)} if sentinels else {}
    return dict(
        **extra,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        byte_fallback=byte_fallback,
        pad_id=PAD_ID,
        eos_id=EOS_ID,
        unk_id=UNK_ID,
        bos_id=-1,
        hard_vocab_limit=False,  # Small corpora: a smaller vocabulary, not a crash.
        max_sentence_length=1 << 16,  # Never drop long lines silently.
        num_threads=max(1, min(4, os.cpu_count() or 1)),
        minloglevel=2,
        # SentencePiece's own DP option (enable_differential_privacy) stays off: it is
        # unseedable and deprecated in sentencepiece 0.2.3; dp_sentencepiece adds noise.
    )


def train_model(**kwargs) -> None:
    """`spm.SentencePieceTrainer.train(**kwargs)`; a too small vocab_size as a ConfigError."""
    try:
        spm.SentencePieceTrainer.train(**kwargs)
    except RuntimeError as error:
        clear = _too_small(error, kwargs.get("vocab_size"))
        if clear is None:
            raise
        raise clear from error


def _too_small(error: RuntimeError, vocab_size) -> ConfigError | None:
    """SentencePiece's "smaller than required_chars" as one line naming the fix; else None."""
    found = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", str(error))
    if not found:
        return None
    return ConfigError(
        f"tokenizer.vocab_size={vocab_size} is too small for this text: SentencePiece needs a "
        f"piece for each of its characters and the special pieces ({found.group(2)} here). "
        "Raise tokenizer.vocab_size (--vocab_size in dpnmt.public_vocab), e.g. to 8000."
    )
