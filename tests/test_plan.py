"""`python -m dpnmt.plan`: the trainer's privacy plan before training, for both samplings."""

import dataclasses

import pytest
from absl import flags
from absl.testing import flagsaver

from dpnmt import plan as plan_app
from dpnmt import privacy
from dpnmt.config import PrivacyConfig, RunConfig, TrainConfig
from dpnmt.errors import ConfigError
from tests.small_configs import files_config


def test_both_plans_equal_the_plans_the_trainer_makes_for_the_same_inputs(tmp_path):
    c = files_config(tmp_path / "corpus")  # A run's config: the trainer's sections.
    c.dp.noise_multiplier, c.dp.target_epsilon = None, 4.0
    c.dp.accountant = "rdp"  # Calibrates in a second (PLD: ~15 s a calibration here).
    c.train.update(expected_lot_size=100, num_epochs=3)
    run = RunConfig.of(c)
    poisson, shuffled = privacy.plan_both_samplings(run.dp, run.train, 1000)
    for plan, sampling in ((poisson, "poisson"), (shuffled, "shuffle")):
        # What training/setup.py calls with the run's sections and N.
        dp = dataclasses.replace(run.dp, sampling=sampling)
        assert plan == privacy.plan_privacy(dp, run.train, 1000)
        assert plan.epsilon_after(plan.num_steps) == pytest.approx(4.0, rel=1e-2)
    assert (poisson.num_steps, shuffled.num_steps) == (30, 30)
    assert shuffled.noise_multiplier > poisson.noise_multiplier  # No amplification.


def test_the_app_prints_sigma_steps_q_and_epsilon_of_both(capsys):
    with flagsaver.flagsaver():
        flags.FLAGS(["plan", "--n=1000", "--lot=100", "--epochs=2", "--sigma=1.5"])
        plan_app.main(["plan"])
    out = capsys.readouterr().out
    dp = PrivacyConfig(noise_multiplier=1.5)
    train = TrainConfig(expected_lot_size=100, num_epochs=2)
    for sampling in ("poisson", "shuffle"):
        plan = privacy.plan_privacy(dataclasses.replace(dp, sampling=sampling), train, 1000)
        epsilon = plan.epsilon_after(plan.num_steps)
        assert f"{sampling}: σ=1.5, T=20 steps" in out
        assert f"q=L/N=0.1, ε={epsilon:.4g} at δ=1e-08" in out
    assert "without amplification by sampling" in out and "is NOT a guarantee" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--n=1000", "--lot=2000", "--sigma=1"], "train.expected_lot_size=2000 must be in"),
        (["--n=100", "--lot=50", "--epochs=1000", "--epsilon=0.001"], "is unreachable"),
        (["--n=1000", "--epsilon=1", "--sigma=1"], "exactly one of --epsilon"),
        (["--n=1000", "--sigma=1", "--delta=0.01"], "at least 1/N"),
    ],
)
def test_impossible_targets_are_one_line_naming_the_fix(argv, message):
    with flagsaver.flagsaver():
        flags.FLAGS(["plan", *argv])
        with pytest.raises(ConfigError, match=message):
            plan_app.main(["plan"])
