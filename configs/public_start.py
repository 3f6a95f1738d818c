"""The shipped public start (issue 58): a non-private model of PUBLIC de-en text for captions.

Train is the mixture, shuffled, of (weights are row repeats an epoch,
`data.corpus_weights`):

  * `files:captions_public` x 8: 3,039 public in-domain captions, Multi30K's
    later test sets (2017 Flickr, 2017 MSCOCO, 2018 Flickr: other images)
    plus half A of Multi30K's public validation split; its validation and
    test splits are half B (507 captions), on which every choice here is
    read. Made by docs/results/public_start/make_files.py (into
    $DPNMT_DATA_DIR, never the repository); none of its sentences is in
    test 2016 or half B (the script checks);
  * `files:tatoeba_de_en_full` x 1: the full Tatoeba de-en export (168,235
    pairs of everyday sentences);
  * `detok:wmt16` x 1: the WMT sample, Moses-detokenised (news).

Multi30K's train split (the private corpus of the DP rows) is read by no
part of this stage, and test 2016 by none (tests/data/test_public_stage_text.py).

Vocabulary: a joint de+en SentencePiece (unigram, byte fallback) of 16,000
pieces learnt from the same three public corpora (`sentencepiece_public`:
no ε). Size chosen on half B (pieces per caption, de / en mean): 8,000
19.3 / 17.4, 16,000 17.0 / 15.9, 32,000 15.7 / 15.0 (`python -m
dpnmt.public_vocab --measure=files:captions_public`): 16,000 saves 12% /
9% of 8,000's pieces; 32,000 a further 7% / 5% for twice the embedding
(more noise σC√d/L in full DP fine-tuning, a larger shipped file).

Model and recipe: the T5 v1.0 3+3 layers, d_model 256 of every CPU run here
(`config_lib.small_t5_from_scratch`; ~7.2M parameters with this vocabulary,
29 MB in float32); L 128, label smoothing 0.1, beam 5 as in
configs/public_de_en.py, for ONE epoch of the mixture's first 130,000
shuffled rows (`data.max_train_examples`: 1,015 lots of the 202,046): what
one session of these two shared cores holds (~5.4 s a lot measured beside
other work, the 16k softmax and Tatoeba's longer sentences included); for so
short a run the rate of configs/multi30k.py's non-private recipe, 2e-3, with
200 warm-up lots then linear decay to 0. The shipped run stopped at lot 710
(docs/results/public_start/README.md); configs/public_start_captions.py follows.
Not tuned: no grid over width, depth, weights, rate or epochs was run (the
CPU-hours went to this one run).

    PYTHONPATH=. python docs/results/public_start/make_files.py --out=$DPNMT_DATA_DIR
    python -m dpnmt.train --config=configs/public_start.py --workdir=../public_start
    python -m dpnmt.export --workdir=../public_start --out=../exported/public_start

Only `nonprivate` (the default): the data are public.
"""

from dpnmt import config_lib

# Captions first: their validation and test splits are the run's.
CORPORA = "files:captions_public,files:tatoeba_de_en_full,detok:wmt16"
CAPTIONS_WEIGHT = 8.0  # Row repeats of the 3,039 in-domain captions an epoch (~12% of the rows).
VOCAB_SIZE = 16000


def stage(c):
    """The shipped public start's data, vocabulary, model and recipe."""
    c.data.corpus = CORPORA
    c.data.corpus_weights = (CAPTIONS_WEIGHT, 1.0, 1.0)
    c.data.pair = "de-en"
    c.data.max_source_length = 64  # WMT sentences are long; captions ~17 pieces.
    c.data.max_target_length = 64
    c.data.max_train_examples = 130_000  # The mixture is shuffled: a random 64% of it.
    c.data.max_eval_examples = 200
    c.data.max_test_examples = 200  # Half B's first 200, as validation (time).
    c.data.length_buckets = "16,32,48,64"
    c.tokenizer.kind = "sentencepiece_public"
    c.tokenizer.public_corpora = CORPORA
    c.tokenizer.vocab_size = VOCAB_SIZE
    config_lib.small_t5_from_scratch(c.model)
    c.train.expected_lot_size = 128
    c.train.physical_batch_size = 32
    c.train.num_epochs = 1
    c.train.learning_rate = 2e-3
    c.train.warmup_steps = 200
    c.train.decay = "linear"
    c.train.label_smoothing = 0.1
    c.train.checkpoint_every_steps = 100
    c.train.eval_every_steps = 339
    c.eval.num_beams = 5
    c.eval.length_penalty = 1.0
    c.eval.max_new_tokens = 64
    c.eval.batch_size = 64


def get_config(arg=None):
    return config_lib.public_stage_config(arg, stage, "public_start")
