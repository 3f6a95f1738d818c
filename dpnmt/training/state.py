"""The training loop's typed records: `LoopState` and the validation records it carries.

A checkpoint's JSON metadata stores them in the format that predates these
records (`best` as {"bleu", "step", "evals_without_gain"}, `history` as one
metrics dict per validation), so checkpoints written before and after load
alike (`to_json` / `from_json` round-trip that format exactly).
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

_STEP, _EPSILON = "step", "epsilon"


@dataclasses.dataclass(frozen=True)
class Validation:
    """One validation's published record: its scores at `step` and the ε spent then.

    Attributes:
      step: lots done when it was scored.
      epsilon: DP-SGD's ε after `step` lots (inf for a non-private run).
      scores: the evaluator's scores, in its order ("loss", and after
        training "bleu", "chrf").
    """

    step: int
    epsilon: float
    scores: Mapping[str, Any]

    def to_json(self) -> dict:
        """The published dict: the scores, then "step" and "epsilon" (results.json, metrics)."""
        return {**self.scores, _STEP: self.step, _EPSILON: self.epsilon}

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> "Validation":
        """The inverse of `to_json` (a checkpoint's history entry)."""
        scores = {k: v for k, v in record.items() if k not in (_STEP, _EPSILON)}
        return cls(step=record[_STEP], epsilon=record[_EPSILON], scores=scores)


@dataclasses.dataclass(frozen=True)
class BestScore:
    """Early stopping's record: the best validation BLEU so far and evaluations since.

    Attributes:
      bleu: the best validation BLEU (-1: none yet).
      step: the step it was scored at.
      evals_without_gain: validations since, none of them better.
    """

    bleu: float = -1.0
    step: int = 0
    evals_without_gain: int = 0

    def after(self, validation: Validation) -> "BestScore":
        """The record once `validation` (which has a "bleu" score) is counted."""
        if validation.scores["bleu"] > self.bleu:
            return BestScore(validation.scores["bleu"], validation.step, 0)
        return dataclasses.replace(self, evals_without_gain=self.evals_without_gain + 1)

    def to_json(self) -> dict:
        """{"bleu", "step", "evals_without_gain"}: a checkpoint's "best"."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> "BestScore":
        """The inverse of `to_json`."""
        return cls(**record)


@dataclasses.dataclass(frozen=True)
class LoopState:
    """What the training loop carries from lot to lot, and what a checkpoint restores.

    Attributes:
      step: lots done.
      trainable: the trainable parameters (pytree, replicated on the data mesh).
      opt_state: the optimizer state (pytree).
      best: early stopping's record.
      history: the validations so far, oldest first.
      stopped_early: whether early stopping ended the run.
      average: the trainable parameters' moving average (`dpnmt.training.ema`;
        post-processing, not secret), or None when `train.ema_decay` is 0.
    """

    step: int
    trainable: Any
    opt_state: Any
    best: BestScore = BestScore()
    history: tuple[Validation, ...] = ()
    stopped_early: bool = False
    average: Any = None

    @classmethod
    def initial(cls, trainable, opt_state, *, average: bool = False) -> "LoopState":
        """The state before the first lot (with `average`, one that starts at `trainable`)."""
        start = jax.tree.map(jnp.copy, trainable) if average else None
        return cls(0, trainable, opt_state, average=start)

    @property
    def model(self) -> Any:
        """The trainable parameters the run evaluates and publishes: the average if kept."""
        return self.trainable if self.average is None else self.average

    def validated(self, validation: Validation) -> "LoopState":
        """This state with `validation` appended to its history."""
        return dataclasses.replace(self, history=(*self.history, validation))

    def history_json(self) -> list[dict]:
        """The history as published (results.json) and checkpointed."""
        return [v.to_json() for v in self.history]
