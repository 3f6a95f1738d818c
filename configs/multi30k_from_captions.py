"""DP fine-tuning on Multi30K from the captions stage (configs/public_de_en_captions.py).

configs/multi30k_from_public.py's rows (the same recipe, variants and
stand-in-tuned rates), started from the export of the public in-domain stage,
which saw 507 captions of Multi30K's PUBLIC validation split. So these rows
validate on the other 507 (`files:multi30k_heldout`: Multi30K's train split
unchanged as the private data, N = 29,000, its test split unchanged, and the
held-out half as validation; docs/results/public_captions/make_files.py). The
README must say which public data the start saw.

    python -m dpnmt.sweep --config=configs/multi30k_from_captions.py --grid=eps8 \\
        --sampling=poisson --seeds=1 --workdir=../m30k_from_captions \\
        --config.model.name_or_path=../exported/public_de_en_captions
"""

from dpnmt import config_lib

from_public = config_lib.sibling_config(__file__, "multi30k_from_public")

PUBLIC_STAGE = "public_de_en_captions"
CORPUS = "files:multi30k_heldout"  # Multi30K train and test; half B of validation.


def _customize(c, extras):
    from_public._customize(c, extras - {"scratch"})
    c.data.corpus = CORPUS
    c.model.name_or_path = f"runs/exported/{PUBLIC_STAGE}"


def get_config(arg=None):
    return from_public.make(arg, _customize, scratch_ok=False)
