"""configs/multi30k_from_public.py's recipe from scratch, as a file for `dpnmt.sweep`.

The comparison row of issue 27 item 5: a random T5 (configs/multi30k.py's
model) with the public 8k vocabulary (no ε for it), trained with exactly the
from-public rows' L, epochs, learning rate, C and δ, so that the σ and T at
each ε are the same and only the starting point differs.
"""

from dpnmt import config_lib

from_public = config_lib.sibling_config(__file__, "multi30k_from_public")


def get_config(arg=None):
    return from_public.get_config(from_public.with_variant(arg, "scratch"))
