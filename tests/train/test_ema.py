"""`train.ema_decay`: the parameters' moving average is the run's model, resumed exactly."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpnmt.config import RunConfig, TrainConfig
from dpnmt.errors import ConfigError
from dpnmt.evaluation import decode as decode_lib
from dpnmt.training import actions, checkpointing, ema, loop
from dpnmt.training.profile import PhaseTimer
from dpnmt.training.state import LoopState
from tests.markers import needs_data
from tests.small_configs import files_config, smaller_config
from tests.train.test_actions import _privacy, _Writer


def test_decay_is_bias_corrected_and_tends_to_the_configured_value():
    assert float(ema.decay_at(0.99, 1)) == 0.0  # The first average is the first iterate.
    assert float(ema.decay_at(0.99, 2)) == pytest.approx(0.99 / 1.99, rel=1e-5)
    assert float(ema.decay_at(0.99, 10_000)) == pytest.approx(0.99)
    assert float(ema.decay_at(0.0, 5)) == 0.0  # No memory: the average is the iterate.


@settings(max_examples=25, deadline=None)
@given(decay=st.floats(0.0, 0.999), lots=st.integers(1, 30), seed=st.integers(0, 2**31 - 1))
def test_the_average_weighs_each_iterate_by_decay_to_the_lots_since_and_not_the_start(
    decay, lots, seed
):
    rng = np.random.default_rng(seed)
    start = {"w": rng.normal(size=(3, 4)).astype(np.float32), "b": np.float32(rng.normal())}
    iterates = [jax.tree.map(lambda x: rng.normal(size=np.shape(x)).astype(np.float32), start)]
    for _ in range(lots - 1):
        iterates.append(
            jax.tree.map(lambda x: rng.normal(size=np.shape(x)).astype(np.float32), start)
        )
    average = jax.tree.map(jnp.asarray, start)
    for step, params in enumerate(iterates, start=1):
        average = ema.update(average, params, jnp.int32(step), decay=decay)
    weights = np.array([decay ** (lots - s) for s in range(1, lots + 1)], np.float64)
    for key in start:
        stacked = np.stack([np.asarray(p[key], np.float64) for p in iterates])
        expected = np.tensordot(weights / weights.sum(), stacked, axes=1)
        np.testing.assert_allclose(average[key], expected, rtol=1e-4, atol=1e-5)
        assert average[key].dtype == np.float32


def test_the_average_keeps_each_leafs_dtype():
    average = {"w": jnp.ones(3, jnp.bfloat16)}
    new = ema.update(average, {"w": jnp.zeros(3, jnp.bfloat16)}, jnp.int32(3), decay=0.9)
    assert new["w"].dtype == jnp.bfloat16


@pytest.mark.parametrize("decay", [1.0, -0.1, float("nan")])
def test_a_decay_outside_0_1_is_refused_naming_the_field(decay, tmp_path):
    c = files_config(tmp_path / "data")
    c.train.ema_decay = decay
    with pytest.raises(ConfigError, match=r"train.ema_decay"):
        RunConfig.parse(c)


def _config(decay):
    c = smaller_config("eps8")  # A fixed noise seed: deterministic, no guarantee.
    c.data.max_train_examples = 112
    c.train.expected_lot_size = 16  # 7 lots.
    c.train.checkpoint_every_steps = 3
    c.train.learning_rate = 3e-2
    c.train.ema_decay = decay
    return RunConfig.of(c)


def _leaves(params):
    return [np.asarray(x) for x in jax.tree.leaves(params)]


def test_validation_scores_the_average_when_one_is_kept():
    seen = []

    class Evaluator:
        def validation(self, params):
            seen.append(float(params["w"][0]))
            return {"loss": 1.0, "bleu": 0.0, "chrf": 0.0}

    train = TrainConfig(ema_decay=0.5)
    validate = actions.Validate(
        train, 2, _privacy(True), Evaluator(), {}, _Writer(), PhaseTimer(False)
    )
    iterate, average = {"w": jnp.zeros(2)}, {"w": jnp.ones(2)}
    validate(LoopState(2, iterate, {}, average=average))
    validate.publish(2)
    validate(LoopState(4, iterate, {}))  # No average kept: the iterate is the model.
    assert seen == [1.0, 0.0]


@pytest.mark.slow
@needs_data  # configs/tiny.py's wmt16 sample: DPNMT_DATA_DIR, else the hub (offline here).
def test_the_average_is_the_runs_model_and_a_resumed_run_equals_the_whole_run(tmp_path):
    whole, split = tmp_path / "whole", tmp_path / "split"
    results = loop.train_and_evaluate(_config(0.9), str(whole))
    partial = loop.train_and_evaluate(_config(0.9), str(split), stop_after_steps=3)
    assert not partial["finished"]
    with pytest.raises(ConfigError, match="train.ema_decay"):  # Bound to the run: refused.
        loop.train_and_evaluate(_config(0.0), str(split))
    resumed = loop.train_and_evaluate(_config(0.9), str(split))
    assert resumed["finished"] and resumed["steps_done"] == results["steps_done"] == 7
    assert resumed["test"] == results["test"]

    run = _config(0.9)
    models = {}
    for workdir in (whole, split):  # The average and the iterate resume bit for bit.
        _, _, _, average, _, steps = decode_lib.load_trained(run, str(workdir))
        iterate, _, _ = decode_lib.restore_params(run, str(workdir), average, iterate=True)
        models[workdir] = (_leaves(average), _leaves(iterate))
        assert steps == 7
    for x, y in zip(*(sum(models[w], []) for w in (whole, split)), strict=True):
        np.testing.assert_array_equal(x, y)
    average, iterate = models[whole]
    assert any(not np.array_equal(a, b) for a, b in zip(average, iterate, strict=True))
    # dpnmt.decode restores the average: the run's own final test scores, from the checkpoint.
    decoded = decode_lib.decode_and_score(run, str(whole), split="test", bertscore=False)
    assert decoded["scores"]["chrf"] == results["test"]["chrf"]
    # A run without the average checkpoints none; its model is the iterate.
    plain = tmp_path / "plain"
    loop.train_and_evaluate(_config(0.0), str(plain))
    for workdir, items in (
        (whole, ["average", "opt_state", "trainable"]),
        (plain, ["opt_state", "trainable"]),
    ):
        manager = checkpointing.make_manager(str(workdir))
        assert sorted(manager.item_metadata(7)["state"].keys()) == items
