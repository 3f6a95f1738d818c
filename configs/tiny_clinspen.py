"""Tiny offline config on ClinSpEn-CC es-en: configs/tiny.py's small T5 from scratch.

The shared ClinSpEn-CC copy (WMT22 biomedical, clinical case reports): 968
training pairs, its 97 dev pairs for validation and 2,870 test pairs, raw text
(no detokenisation). A DP-SentencePiece vocabulary is learnt from the training
pairs (its ε is composed with DP-SGD's in the report). Variants as configs/tiny.py.
"""

from dpnmt import config_lib


def _customize(c):
    c.data.corpus = "clinspen"
    c.data.pair = "es-en"
    c.data.detokenize = False
    c.data.max_source_length = 64
    c.data.max_target_length = 64
    c.data.max_eval_examples = 97
    c.tokenizer.kind = "dp_sentencepiece"
    c.tokenizer.vocab_size = 1000
    c.tokenizer.dp_noise_stddev = 10.0
    c.tokenizer.dp_max_words = 32
    c.model.feed_forward_proj = "relu"  # T5 v1.0 layout, as configs/tiny.py.
    c.train.learning_rate = 3e-3
    c.train.expected_lot_size = 64
    c.train.physical_batch_size = 32
    c.train.num_epochs = 1
    c.train.eval_every_steps = 5
    c.train.checkpoint_every_steps = 5
    c.train.log_every_steps = 5
    c.eval.max_new_tokens = 64
    c.eval.batch_size = 32


def get_config(arg=None):
    return config_lib.make_config(arg, _customize)
