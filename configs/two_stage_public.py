"""Stage 1 of the two-stage recipe: non-private pre-training on public data.

The public corpus is the WMT de-en training sample (`$DPNMT_DATA_DIR/
wmt_sample_de_en`, 10,000 pairs of Europarl, web-crawled and news text, Moses-
tokenised); the private one in stage 2 (configs/two_stage_private.py) is
Multi30K de-en image captions. They come from different sources, and no line
of the sample is in Multi30K's train or validation split (checked after
normalisation); like the real case (a model pretrained on public general-domain
text, fine-tuned on private in-domain text), the domains differ. The
SentencePiece vocabulary is learnt from the public text only, so stage 2
spends no ε on a vocabulary. The model is configs/multi30k.py's (T5 v1.0
layout, 3+3 layers, d_model 256), so stage 2 compares with Multi30K from
scratch at equal size. Then export it:

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
    c.data.validation_size = 500  # Carved from the public train text: public too.
    c.data.detokenize = True
    c.data.max_source_length = 64
    c.data.max_target_length = 64
    c.tokenizer.kind = "sentencepiece_public"
    c.tokenizer.public_text_paths = tuple(
        os.path.join(data_dir, "wmt_sample_de_en", f"train.{lang}") for lang in ("de", "en")
    )
    c.tokenizer.vocab_size = 4000
    config_lib.small_t5_from_scratch(c.model)
    c.train.expected_lot_size = 128
    c.train.physical_batch_size = 32
    c.train.num_epochs = 4
    c.train.learning_rate = 2e-3
    c.train.warmup_steps = 40
    c.train.checkpoint_every_steps = 100
    c.eval.max_new_tokens = 64


def get_config(arg=None):
    return config_lib.public_stage_config(arg, _customize, "two_stage_public")
