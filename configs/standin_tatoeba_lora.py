"""configs/standin_tatoeba.py with its `lora` variant, as a file for `dpnmt.sweep`.

The stand-in's LoRA rows (the adapters' learning rate is tuned here, at the
best C of the full fine-tuning grid), first at lots of 1,024 (the recipe's
LoRA lot before this grid chose 4,096, hence the overrides):

    for lr in 1e-3 5e-3 2e-2; do
      python -m dpnmt.sweep --config=configs/standin_tatoeba_lora.py --grid=eps8 \\
        --sampling=poisson --seeds=1 --config.model.name_or_path=../exported/public_wmt_de_en \\
        --config.train.num_epochs=5 --config.train.learning_rate=$lr --config.dp.l2_clip=<best C> \\
        --config.train.expected_lot_size=1024 --config.train.warmup_steps=30 \\
        --workdir=../standin_lora/lr${lr}
    done

then the lot size at a fixed number of epochs (fixed compute): L = 4,096 (35 lots
at 5 epochs, σ from the same ε; warm-up 30·1024/L = 8 lots, the same fraction of
T as L = 1,024's 30 of 142), against the L = 1,024 runs above:

    for lr in 1e-2 5e-3 2e-2; do
      python -m dpnmt.sweep --config=configs/standin_tatoeba_lora.py --grid=eps8 \\
        --sampling=poisson --seeds=1 --config.model.name_or_path=../exported/public_wmt_de_en \\
        --config.train.num_epochs=5 --config.train.learning_rate=$lr --config.dp.l2_clip=1.0 \\
        --config.train.expected_lot_size=4096 --config.train.warmup_steps=8 \\
        --workdir=../standin_lora/L4096_lr${lr}
    done

The tuning rule picks (L, learning rate) over all of standin_lora/ in one group:
L 4,096 at lr 2e-2 (4e-2 was tried since 2e-2 was the largest rate; it lost),
now multi30k_from_public.py's LORA_* constants.
"""

from dpnmt import config_lib

standin = config_lib.sibling_config(__file__, "standin_tatoeba")
PUBLIC_STAGE = standin.PUBLIC_STAGE


def get_config(arg=None):
    return standin.get_config(standin.from_public.with_variant(arg, "lora"))
