"""Print a corpus's split sizes, token-length percentiles, drops and examples.

    python -m dpnmt.data.inspect --corpus=wmt16 --pair=de-en \
        --tokenizer=spm:/path/to/model.model --family=t5

--tokenizer is "spm:<file.model>" (SentencePiece), "hf:<path or hub id>"
(transformers; mBART codes set from --pair when --family=mbart), or
"public:<text file>" (SentencePiece trained on that public text now).
The full ml_collections config arrives later; this app takes plain flags.
"""

from collections.abc import Sequence

import numpy as np
from absl import app, flags

from dpnmt.data import corpora, languages, preprocess, tokenizers

_CORPUS = flags.DEFINE_string("corpus", "wmt16", "wmt16, bsd, clinspen, hub:<id>, files:<dir>.")
_PAIR = flags.DEFINE_string("pair", "de-en", "Direction, e.g. de-en.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Local corpus folder (else $DPNMT_DATA_DIR).")
_BSD_TRAIN_SPLIT = flags.DEFINE_string("bsd_train_split", None, "bsd only: 'train' or 'dev'.")
_TOKENIZER = flags.DEFINE_string("tokenizer", None, "spm:<model>, hf:<path>, public:<text>.")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 8000, "For public:<text> tokenizers.")
_FAMILY = flags.DEFINE_enum("family", "none", list(preprocess.FAMILIES), "Model family.")
_MAX_SOURCE = flags.DEFINE_integer("max_source_length", 128, "Source ids per example.")
_MAX_TARGET = flags.DEFINE_integer("max_target_length", 128, "Target ids per example.")
_NUM_EXAMPLES = flags.DEFINE_integer("num_examples", 3, "Examples printed per split.")


def make_tokenizer(spec: str, family: str, pair: languages.LanguagePair) -> tokenizers.Tokenizer:
    """Builds a tokenizer from a "kind:path" flag value."""
    kind, _, path = spec.partition(":")
    if kind == "spm":
        return tokenizers.SentencePieceTokenizer.load(path)
    if kind == "hf":
        codes = languages.mbart_codes(pair) if family == "mbart" else (None, None)
        return tokenizers.load_pretrained_tokenizer(path, src_lang=codes[0], tgt_lang=codes[1])[0]
    if kind == "public":
        return tokenizers.train_sentencepiece([path], vocab_size=_VOCAB_SIZE.value)[0]
    raise app.UsageError(f"--tokenizer {spec!r}: use spm:<model>, hf:<path> or public:<text>.")


def main(argv: Sequence[str]) -> None:
    """Loads the corpus, optionally tokenizes it, and prints the summary."""
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    pair = languages.parse_pair(_PAIR.value)
    kwargs = {}
    if _DATA_DIR.value is not None:
        kwargs["data_dir"] = _DATA_DIR.value
    if _BSD_TRAIN_SPLIT.value is not None:
        kwargs["train_split"] = _BSD_TRAIN_SPLIT.value
    corpus = corpora.load_corpus(_CORPUS.value, pair, **kwargs)
    print(f"corpus {_CORPUS.value} {pair}")
    for split, dataset in corpus.items():
        print(f"  {split:<10} {len(dataset):>9,d} pairs  ({dataset.info.description})")
    if _TOKENIZER.value is None:
        for split, dataset in corpus.items():
            for row in dataset.select(range(min(_NUM_EXAMPLES.value, len(dataset))))["translation"]:
                print(f"  [{split}] {row[pair.source]!r} -> {row[pair.target]!r}")
        return
    tokenizer = make_tokenizer(_TOKENIZER.value, _FAMILY.value, pair)
    processed, stats = preprocess.preprocess(
        corpus,
        tokenizer,
        pair=pair,
        family=_FAMILY.value,
        max_source_length=_MAX_SOURCE.value,
        max_target_length=_MAX_TARGET.value,
    )
    print(f"tokenizer {tokenizer.fingerprint} vocab {tokenizer.vocab_size}")
    print(f"source prefix {stats.source_prefix!r}")
    percentiles = (50, 90, 95, 99, 100)
    for split, dataset in processed.items():
        s = stats.splits[split]
        print(
            f"{split}: kept {s.num_kept:,d}/{s.num_examples:,d}, dropped {s.num_dropped:,d} "
            f"(empty source {s.num_empty_source:,d}, empty target {s.num_empty_target:,d}), "
            f"truncated source {s.num_source_truncated:,d}, target {s.num_target_truncated:,d}"
        )
        for side in ("source", "target"):
            lengths = np.asarray(dataset[f"{side}_full_length"])
            if lengths.size:
                values = np.percentile(lengths, percentiles).astype(int)
                table = ", ".join(f"p{p}={v}" for p, v in zip(percentiles, values, strict=True))
                print(f"  {side} tokens before truncation: {table}")
        for row in dataset.select(range(min(_NUM_EXAMPLES.value, len(dataset)))):
            source, target = tokenizer.decode([row["input_ids"], row["labels"]])
            print(f"  [{split}] {source!r} -> {target!r}")


if __name__ == "__main__":
    app.run(main)
