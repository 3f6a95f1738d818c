"""Your own parallel data: set --config.data.corpus=files:<folder> and the pair.

The folder holds one of `<split>.tsv`, `<split>.jsonl` or `<split>.<lang>` per
split (docs/data.md "Your own data and model"; dpnmt/data/corpora/files.py).
Defaults: a small T5 from scratch (T5 v1.0 layout: ReLU, tied embeddings) with
the PUBLIC de+en vocabulary of configs/multi30k.py (8,000 pieces learnt from
Tatoeba de-en and the WMT sample under $DPNMT_DATA_DIR, no ε spent on it): a
DP-SentencePiece vocabulary learnt from a small corpus keeps only words found
in more than ~136 pairs (σ 20), so on 2,000 pairs it had 312 pieces and cut
most sentences to data.max_source_length (test BLEU 0). For another pair give
public text of that pair (`--config.tokenizer.public_corpora=<corpora>` or
`--config.tokenizer.public_text_paths=<files>`), a pretrained model
(`--config.model.name_or_path`), or, with tens of thousands of pairs,
`--config.tokenizer.kind=dp_sentencepiece` (its ε adds to the run's).
Below ~200 x its threshold pairs a DP vocabulary logs a note with the fixes
(docs/data.md, "A DP vocabulary on a small corpus").
For Multi30K use configs/multi30k.py (its sizes and DP hyper-parameters).
"""

from dpnmt import config_lib

# Public de-en text only: configs/multi30k.py's (built once, cached, shared).
PUBLIC_CORPORA = config_lib.sibling_config(__file__, "multi30k").PUBLIC_CORPORA


def _customize(c):
    c.data.corpus = "files:data"
    c.data.pair = "de-en"
    c.data.validation_size = 500
    c.tokenizer.kind = "sentencepiece_public"
    c.tokenizer.public_corpora = PUBLIC_CORPORA
    c.tokenizer.vocab_size = 8000
    # T5 v1.0 layout, as configs/tiny.py: starts at ~log V (tests/models/test_init_loss.py).
    c.model.feed_forward_proj = "relu"


def get_config(arg=None):
    return config_lib.make_config(arg, _customize)
