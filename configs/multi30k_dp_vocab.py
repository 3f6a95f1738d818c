"""Multi30K as `configs/multi30k.py`, with a DP-SentencePiece vocabulary learnt from it.

The vocabulary of the README's committed Multi30K tables (docs/results/):
4,000 pieces asked, learnt from the PRIVATE train split with DP
(DP-SentencePiece, σ 8, 24 words a pair: ε = 4.03 at δ = 1e-9, composed
with DP-SGD's ε by basic composition); it splits a caption into ~26 source /
~22 target pieces. Works for every pair (`--config.data.pair=fr-en`, cs-en).
Same variants, model and recipe as configs/multi30k.py.
"""

from dpnmt import config_lib

multi30k = config_lib.sibling_config(__file__, "multi30k")


def _customize(c):
    multi30k.data_and_model(c)
    c.tokenizer.kind = "dp_sentencepiece"
    c.tokenizer.vocab_size = 4000
    # σ 8, 24 words per pair: ε = 4.03 (δ 1e-9); keeps ~1,000 words (σ 20 kept
    # ~500 and split a caption into ~32 pieces). Fewer pieces than vocab_size
    # may result: the DP histogram decides.
    c.tokenizer.dp_noise_stddev = 8.0
    c.tokenizer.dp_max_words = 24
    # Most captions need 20-34 pieces a side: these four buckets pad a row to
    # about 33 tokens a side on average, not 48 (auto's 16,24,40,48: about 36).
    c.data.length_buckets = "24,32,40,48"


def get_config(arg=None):
    return multi30k.recipe(config_lib.make_config(arg, _customize))
