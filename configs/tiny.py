"""Tiny offline config: a small T5 from scratch on the shared WMT de-en sample.

9,500 training pairs (Moses-tokenised; BLEU is computed on detokenised text), a
DP-SentencePiece vocabulary learnt from them (its ε is composed with DP-SGD's in
the report). Finishes on 2 CPU cores in minutes. Variants: eps1, eps5, eps8
(default), eps1000, nonprivate; poisson (default when private) or shuffle.
"""

from dpnmt import config_lib


def _customize(c):
    c.data.corpus = "wmt16"
    c.data.pair = "de-en"
    c.data.validation_size = 500
    c.data.detokenize = True
    c.data.max_source_length = 64
    c.data.max_target_length = 64
    c.data.max_eval_examples = 64
    c.tokenizer.kind = "dp_sentencepiece"
    c.tokenizer.vocab_size = 1000
    c.tokenizer.dp_noise_stddev = 10.0
    c.tokenizer.dp_max_words = 32
    # T5 v1.0 layout (ReLU, tied embeddings scaled by d_model**-0.5): a sane
    # initial loss (~log vocab) for a model trained from scratch.
    c.model.feed_forward_proj = "relu"
    c.train.learning_rate = 3e-3
    c.train.expected_lot_size = 256
    c.train.physical_batch_size = 32
    c.train.num_epochs = 1
    c.train.eval_every_steps = 10
    c.train.checkpoint_every_steps = 10
    c.train.log_every_steps = 5
    c.eval.max_new_tokens = 64
    c.eval.batch_size = 32


def get_config(arg=None):
    return config_lib.make_config(arg, _customize)
