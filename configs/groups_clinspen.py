"""ClinSpEn-CC es-en per pair vs per case report (issue 31): a small T5 from scratch.

The groups table's ClinSpEn rows (docs/privacy.md, "Per pair or per group:
measured"). ClinSpEn's 968 training pairs come from 42 clinical case reports
(8-55 pairs each): per pair (default) a lot is Poisson-sampled pairs, L = 64,
10 epochs (T = 151); with the extra variant `group` (dp.unit=group) a lot is
Poisson-sampled case reports, L = 8 of 42, each adding at most k = 8 of its
pairs (64 pairs a lot on average, as per pair: every report has >= 8), 29
epochs (T = 152). Both at the same target ε per unit, δ = 1e-8, C = 1.

The vocabulary is learnt from the private training pairs WITHOUT noise
(`sentencepiece_private`: no public es-en text is offline, and DP-SentencePiece
is per pair, refused with dp.unit=group): it is outside the guarantee, the
reported total ε is ∞, in both rows alike. Model: configs/tiny.py's (T5 v1.0,
2+2 layers, d_model 128). Test: the first 1,000 of ClinSpEn's 2,870 test pairs.

    python -m dpnmt.train --config=configs/groups_clinspen.py:eps8 --workdir=../g/cl-pair
    python -m dpnmt.train --config=configs/groups_clinspen.py:eps8,group --workdir=../g/cl-group
"""

from dpnmt import config_lib

GROUP_VARIANT = "group"
GROUP_CAP = 8  # k: pairs one sampled group adds at most (ClinSpEn's median is 21).


def make(arg, customize, *, pair_lot_epochs, group_lot_epochs):
    """`customize`'s config; variant `group` sets dp.unit=group and its epochs.

    Both variants state both lots: train.expected_lot_size (pairs, read per pair)
    and dp.group_lot_size (groups, read only with dp.unit=group). The committed
    group runs predate dp.group_lot_size: their config.json gives L_groups as
    train.expected_lot_size, the same plan (tests/test_groups_table.py).
    """
    parts = [p.strip() for p in (arg or "").split(",") if p.strip()]
    grouped = GROUP_VARIANT in parts
    config = config_lib.make_config(",".join(p for p in parts if p != GROUP_VARIANT), customize)
    config.variant = arg or ""
    config.dp.group_cap = GROUP_CAP
    config.train.expected_lot_size = pair_lot_epochs[0]  # L, pairs.
    config.dp.group_lot_size = group_lot_epochs[0]  # L_groups.
    config.train.num_epochs = (group_lot_epochs if grouped else pair_lot_epochs)[1]
    if grouped:
        config.dp.unit = "group"
    return config


def small_model(c):
    """configs/tiny.py's model and schedule; one evaluation at the end."""
    c.model.feed_forward_proj = "relu"  # T5 v1.0 layout, as configs/tiny.py.
    c.train.learning_rate = 3e-3
    c.train.physical_batch_size = 32
    c.train.eval_every_steps = 0
    c.train.checkpoint_every_steps = 20
    c.train.log_every_steps = 10
    c.eval.batch_size = 64
    c.dp.delta = 1e-8


def _customize(c):
    c.data.corpus = "clinspen"
    c.data.pair = "es-en"
    c.data.max_source_length = 64
    c.data.max_target_length = 64
    c.data.max_eval_examples = 97
    c.data.max_test_examples = 1000
    c.tokenizer.kind = "sentencepiece_private"
    c.tokenizer.private_data_ok = True
    c.tokenizer.vocab_size = 1000
    small_model(c)
    c.eval.max_new_tokens = 64


def get_config(arg=None):
    return make(arg, _customize, pair_lot_epochs=(64, 10), group_lot_epochs=(8, 29))
