"""Evaluation: translation by generation, and corpus metrics (BLEU, chrF, BERTScore).

Flow: `translate(model, params, tokenizer, sources, gen=..., batch_size=...,
max_source_length=...)` -> hypotheses (text) -> `corpus_bleu`, `corpus_chrf`,
`bertscore` against the references -> dicts of aggregates with signatures.
"""

from dpnmt.evaluation.metrics import (
    bertscore,
    corpus_bleu,
    corpus_chrf,
    default_bertscore_model,
    detokenize_moses,
)
from dpnmt.evaluation.translate import encode_sources, translate

__all__ = [
    "bertscore",
    "corpus_bleu",
    "corpus_chrf",
    "default_bertscore_model",
    "detokenize_moses",
    "encode_sources",
    "translate",
]
