"""configs/multi30k_from_public.py with its `lora` variant, as a file for `dpnmt.sweep`.

The sweep sets only the privacy and sampling variants; this file adds `lora`
(rank-8 adapters on q, k, v, o, wi, wo, the public base frozen, LoRA's own
learning rate). Everything else is multi30k_from_public.py's.
"""

from dpnmt import config_lib

from_public = config_lib.sibling_config(__file__, "multi30k_from_public")
PUBLIC_STAGE = from_public.PUBLIC_STAGE


def get_config(arg=None):
    return from_public.get_config(from_public.with_variant(arg, "lora"))
