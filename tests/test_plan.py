"""`python -m dpnmt.plan`: the trainer's privacy plan before training, for both samplings."""

import dataclasses
import os
import re
import subprocess
import sys

import pytest

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


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _plan(*argv):
    """`python -m dpnmt.plan ARGV` in a child: its --config would clash in this process with
    another app's (dpnmt.data.inspect, imported by tests/data/test_inspect.py)."""
    return subprocess.run(
        [sys.executable, "-m", "dpnmt.plan", *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=REPO),
        timeout=300,
    )


def test_the_app_prints_sigma_steps_q_and_epsilon_of_both():
    result = _plan("--n=1000", "--lot=100", "--epochs=2", "--sigma=1.5")
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
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
        (["--n=1000", "--lot=2000", "--sigma=1"], "^--lot=2000 must be in"),
        (["--n=100", "--lot=50", "--epochs=1000", "--epsilon=0.001"], "is unreachable"),
        (["--n=1000", "--epsilon=1", "--sigma=1"], "exactly one of --epsilon"),
        (
            ["--n=1000", "--sigma=1", "--delta=0.01"],
            "^--delta=0.01 is at least 1/N.*--delta=0.0001",
        ),
        (["--n=1000", "--epsilon=-1"], "^--epsilon=-1.0 must be > 0"),
        (["--lot=64", "--epsilon=8"], "Give --n .* or --config"),
    ],
)
def test_impossible_targets_are_one_line_naming_the_fix(argv, message):
    result = _plan(*argv)
    assert result.returncode == 2, result.stderr[-2000:]
    (line,) = result.stderr.strip().splitlines()
    assert re.search(message, line.removeprefix("dpnmt.plan: ")), line


def test_a_config_is_planned_with_n_counted_from_its_corpus(tmp_path):
    """The user need not know N: --config's run, its corpus counted (files_corpus: 120 pairs)."""
    import os
    import subprocess
    import sys

    from tests.small_configs import files_corpus

    corpus = files_corpus(tmp_path / "corpus")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    argv = ["--config=configs/files.py:eps8", f"--config.data.corpus=files:{corpus}"]
    result = subprocess.run(
        [sys.executable, "-m", "dpnmt.plan", *argv, "--lot=16", "--accountant=rdp"],
        capture_output=True,
        text=True,
        cwd=repo,
        env=dict(os.environ, PYTHONPATH=repo),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    dp = dataclasses.replace(RunConfig.of(files_config(tmp_path / "c2")).dp, accountant="rdp")
    dp = dataclasses.replace(dp, noise_multiplier=None, target_epsilon=8.0)
    train = TrainConfig(expected_lot_size=16, num_epochs=RunConfig().train.num_epochs)
    expected = privacy.plan_privacy(dp, train, 120)
    assert f"poisson: σ={expected.noise_multiplier:.4g}, T={expected.num_steps} steps" in out


def test_the_python_planner_is_the_trainers_plan_and_opacus_sigma():
    from opacus.accountants.utils import get_noise_multiplier as opacus_sigma

    from dpnmt import planning

    plan = planning.plan(1000, expected_lot_size=100, num_epochs=3, noise_multiplier=1.2)
    dp, train = (
        PrivacyConfig(noise_multiplier=1.2),
        TrainConfig(expected_lot_size=100, num_epochs=3),
    )
    assert plan == privacy.plan_privacy(dp, train, 1000)
    with pytest.raises(ConfigError, match="train.expected_lot_size=2000"):
        planning.plan(1000, expected_lot_size=2000, num_epochs=3, noise_multiplier=1.2)
    # Opacus' arguments, and (its RDP accountant beside dp_accounting's) its σ within 1 %.
    kwargs = dict(target_epsilon=8, target_delta=1e-6, sample_rate=0.01, epochs=5)
    ours = planning.get_noise_multiplier(**kwargs, accountant="rdp")
    assert ours == pytest.approx(opacus_sigma(**kwargs, accountant="rdp"), rel=1e-2)
