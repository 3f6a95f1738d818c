"""Fixtures for data tests: generated text (no network, no shared data needed)."""

import numpy as np
import pytest

from dpnmt.data import tokenizers

_SYLLABLES = ["ka", "to", "mi", "ne", "ru", "sa", "po", "li", "da", "ve", "zo", "fu", "gi", "he"]


def generated_sentences(num_sentences: int, seed: int) -> list[str]:
    """Sentences of pseudo-words drawn Zipf-like from a fixed 400-word list."""
    rng = np.random.default_rng(seed)
    words = sorted({"".join(rng.choice(_SYLLABLES, size=rng.integers(1, 4))) for _ in range(2000)})[
        :400
    ]
    weights = 1.0 / np.arange(1, len(words) + 1)
    weights /= weights.sum()
    lengths = rng.integers(3, 15, size=num_sentences)
    return [" ".join(rng.choice(words, size=n, p=weights)) for n in lengths]


@pytest.fixture(scope="session")
def public_text_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("public") / "public.txt"
    path.write_text("\n".join(generated_sentences(3000, seed=1)) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="session")
def spm_tokenizer(public_text_file) -> tokenizers.SentencePieceTokenizer:
    tokenizer, _ = tokenizers.train_sentencepiece([public_text_file], vocab_size=600, seed=0)
    return tokenizer
