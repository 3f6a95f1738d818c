"""configs/bsd_from_public.py with its `lora` variant, as a file for `dpnmt.sweep`.

BSD's second row (as Multi30K's): rank-8 adapters on the public ja-en stage,
their own learning rate (5e-3, the Multi30K stand-in's LoRA rate at L =
1,024; not tuned on BSD). With N ≈ 1,900 full fine-tuning's noise σC√d/L is
large; adapters cut d about 27×. The sweep sets only the privacy and
sampling variants; this file adds `lora`. Everything else is
bsd_from_public.py's.

    python -m dpnmt.sweep --config=configs/bsd_from_public_lora.py --grid=eps5 \\
        --sampling=poisson --seeds=1 --config.model.name_or_path=../exported/public_ja_en \\
        --workdir=../bsd_from_public_lora
"""

from dpnmt import config_lib

bsd = config_lib.sibling_config(__file__, "bsd_from_public")
from_public = bsd.from_public
PUBLIC_STAGE = bsd.PUBLIC_STAGE


def get_config(arg=None):
    return bsd.get_config(from_public.with_variant(arg, "lora"))
