"""Business Scene Dialogue ja-en, pretrained mT5-small, DP fine-tuning.

Offline (no train.json in the shared copy) say which split to train on:
`--config.data.bsd_train_split=dev` (the loader refuses to guess).
"""

from dpnmt import config_lib


def _customize(c):
    c.data.corpus = "bsd"
    c.data.pair = "ja-en"
    c.data.max_source_length = 96
    c.data.max_target_length = 96
    c.model.name_or_path = "google/mt5-small"
    c.tokenizer.kind = "pretrained"
    # Read only with --config.dp.unit=group (a group: one dialogue; dev.json has 69):
    c.dp.group_cap = 8  # k: at most 8 of a dialogue's turns join a lot.
    c.dp.group_lot_size = 8  # L_groups: expected dialogues a lot (dev: q = 8/69).
    c.train.expected_lot_size = 1024
    c.train.physical_batch_size = 16
    c.train.num_epochs = 10
    c.eval.max_new_tokens = 96


def get_config(arg=None):
    return config_lib.make_config(arg, _customize)
