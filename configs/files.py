"""Your own parallel data: set --config.data.corpus=files:<folder> and the pair.

The folder holds one of `<split>.tsv`, `<split>.jsonl` or `<split>.<lang>` per
split (README "Your own data and model"; dpnmt/data/corpora/files.py).
Defaults: a small T5 from scratch with a DP-SentencePiece vocabulary.
"""

from dpnmt import config_lib


def _customize(c):
    c.data.corpus = "files:data"
    c.data.pair = "de-en"
    c.data.validation_size = 500


def get_config(arg=None):
    return config_lib.make_config(arg, _customize)
