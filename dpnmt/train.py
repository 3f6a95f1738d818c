r"""Trains a DP seq2seq translation model.

    python -m dpnmt.train --config=configs/tiny.py:eps8 --workdir=runs/tiny

The logic lives in `dpnmt.trainer` (a library that is easy to test); this app
only parses flags. Override any config field: `--config.train.num_epochs=3`.
"""

from absl import app, flags, logging
from ml_collections import config_flags

from dpnmt import trainer

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Experiment config file, e.g. configs/tiny.py:eps8,shuffle.",
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output folder; rerun to resume.")
_STOP_AFTER = flags.DEFINE_integer(
    "stop_after_steps", None, "End this session after this step (checkpointed); rerun resumes."
)
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    """Runs `trainer.train_and_evaluate` with the flags' config and workdir."""
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.INFO)
    trainer.train_and_evaluate(_CONFIG.value, _WORKDIR.value, stop_after_steps=_STOP_AFTER.value)


if __name__ == "__main__":
    app.run(main)
