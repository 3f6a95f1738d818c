"""Training: the pieces of a run, the DP lot step, the loop, its records and files.

`run_dir` (the workdir's files and private records), `pieces` (corpus,
tokenizer, model from a config), `setup` (`build_run`: the pieces in order ->
`records.RunPieces`), `steps` (per-example loss, optimizer, the one DP lot
step), `loop` (`train_and_evaluate`, the driver), `lot_runner` (one lot at a
time), `actions` (log, validate, checkpoint, profile), `state` (`LoopState`),
`checkpointing`, `metrics` (progress, rates, metrics.jsonl) and
`privacy_report` (`PrivacyReport`).
Only the step is imported here; import the others by module.
"""

from dpnmt.training.steps import (
    LotStep,
    StepPrivacy,
    example_loss,
    lot_gradient,
    make_eval_loss,
    make_lot_step,
    make_optimizer,
)

__all__ = [
    "LotStep",
    "StepPrivacy",
    "example_loss",
    "lot_gradient",
    "make_eval_loss",
    "make_lot_step",
    "make_optimizer",
]
