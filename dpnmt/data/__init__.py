"""Data layer: corpora, tokenizers (including DP-SentencePiece) and preprocessing.

Flow: `corpora.load_corpus(name, pair)` -> DatasetDict of {"translation": {src, tgt}};
a tokenizer from `tokenizers` or `dp_sentencepiece` (with its VocabularyRecord);
`preprocess.preprocess(corpus, tokenizer, ...)` -> ids plus PreprocessStats (the
submodule `dpnmt.data.preprocess`; its function is not re-exported, to keep the
module name free).
"""

from dpnmt.data.corpora import corpus_pair, load_corpus
from dpnmt.data.dp_sentencepiece import DPVocabularyParams, train_dp_sentencepiece
from dpnmt.data.languages import LanguagePair, parse_pair
from dpnmt.data.preprocess import PreprocessStats, SplitStats
from dpnmt.data.tokenizers import (
    HFTokenizer,
    SentencePieceTokenizer,
    Tokenizer,
    VocabularyRecord,
    load_pretrained_tokenizer,
    train_private_sentencepiece,
    train_sentencepiece,
)

__all__ = [
    "DPVocabularyParams",
    "HFTokenizer",
    "LanguagePair",
    "PreprocessStats",
    "SentencePieceTokenizer",
    "SplitStats",
    "Tokenizer",
    "VocabularyRecord",
    "corpus_pair",
    "load_corpus",
    "load_pretrained_tokenizer",
    "parse_pair",
    "train_dp_sentencepiece",
    "train_private_sentencepiece",
    "train_sentencepiece",
]
