"""WMT-16 de-en (the paper's main corpus): pretrained mT5-small, DP fine-tuning.

Online: the hub's `wmt/wmt16` and `google/mt5-small`. Offline: set
`--config.data.dir` to the shared `wmt_sample_de_en` (10k tokenised pairs) and
`--config.model.name_or_path` to a local checkpoint directory. The paper's
Poisson setting is L = 524,288 of N = 4,551,054 for 7 epochs at δ = 1e-8.
"""

from dpnmt import config_lib


def _customize(c):
    c.data.corpus = "wmt16"
    c.data.pair = "de-en"
    c.data.max_source_length = 128
    c.data.max_target_length = 128
    c.data.detokenize = True  # The offline sample is Moses-tokenised.
    c.model.name_or_path = "google/mt5-small"
    c.model.family = "t5"
    c.tokenizer.kind = "pretrained"
    c.train.expected_lot_size = 524_288
    c.train.physical_batch_size = 32
    c.train.num_epochs = 7
    c.train.optimizer = "adam"
    c.train.learning_rate = 1e-3
    c.train.eval_every_steps = 5
    c.eval.max_new_tokens = 128
    c.eval.num_beams = 4


def get_config(arg=None):
    return config_lib.make_config(arg, _customize)
