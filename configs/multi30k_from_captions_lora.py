"""configs/multi30k_from_captions.py with its `lora` variant, as a file for `dpnmt.sweep`.

The LoRA row from the captions stage (the public in-domain start, which saw
507 captions of Multi30K's PUBLIC validation split; the rows validate on the
other 507). The sweep sets only the privacy and sampling variants; this file
adds `lora`. Everything else is multi30k_from_captions.py's.
"""

from dpnmt import config_lib

from_captions = config_lib.sibling_config(__file__, "multi30k_from_captions")
from_public = from_captions.from_public
PUBLIC_STAGE = from_captions.PUBLIC_STAGE


def get_config(arg=None):
    return from_captions.get_config(from_public.with_variant(arg, "lora"))
