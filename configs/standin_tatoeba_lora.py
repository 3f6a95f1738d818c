"""configs/standin_tatoeba.py with its `lora` variant, as a file for `dpnmt.sweep`.

The stand-in's LoRA rows (the adapters' learning rate is tuned here, at the
best C of the full fine-tuning grid):

    for lr in 1e-3 5e-3 2e-2; do
      python -m dpnmt.sweep --config=configs/standin_tatoeba_lora.py --grid=eps8 \\
        --sampling=poisson --seeds=1 --config.model.name_or_path=../exported/public_wmt_de_en \\
        --config.train.num_epochs=5 --config.train.learning_rate=$lr --config.dp.l2_clip=<best C> \\
        --workdir=../standin_lora/lr${lr}
    done
"""

from dpnmt import config_lib

standin = config_lib.sibling_config(__file__, "standin_tatoeba")
PUBLIC_STAGE = standin.PUBLIC_STAGE


def get_config(arg=None):
    return standin.get_config(standin.from_public.with_variant(arg, "lora"))
