"""Training: the DP lot step (`steps`); the loop still lives in `dpnmt.trainer`."""

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
