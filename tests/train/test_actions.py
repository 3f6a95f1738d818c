"""The loop's periodic actions (`training.actions`) and its typed records (`training.state`).

Cheap: no model and no data; the evaluator, the writer and the saves are stand-ins.
"""

import dataclasses
import functools
import json
import logging
import math
import os
import types

import jax.numpy as jnp
import pytest

from dpnmt import config_lib, privacy
from dpnmt.config import TrainConfig
from dpnmt.data import tokenizers
from dpnmt.training import actions, checkpointing, run_dir
from dpnmt.training.profile import PhaseTimer
from dpnmt.training.records import RunFiles, RunPrivacy
from dpnmt.training.state import BestScore, LoopState, Validation


@functools.cache  # Calibrating σ is the slow part (seconds); a plan is immutable.
def _plan(private: bool) -> privacy.PrivacyPlan:
    config = config_lib.base_config()
    if private:
        config.dp.target_epsilon = 8.0
    else:
        config.dp.enabled = False
    return privacy.plan_privacy(config.dp, config.train, dataset_size=1_000)


def _privacy(private: bool) -> RunPrivacy:
    vocabulary = tokenizers.VocabularyRecord("sentencepiece_public", covered_by_guarantee=True)
    return RunPrivacy(_plan(private), vocabulary, pretrained=None, validation_is_private=False)


class _Writer:
    def __init__(self):
        self.lines = []

    def write(self, step, scalars):
        self.lines.append((step, dict(scalars)))


class _Evaluator:
    """Validation BLEU from a list, one per call."""

    def __init__(self, bleus):
        self._bleus = iter(bleus)

    def validation_loss(self, params):
        return {"loss": 5.0}

    def validation(self, params):
        return {"loss": 2.0, "bleu": next(self._bleus), "chrf": 30.0}


def _validate(private=True, bleus=(1.0,), patience=0, every=2):
    writer = _Writer()
    train = TrainConfig(early_stopping_patience=patience)
    validate = actions.Validate(
        train, every, _privacy(private), _Evaluator(bleus), {}, writer, PhaseTimer(False)
    )
    return validate, writer


def _state(step):
    return LoopState(step, {"w": jnp.zeros(2)}, {})


def test_a_private_validation_is_published_only_from_its_committed_step(caplog):
    validate, writer = _validate(private=True, bleus=(1.0, 2.0))
    state = validate(_state(2))
    assert [v.step for v in state.history] == [2]
    assert validate.waits_on_commit and writer.lines == []  # Held, not published.
    with pytest.raises(RuntimeError, match="not checkpointed first"):
        validate.publish(None)
    assert writer.lines == []
    validate(_state(4))
    with caplog.at_level(logging.INFO):
        validate.publish(4)
    step, scalars = writer.lines[0]
    assert step == 4 and scalars["validation/bleu"] == 2.0
    assert list(scalars) == [
        "validation/loss",
        "validation/bleu",
        "validation/chrf",
        "validation/step",
        "validation/epsilon",
    ]
    assert "eval at step 4: {'loss': 2.0, 'bleu'" in caplog.text
    assert not validate.waits_on_commit


def test_one_evaluation_at_a_time():
    validate, _ = _validate(private=False, bleus=(1.0, 2.0))
    validate(_state(2))
    assert not validate.waits_on_commit  # A non-private run publishes at once...
    with pytest.raises(RuntimeError, match="one evaluation at a time"):
        validate(_state(4))  # ...but only once the last one is published.


def test_validation_due_every_few_steps_but_not_at_the_last():
    last = _plan(False).num_steps
    validate, writer = _validate(private=False, every=last)
    assert validate(_state(last - 1)).history == ()
    assert validate(_state(last)).history == ()  # Due, but the results validate the end.
    validate.publish(None)
    assert writer.lines == []


