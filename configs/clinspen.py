"""ClinSpEn-CC es-en (WMT22 biomedical), pretrained mT5-small, DP fine-tuning."""

from dpnmt import config_lib


def _customize(c):
    c.data.corpus = "clinspen"
    c.data.pair = "es-en"
    c.data.max_source_length = 128
    c.data.max_target_length = 128
    c.model.name_or_path = "google/mt5-small"
    c.tokenizer.kind = "pretrained"
    # Read only with --config.dp.unit=group (a group: one case report; 42 in train):
    c.dp.group_cap = 8  # k: at most 8 of a report's pairs join a lot (median 21).
    c.dp.group_lot_size = 8  # L_groups: 8 of 42 reports a lot (q = 8/42), <= 64 pairs.
    c.train.expected_lot_size = 128
    c.train.physical_batch_size = 16
    c.train.num_epochs = 10
    c.eval.max_new_tokens = 128


def get_config(arg=None):
    return config_lib.make_config(arg, _customize)
