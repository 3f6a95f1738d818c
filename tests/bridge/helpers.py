"""Small synthetic datasets shared by the bridge tests."""

import numpy as np

from dpnmt.bridge import TokenizedExamples

VOCAB_SIZE = 50
MAX_SOURCE_LENGTH = 6
MAX_TARGET_LENGTH = 5
PAD_ID = 1


def random_pairs(num_examples: int, seed: int = 0) -> TokenizedExamples:
    """`num_examples` random pairs with lengths 1..max, padded with PAD_ID."""
    rng = np.random.default_rng(seed)
    source = [
        rng.integers(2, VOCAB_SIZE, rng.integers(1, MAX_SOURCE_LENGTH + 1))
        for _ in range(num_examples)
    ]
    target = [
        rng.integers(2, VOCAB_SIZE, rng.integers(1, MAX_TARGET_LENGTH + 1))
        for _ in range(num_examples)
    ]
    return TokenizedExamples(
        source,
        target,
        max_source_length=MAX_SOURCE_LENGTH,
        max_target_length=MAX_TARGET_LENGTH,
        pad_id=PAD_ID,
    )
