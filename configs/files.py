"""Your own parallel data: set --config.data.corpus=files:<folder> and the pair.

The folder holds one of `<split>.tsv`, `<split>.jsonl` or `<split>.<lang>` per
split (README "Your own data and model"; dpnmt/data/corpora/files.py).
Defaults: a small T5 from scratch (T5 v1.0 layout: ReLU, tied embeddings) with a
DP-SentencePiece vocabulary. For Multi30K use configs/multi30k.py (its sizes and
DP hyper-parameters).
"""

from dpnmt import config_lib


def _customize(c):
    c.data.corpus = "files:data"
    c.data.pair = "de-en"
    c.data.validation_size = 500
    # T5 v1.0 layout, as configs/tiny.py: starts at ~log V (tests/models/test_init_loss.py).
    c.model.feed_forward_proj = "relu"


def get_config(arg=None):
    return config_lib.make_config(arg, _customize)
