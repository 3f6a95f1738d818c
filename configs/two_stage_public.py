"""SKETCH (not run yet): stage 1 of the two-stage recipe, public pre-training.

Non-private training of a small T5 on the public WMT de-en sample, with a
SentencePiece vocabulary learnt from that public text (no privacy spent on
either). Then export it for stage 2 (configs/two_stage_private.py):

    python -m dpnmt.train --config=configs/two_stage_public.py --workdir=runs/stage1
    python -m dpnmt.export --workdir=runs/stage1 --out=exported/stage1

Only `nonprivate` makes sense here (the data is public); other variants fail.
"""

import os

from dpnmt import config_lib


def _customize(c):
    data_dir = os.environ.get("DPNMT_DATA_DIR", "../shared/data")
    c.data.corpus = "wmt16"
    c.data.pair = "de-en"
    c.data.validation_size = 500
    c.data.detokenize = True
    c.tokenizer.kind = "sentencepiece_public"
    c.tokenizer.public_text_paths = tuple(
        os.path.join(data_dir, "wmt_sample_de_en", f"train.{lang}") for lang in ("de", "en")
    )
    c.tokenizer.vocab_size = 4000
    c.model.feed_forward_proj = "relu"
    c.train.expected_lot_size = 64
    c.train.num_epochs = 10
    c.train.learning_rate = 1e-3


def get_config(arg=None):
    config = config_lib.make_config(arg or "nonprivate", _customize)
    if config.dp.enabled:
        raise ValueError("two_stage_public is the public stage: use the nonprivate variant.")
    return config
