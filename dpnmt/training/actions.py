"""The loop's periodic actions: log progress, validate, checkpoint, profile.

`dpnmt.training.loop` drives the lots and, after each, calls these in order:
`LogProgress`, `Validate`, `Checkpoint`, then `Validate.publish`. Each action
takes only its config section and enforces its own privacy rules:

- `LogProgress`: a private run's training loss is never released; rates only
  over windows of at least `MIN_RATE_WINDOW_LOTS` lots (`metrics`).
- `Validate`: one evaluation at a time (a validation is held until published,
  and no other starts meanwhile); a private run's validation is published
  only from a committed checkpoint of its state.
- `Checkpoint`: commits every state a held private validation waits on;
  checkpoints are publishable (`checkpointing`).
- `Profile`: a private run's profile is lot-size dependent: under `private/`,
  unlogged.
"""

import dataclasses
import logging
import time

from dpnmt import distributed, models
from dpnmt.config import TrainConfig
from dpnmt.training import checkpointing
from dpnmt.training.metrics import RateWindow, log_progress
from dpnmt.training.privacy_report import total_epsilon_after
from dpnmt.training.profile import PhaseTimer, format_table
from dpnmt.training.records import RunFiles, RunPrivacy
from dpnmt.training.state import LoopState, Validation


class LogProgress:
    """A progress line every `train.log_every_steps` lots and at the last one."""

    def __init__(self, train: TrainConfig, privacy: RunPrivacy, writer, start_step: int):
        """Opens the rate window at `start_step`, now."""
        self._every, self._privacy, self._writer = train.log_every_steps, privacy, writer
        self._rates = RateWindow(start_step, time.time())

    def __call__(self, step: int, train_loss) -> None:
        """Logs after lot `step` if due (`train_loss`: the lot's mean, a device scalar)."""
        plan = self._privacy.plan
        if step % self._every and step != plan.num_steps:
            return
        # A private run's training loss is an un-noised statistic of the lot
        # (0.0 exactly for an empty lot): it is not released.
        loss = None if plan.private else float(train_loss)
        total = total_epsilon_after(plan, step, self._privacy.vocabulary, self._privacy.pretrained)
        rate = self._rates.update(step, time.time())
        log_progress(self._writer, plan, step, rate, loss, total_epsilon=total)

    def timed(self) -> tuple[int, float]:
        """(lots, seconds) of this session's closed rate windows (`RateWindow.closed`)."""
        return self._rates.closed()


class Validate:
    """Validation every `eval_every` lots (and before training), early stopping, publication.

    A resume redoes the steps after its checkpoint, and may not replay them
    bit for bit (secure lots are redrawn; length buckets or the device count
    may differ): scores published from redone steps would be releases the
    accountant never counted. So a private run's validation is held
    (`waits_on_commit`) until its state is committed (`publish`).
    """

    def __init__(
        self,
        train: TrainConfig,
        every: int,
        privacy: RunPrivacy,
        evaluator,
        frozen,
        writer,
        timer: PhaseTimer,
    ):
        """`every`: lots between validations (0: only at the end; `RunConfig.eval_every_steps`)."""
        self._patience, self._every = train.early_stopping_patience, every
        self._plan, self._evaluator, self._frozen = privacy.plan, evaluator, frozen
        self._writer, self._timer = writer, timer
        self._held: Validation | None = None

    def before_training(self, state: LoopState) -> LoopState:
        """At step 0: the validation loss of the initial model, published at once."""
        if state.step != 0 or not self._every:
            return state
        logging.info("Validation loss of the initial model (compiles the loss program)…")
        with self._timer.phase("evaluation"):
            params = models.merge_params(state.model, self._frozen)
            scores = self._evaluator.validation_loss(params)
        validation = Validation(0, self._plan.epsilon_after(0), scores)
        metrics = validation.to_json()
        self._writer.write(0, {f"validation/{k}": v for k, v in metrics.items()})
        logging.info("eval before training: %s", metrics)
        return state.validated(validation)

    def __call__(self, state: LoopState) -> LoopState:
        """After a lot: validates if due (not at the last step: the results do), holds it."""
        step = state.step
        if not self._every or step % self._every or step >= self._plan.num_steps:
            return state
        if self._held is not None:
            raise RuntimeError(
                f"The validation at step {self._held.step} was never published: one "
                "evaluation at a time (publish it before the next)."
            )
        with self._timer.phase("evaluation"):
            params = models.merge_params(state.model, self._frozen)
            scores = self._evaluator.validation(params)
            validation = Validation(step, self._plan.epsilon_after(step), scores)
            best = state.best.after(validation)
            stopped_early = False
            if self._patience and best.evals_without_gain >= self._patience:
                logging.info("Early stopping at step %d (best BLEU at step %d).", step, best.step)
                stopped_early = True
            stopped_early = distributed.agree(stopped_early)
        self._held = validation
        state = state.validated(validation)
        return dataclasses.replace(state, best=best, stopped_early=stopped_early)

    @property
    def waits_on_commit(self) -> bool:
        """Whether a held validation may be published only once its state is committed."""
        return self._held is not None and self._plan.private

    def publish(self, committed_step: int | None) -> None:
        """Publishes the held validation (metrics.jsonl, TensorBoard, the log), if any.

        Args:
          committed_step: the step whose checkpoint was committed after this
            lot (None: none). A private run's held validation needs its own.
        """
        validation, self._held = self._held, None
        if validation is None:
            return
        if self._plan.private and committed_step != validation.step:
            raise RuntimeError(
                f"The validation at step {validation.step} of a private run was not "
                "checkpointed first: it is not published (a resume could redo its steps)."
            )
        metrics = validation.to_json()
        self._writer.write(validation.step, {f"validation/{k}": v for k, v in metrics.items()})
        logging.info("eval at step %d: %s", validation.step, metrics)


