"""The public stage: non-private training on PUBLIC de-en text, Multi30K's vocabulary.

Train is the mixture of Tatoeba de-en (47,838 pairs of short everyday
sentences) and the WMT sample (9,500 pairs, Moses-detokenised: `detok:`),
weight 1 each (`data.corpus_weights`), shuffled; validation (1,105) and test
(1,059) are Tatoeba's. No line of either is in Multi30K. The vocabulary is
configs/multi30k.py's public one (the same corpora and options: the same
cached model), and so is the model (T5 v1.0, 3+3 layers, d_model 256), so a
Multi30K run can start from this one. Sized for a CPU: 4 epochs of ~450 lots
of 128. Export it for the private stage:

    python -m dpnmt.train --config=configs/public_de_en.py --workdir=runs/public_de_en
    python -m dpnmt.export --workdir=runs/public_de_en --out=exported/public_de_en

Only `nonprivate` (the default) makes sense: the data is public, and a DP run
over several corpora is refused.
"""

from dpnmt import config_lib

multi30k = config_lib.sibling_config(__file__, "multi30k")


def _customize(c):
    c.data.corpus = multi30k.PUBLIC_CORPORA  # Tatoeba first: validation and test.
    c.data.corpus_weights = (1.0, 1.0)
    c.data.pair = "de-en"
    c.data.max_source_length = 64  # WMT sentences are long (Tatoeba's ~8 pieces).
    c.data.max_target_length = 64
    c.data.max_eval_examples = 200
    multi30k.public_vocabulary(c)
    c.data.length_buckets = "16,32,48,64"
    config_lib.small_t5_from_scratch(c.model)
    c.train.expected_lot_size = 128
    c.train.physical_batch_size = 32
    c.train.num_epochs = 4
    c.train.learning_rate = 2e-3
    c.train.warmup_steps = 40
    c.train.label_smoothing = 0.1
    c.train.checkpoint_every_steps = 100
    c.eval.max_new_tokens = 64
    c.eval.batch_size = 64


def get_config(arg=None):
    config = config_lib.make_config(arg or "nonprivate", _customize)
    if config.dp.enabled:
        raise ValueError("public_de_en is the public stage: use the nonprivate variant.")
    return config
