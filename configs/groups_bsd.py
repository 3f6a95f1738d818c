"""BSD ja-en per turn vs per dialogue (issue 31): a small T5 from scratch.

The groups table's BSD rows (docs/privacy.md, "Per pair or per group:
measured"). The private split is BSD's dev.json: 2,051 turns from 69
dialogues (up to 40 turns each); validation is the first 7 dialogues of
test.json and test the other 62 (public): `files:bsd_groups`, written by
`python docs/results/groups_bsd/make_files.py --out=$DPNMT_DATA_DIR/bsd_groups`.
Per turn (default): L = 64, 5 epochs (T = 160); variant `group` (dp.unit=group):
L = 8 of 69 dialogues, each adding at most k = 8 turns, 19 epochs (T = 164).
Both at the same target ε per unit, δ = 1e-8, C = 1.

Vocabulary: configs/public_ja_en.py's public joint ja+en SentencePiece (8,000
pieces from Tatoeba ja-en's train split; no ε), the same in both rows. Model:
configs/tiny.py's (T5 v1.0, 2+2 layers, d_model 128).

    python -m dpnmt.train --config=configs/groups_bsd.py:eps8 --workdir=../groups/bsd-pair
    python -m dpnmt.train --config=configs/groups_bsd.py:eps8,group --workdir=../groups/bsd-group
"""

from dpnmt import config_lib

groups_clinspen = config_lib.sibling_config(__file__, "groups_clinspen")
public_ja_en = config_lib.sibling_config(__file__, "public_ja_en")


def _customize(c):
    c.data.corpus = "files:bsd_groups"
    c.data.pair = "ja-en"
    c.data.max_source_length = 64
    c.data.max_target_length = 64
    c.data.max_eval_examples = 200
    public_ja_en.public_vocabulary(c)
    groups_clinspen.small_model(c)
    c.eval.max_new_tokens = 64


def get_config(arg=None):
    return groups_clinspen.make(arg, _customize, pair_lot_epochs=(64, 5), group_lot_epochs=(8, 19))
