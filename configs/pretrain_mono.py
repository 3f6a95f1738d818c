"""Pre-training on monolingual text (issue 32): Multi30K's English side, public.

A tiny T5 (configs/tiny.py's size) trained with T5 span corruption or prefix LM
on the English captions of Multi30K (`files:multi30k`, `data.objective_language
= "en"`; the German side is not read), non-private or at ε = 8 treating the
captions AS IF private (one caption = one example = the unit of privacy). Its
vocabulary is public SentencePiece learnt from Tatoeba de-en (another public
corpus, so the ε = 8 run's text never shapes it), with 16 T5 sentinels.

Variants: an objective, `span` (default) or `prefix`, and a privacy variant,
`eps8` (default) or `nonprivate` (and the other `config_lib` ones), e.g.

    python -m dpnmt.train --config=configs/pretrain_mono.py:prefix,nonprivate \
      --workdir=runs/pretrain_mono_prefix_nonprivate

Lots: `train.expected_lot_size` examples a lot in micro-batches of
`train.physical_batch_size` (accumulated; one noise draw a lot), so L in the
thousands is a config change (e.g. --config.train.expected_lot_size=4096).
"""

from dpnmt import config_lib

OBJECTIVES = {"span": "span_corruption", "prefix": "prefix_lm"}


def _customize(c, objective: str):
    c.data.corpus = "files:multi30k"
    c.data.pair = "en-de"
    c.data.objective = objective
    c.data.objective_language = "en"
    c.data.max_source_length = c.data.max_target_length = 64
    c.data.max_eval_examples = 64
    c.tokenizer.kind = "sentencepiece_public"
    c.tokenizer.public_corpora = "files:tatoeba_de_en"
    c.tokenizer.vocab_size = 1000
    c.tokenizer.sentinels = 16
    c.model.feed_forward_proj = "relu"  # configs/tiny.py's T5 v1.0 layout.
    c.train.learning_rate = 3e-3
    c.train.expected_lot_size = 256
    c.train.physical_batch_size = 32
    c.train.num_epochs = 1
    c.train.eval_every_steps = 20
    c.train.checkpoint_every_steps = 20
    c.train.log_every_steps = 5
    c.eval.max_new_tokens = 64
    c.eval.batch_size = 32


def get_config(arg=None):
    chosen, rest = config_lib.one_variant(arg, sorted(OBJECTIVES), "span", "objective")
    config = config_lib.make_config(rest, lambda c: _customize(c, OBJECTIVES[chosen]))
    config.variant = arg or ""
    return config
