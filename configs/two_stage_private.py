"""Stage 2 of the two-stage recipe: DP fine-tuning of the public model on Multi30K.

Fine-tunes the stage-1 export (configs/two_stage_public.py: the WMT sample, public)
with DP-SGD on Multi30K de-en (image captions, private here), with the
exported model's own tokenizer (tokenizer.kind=auto): no vocabulary is learnt
from the private data, so none of ε goes to one. Stage 1 trained without DP, so
its export has no finite ε on its own data: a private run refuses it unless
those data are declared disjoint from this run's. They are (public WMT text,
no line shared with Multi30K, checked): `model.pretrained_data_disjoint=True`,
and the report says the export's ε was not composed. Lots, epochs and learning
rates are configs/multi30k.py's as the README's grid ran them (2 epochs), so
the runs compare with DP from scratch at the same ε and cost:

    python -m dpnmt.train --config=configs/two_stage_private.py:eps8 \\
        --config.model.name_or_path=exported/stage1 --workdir=runs/stage2

LoRA instead of full fine-tuning: `--config.model.finetune=lora
--config.model.lora_rank=8 --config.model.lora_targets=q,k,v,o,wi,wo`.
Variants as every config: eps1, eps5, eps8 (default), eps1000, nonprivate;
poisson or shuffle.
"""

import os

from dpnmt import config_lib


def _customize(c):
    data_dir = os.environ.get("DPNMT_DATA_DIR", "../shared/data")
    c.data.corpus = "files:" + os.path.join(data_dir, "multi30k")
    c.data.pair = "de-en"
    c.data.max_source_length = 48
    c.data.max_target_length = 48
    c.data.max_eval_examples = 200
    c.model.name_or_path = "exported/stage1"  # The stage-1 export (override on the CLI).
    c.model.family = "none"
    # Stage 1's data (the public WMT sample) share no example with Multi30K.
    c.model.pretrained_data_disjoint = True
    c.tokenizer.kind = "auto"  # The exported model's own tokenizer.
    c.train.physical_batch_size = 32
    c.train.warmup_steps = 40
    c.train.decay = "linear"
    c.train.num_epochs = 2
    c.train.checkpoint_every_steps = 100
    c.eval.max_new_tokens = 48
    c.eval.batch_size = 64


def get_config(arg=None):
    config = config_lib.make_config(arg, _customize)
    if config.dp.enabled:
        config.train.expected_lot_size = 512
        config.train.learning_rate = 3e-3
        config.dp.l2_clip = 1.0
    else:
        config.train.expected_lot_size = 128
        config.train.learning_rate = 2e-3
    return config
