"""Multi30K de-en from the shipped public start (configs/public_start.py, issue 58).

configs/multi30k_from_public.py's rows (its recipe, variants and stand-in
rates), started from the export of the public start: a model of public text
only (3,039 public in-domain captions, full Tatoeba, the WMT sample), whose
16k vocabulary is public too, so ε total = DP-SGD's ε. The start saw half A
of Multi30K's public validation split, so these rows validate on the other
half (`files:multi30k_heldout`: Multi30K's train split unchanged as the
private data, N = 29,000, test 2016 unchanged; made by
docs/results/public_start/make_files.py). Its zero-shot score on test 2016
is the `nonprivate` variant decoded with `--zero_shot`:

    python -m dpnmt.decode --config=configs/multi30k_from_start.py:nonprivate --zero_shot \\
        --split=test --workdir=../start_zeroshot_test
"""

from dpnmt import config_lib

from_public = config_lib.sibling_config(__file__, "multi30k_from_public")

PUBLIC_STAGE = "public_start"
CORPUS = "files:multi30k_heldout"  # Multi30K train and test; half B of validation.
START = "models/public_start"  # The shipped export of PUBLIC_STAGE (relative to the repository).


def _customize(c, extras):
    from_public._customize(c, extras - {"scratch"})
    c.data.corpus = CORPUS
    c.model.name_or_path = START  # Committed: a fresh clone runs these rows as they are.


def get_config(arg=None):
    return from_public.make(arg, _customize, scratch_ok=False)
