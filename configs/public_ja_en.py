"""The public stage for BSD ja-en: non-private training on Tatoeba ja-en, a public ja+en vocabulary.

Issue 27 item 6. Train is Tatoeba ja-en (42,078 pairs of short everyday
sentences; validation 926, test 949: `files:tatoeba_ja_en`), CC-BY, public.
The vocabulary is a joint ja+en SentencePiece of 8,000 pieces learnt from
that train split only (`tokenizer.kind=sentencepiece_public`,
`tokenizer.public_corpora=files:tatoeba_ja_en`: built once and cached; no
ε), character coverage 1 with byte fallback (every kana and kanji of the
text kept, unseen ones as bytes). The model and recipe are
configs/public_de_en.py's (T5 v1.0 3+3, d_model 256; label smoothing 0.1,
lr 1e-3, 400 warm-up lots then linear decay, beam 5), 15 epochs of ~330 lots
of 128. configs/bsd_from_public.py fine-tunes its export on BSD.

    python -m dpnmt.public_vocab --config=configs/public_ja_en.py   # build it ahead
    python -m dpnmt.train --config=configs/public_ja_en.py --workdir=../public_ja_en
    python -m dpnmt.export --workdir=../public_ja_en --out=../exported/public_ja_en
    python -m dpnmt.decode --config=configs/bsd_from_public.py:nonprivate \\
        --config.model.name_or_path=../exported/public_ja_en --zero_shot \\
        --split=test --workdir=../public_ja_en_zeroshot_bsd

BLEU is into English (sacreBLEU's 13a tokeniser; the DP-NMT paper's BSD
direction is ja→en too). About 2% of BSD's distinct English sentences, fewer
Japanese ones, also occur in Tatoeba ja-en, all short stock phrases ("Thank
you.", "Are you sure?"): no longer sentence is shared. Only `nonprivate` (the
default) makes sense: the data is public.
"""

from dpnmt import config_lib

public_de_en = config_lib.sibling_config(__file__, "public_de_en")

PUBLIC_CORPORA = "files:tatoeba_ja_en"  # Public ja-en text only (never BSD).


def public_vocabulary(c):
    """The public joint ja+en vocabulary of the BSD runs."""
    c.tokenizer.kind = "sentencepiece_public"
    c.tokenizer.public_corpora = PUBLIC_CORPORA
    c.tokenizer.vocab_size = 8000


def _customize(c):
    public_de_en.stage(c)
    c.data.corpus = PUBLIC_CORPORA
    c.data.corpus_weights = ()
    c.data.pair = "ja-en"
    # Its validation split: 8.7 ja / 9.8 en pieces a sentence on average, p95 16 / 17.
    c.data.max_source_length = 48
    c.data.max_target_length = 48
    c.data.length_buckets = "16,24,32,48"
    public_vocabulary(c)
    c.eval.max_new_tokens = 48


def get_config(arg=None):
    return config_lib.public_stage_config(arg, _customize, "public_ja_en")
