"""Multi30K task 1 (de-en by default; fr-en, cs-en with --config.data.pair).

Image captions (about 12 words a side): train 29,000, Multi30K's own
validation 1,014 (public; used for validation loss and BLEU), test 2016
1,000. Read with `files:multi30k`, i.e. from `$DPNMT_DATA_DIR/multi30k`. A
DP-SentencePiece vocabulary (4k pieces, its ε composed with DP-SGD's) and a
T5 v1.0 layout (ReLU, tied embeddings) trained from scratch, sized for CPU.

Hyper-parameters (not tuned on train or test; see the README's "DP
hyper-parameter guide"):
  * nonprivate: L = 128, lr 2e-3, 10 epochs.
  * eps*: the DP literature's advice for DP-SGD from scratch (large lots,
    more epochs, a larger learning rate, C about 1: Ponomareva et al. 2023,
    "How to DP-fy ML", §5.4; De et al. 2022): L = 512 (q = 0.018),
    lr 3e-3, 20 epochs (T = 1,133 lots), C = 1. The measured grid in the
    README ran 2 epochs of each (`--config.train.num_epochs=2`).
Variants: eps1, eps5, eps8 (default), eps1000, nonprivate; poisson (default
when private) or shuffle.
"""

from dpnmt import config_lib


def _customize(c):
    c.data.corpus = "files:multi30k"  # Read from $DPNMT_DATA_DIR/multi30k.
    c.data.pair = "de-en"
    # With this vocabulary a caption is ~26 source / ~22 target pieces; 48
    # truncates ~5% of sources (the run logs the counts).
    c.data.max_source_length = 48
    c.data.max_target_length = 48
    # Most captions need 20-34 pieces a side: these four buckets pad a row to
    # about 33 tokens a side on average, not 48 (auto's 16,24,40,48: about 36).
    c.data.length_buckets = "24,32,40,48"
    c.data.max_eval_examples = 200
    c.tokenizer.kind = "dp_sentencepiece"
    c.tokenizer.vocab_size = 4000
    # σ 8, 24 words per pair: ε = 4.03 (δ 1e-9); keeps ~1,000 words (σ 20 kept
    # ~500 and split a caption into ~32 pieces). Fewer pieces than vocab_size
    # may result: the DP histogram decides.
    c.tokenizer.dp_noise_stddev = 8.0
    c.tokenizer.dp_max_words = 24
    config_lib.small_t5_from_scratch(c.model)
    c.train.physical_batch_size = 32
    c.train.warmup_steps = 40
    c.train.decay = "linear"
    # eval_every_steps unset: 10 validations a run (every 227 lots non-private,
    # 113 at L = 512): a validation (decode 200 + loss) costs about 2 lots of 128.
    c.train.checkpoint_every_steps = 100
    c.train.log_every_steps = 10
    c.eval.max_new_tokens = 48
    c.eval.batch_size = 64


def get_config(arg=None):
    config = config_lib.make_config(arg, _customize)
    if config.dp.enabled:
        config.train.expected_lot_size = 512
        config.train.learning_rate = 3e-3
        config.train.num_epochs = 20
        config.dp.l2_clip = 1.0
    else:
        config.train.expected_lot_size = 128
        config.train.learning_rate = 2e-3
        config.train.num_epochs = 10
    return config
