"""The README's first run: one epoch of Multi30K de→en in minutes, a model that translates captions.

NON-PRIVATE (ε = ∞): it shows the pipeline end to end and gives a model to
try `dpnmt.translate` on; it spends no privacy budget and claims none.
DP-SGD from scratch needs far more lots than fit in ten CPU minutes (its
recipe, configs/multi30k.py:eps8, takes hours: docs/results.md), so this
config has no private variant.

As configs/multi30k.py:nonprivate (Multi30K via `files:multi30k`, the small
T5 3+3, d_model 256, the public de+en vocabulary: 8,000 pieces learnt from
Tatoeba + the WMT sample on first use, about 10 s, then cached; no ε), with
these changes for a budget of minutes on 2 CPU cores (measured: README.md):

  * one epoch (453 shuffled lots of 64), learning rate 3e-3 after 30 lots
    of linear warm-up, linear decay to 0, label smoothing 0.1 (the 20-epoch
    non-private reference used 1e-3 after 400 lots: 13.6 validation BLEU
    after 2 epochs);
  * no dropout: within one epoch there is nothing to over-fit, and
    per-example dropout masks cost CPU time;
  * at most 40 pieces a side (p95 of the public validation split: 34 / 29)
    and micro-batches of 32 over buckets 16/24/32/40: a lot's shorter half
    pads to a shorter shape;
  * no evaluation during training; at the end, validation (200 pairs) and
    the 1,000 test sentences, greedy (no beam, no BERTScore), so the train
    command alone prints the test BLEU.

Variants: nonprivate only (the default).
"""

from dpnmt import config_lib

multi30k = config_lib.sibling_config(__file__, "multi30k")

LOT = 64  # train.expected_lot_size; shuffled lots: 29,000 // 64 = 453 a epoch.
MICRO_BATCH = 32  # train.physical_batch_size.
LEARNING_RATE = 3e-3
WARMUP = 30  # Lots of linear warm-up (about 7% of the run).
MAX_LENGTH = 40  # Pieces a side, specials included.
BUCKETS = "16,24,32,40"


def _customize(c):
    multi30k.data_and_model(c)
    multi30k.public_vocabulary(c)
    c.data.max_source_length = c.data.max_target_length = MAX_LENGTH
    c.data.length_buckets = BUCKETS
    c.model.dropout_rate = 0.0
    c.train.num_epochs = 1
    c.train.expected_lot_size = LOT
    c.train.physical_batch_size = MICRO_BATCH
    c.train.learning_rate = LEARNING_RATE
    c.train.warmup_steps = WARMUP
    c.train.decay = "linear"
    c.train.label_smoothing = 0.1
    c.train.eval_every_steps = 0  # Only at the end.
    c.eval.num_beams = 1
    c.eval.bertscore = False


def get_config(arg=None):
    if arg not in (None, "", "nonprivate"):
        raise ValueError(
            f"configs/first_run.py has one variant, nonprivate (not {arg!r}): a quick "
            "non-private demo. A private run: --config=configs/multi30k.py:eps8."
        )
    return config_lib.make_config("nonprivate", _customize)