def test_early_stopping_counts_evaluations_without_gain():
    validate, _ = _validate(private=False, bleus=(3.0, 2.0, 3.0), patience=2)
    state = _state(0)
    for step in (2, 4, 6):
        state = validate(LoopState(step, state.trainable, {}, state.best, state.history))
        validate.publish(None)
        if step < 6:
            assert not state.stopped_early
    assert state.stopped_early and state.best == BestScore(bleu=3.0, step=2, evals_without_gain=2)


def test_checkpoint_commits_off_schedule_when_a_validation_waits(monkeypatch):
    saved = []
    monkeypatch.setattr(
        checkpointing, "save_state", lambda manager, rd, state, **kw: saved.append(state.step)
    )
    manager = types.SimpleNamespace(wait_until_finished=lambda: saved.append("committed"))
    files = RunFiles(run_dir.RunDir("unused"), manager, resuming=False, run_id=1)
    source = types.SimpleNamespace(state_dict=dict)
    checkpoint = actions.Checkpoint(
        TrainConfig(checkpoint_every_steps=10), files, _privacy(True), 15, source, PhaseTimer(False)
    )
    assert checkpoint(_state(3), commit=False) is None and saved == []
    assert checkpoint(_state(3), commit=True) == 3 and saved == [3, "committed"]
    assert checkpoint(_state(10), commit=False) == 10  # Every 10 lots.
    assert checkpoint(_state(15), commit=False) == 15  # The session's last step.


def test_a_private_runs_progress_line_holds_no_training_loss():
    for private in (True, False):
        writer = _Writer()
        log = actions.LogProgress(TrainConfig(log_every_steps=1), _privacy(private), writer, 0)
        log(1, jnp.float32(0.5))
        assert ("train/loss" in writer.lines[0][1]) is not private


OLD_META_HISTORY = [  # As checkpoints before the typed records wrote it.
    {"loss": 6.1, "step": 0, "epsilon": math.inf},
    {"loss": 4.2, "bleu": 1.5, "chrf": 20.25, "step": 6, "epsilon": 3.5},
]
OLD_META_BEST = {"bleu": 1.5, "step": 6, "evals_without_gain": 0}


def test_records_round_trip_the_checkpoint_format_of_old_runs():
    history = [Validation.from_json(v) for v in OLD_META_HISTORY]
    assert [v.to_json() for v in history] == OLD_META_HISTORY
    assert [list(v.to_json()) for v in history] == [list(v) for v in OLD_META_HISTORY]
    assert BestScore.from_json(OLD_META_BEST).to_json() == OLD_META_BEST


def test_an_old_checkpoint_restores_and_saves_back_the_same_metadata(tmp_path):
    plan = _plan(True)
    os.makedirs(tmp_path / run_dir.PRIVATE_DIR)
    arrays = {"trainable": {"w": jnp.arange(3.0)}, "opt_state": {"m": jnp.ones(3)}}
    old_meta = {  # checkpointing.save_state's metadata before issue 28 item 4.
        "step": 6,
        "run_id": "7",
        "best": OLD_META_BEST,
        "history": OLD_META_HISTORY,
        "plan": json.loads(run_dir.json_dumps(dataclasses.asdict(plan))),
        "steps_done": 6,
        "stopped_early": False,
    }
    manager = checkpointing.make_manager(str(tmp_path))
    checkpointing.save(manager, 6, arrays, old_meta, timeless=True)
    like = LoopState.initial({"w": jnp.zeros(3)}, {"m": jnp.zeros(3)})
    state = checkpointing.restore_state(
        manager, like, noise_seed=1, run_id=7, run_dir=run_dir.RunDir(str(tmp_path)), plan=plan
    )
    assert state.best == BestScore(1.5, 6, 0) and [v.step for v in state.history] == [0, 6]
    new = checkpointing.make_manager(str(tmp_path / "again"))
    os.makedirs(tmp_path / "again" / run_dir.PRIVATE_DIR)
    checkpointing.save_state(
        new, run_dir.RunDir(str(tmp_path / "again")), state, sampler_state={}, run_id=7, plan=plan
    )
    _, _, meta = checkpointing.restore_latest(new, arrays)
    assert json.dumps(meta) == json.dumps(checkpointing.restore_latest(manager, arrays)[2])