class Checkpoint:
    """Commits the loop state: periodically, at the session's end, and when a validation waits."""

    def __init__(
        self,
        train: TrainConfig,
        files: RunFiles,
        privacy: RunPrivacy,
        last_stop: int,
        lot_source,
        timer: PhaseTimer,
    ):
        """Checkpoints every `train.checkpoint_every_steps` lots and at `last_stop`.

        Args:
          train: the `train` section.
          files: the run's folder and checkpoint manager.
          privacy: the run's plan (checked on resume, timeless saves if private).
          last_stop: the session's last step.
          lot_source: the lot prefetcher: its `state_dict()` goes to `private/`.
          timer: charges the saves to "checkpointing".
        """
        self._every, self._files, self._plan = train.checkpoint_every_steps, files, privacy.plan
        self._last_stop, self._source, self._timer = last_stop, lot_source, timer

    def __call__(self, state: LoopState, *, commit: bool) -> int | None:
        """Saves `state` if due, or if `commit`: then waits until it is committed.

        Returns:
          `state.step` if it was saved (committed when `commit`), else None.
        """
        step = state.step
        due = step % self._every == 0 or step in (self._plan.num_steps, self._last_stop)
        if not (due or state.stopped_early or commit):
            return None
        with self._timer.phase("checkpointing"):
            checkpointing.save_state(
                self._files.manager,
                self._files.run_dir,
                state,
                sampler_state=self._source.state_dict(),
                run_id=self._files.run_id,
                plan=self._plan,
            )
            if commit:
                self._files.manager.wait_until_finished()
        return step

    def close(self) -> None:
        """Waits for any save still being written."""
        with self._timer.phase("checkpointing"):
            self._files.manager.wait_until_finished()


class Profile:
    """The session's profile (`train.profile`): where its wall time went."""

    def __init__(self, train: TrainConfig):
        """Starts the session's phase timer (a no-op unless `train.profile`)."""
        self.timer = PhaseTimer(enabled=train.profile)

    def write(self, files: RunFiles, privacy: RunPrivacy) -> None:
        """Writes the profile: private/ and unlogged if the run is private."""
        timer = self.timer
        if not timer.enabled:
            return
        summary = timer.summary()
        timer.close()
        if not distributed.is_primary():
            return
        private = privacy.plan.private
        table = format_table(summary)
        path = files.run_dir.write_profile({**summary, "table": table}, private=private)
        if private:
            # Step and preparation times depend on the realised lot sizes: not logged.
            logging.info("Profile of this session (private: lot-size dependent) in %s.", path)
        else:
            logging.info("Profile of this session (%s):\n%s", path, table)
