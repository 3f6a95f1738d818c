"""SKETCH (not run yet): stage 2 of the two-stage recipe, DP fine-tuning on Multi30K.

Fine-tunes the stage-1 export (configs/two_stage_public.py) with DP-SGD on
Multi30K de-en, with the exported model's own tokenizer (tokenizer.kind=auto:
no vocabulary is learnt from the private data, so none of ε goes to it):

    python -m dpnmt.train --config=configs/two_stage_private.py:eps8 \\
        --config.model.name_or_path=exported/stage1 --workdir=runs/stage2

Variants as every config: eps1, eps5, eps8 (default), eps1000, nonprivate;
poisson or shuffle.
"""

import os

from dpnmt import config_lib


def _customize(c):
    data_dir = os.environ.get("DPNMT_DATA_DIR", "../shared/data")
    c.data.corpus = "files:" + os.path.join(data_dir, "multi30k")
    c.data.pair = "de-en"
    c.model.name_or_path = "exported/stage1"  # The stage-1 export (override on the CLI).
    c.tokenizer.kind = "auto"  # The exported model's own tokenizer.
    c.train.expected_lot_size = 256
    c.train.num_epochs = 3
    c.train.learning_rate = 1e-3


def get_config(arg=None):
    return config_lib.make_config(arg, _customize)
