"""The PrivacyPlan: one (L, q, T, σ) for sampler and accountant; clear errors."""

import json
import math

import dp_accounting
import ml_collections
import pytest
from dp_accounting.pld import pld_privacy_accountant

from dpnmt import config_lib, privacy
from dpnmt.data.tokenizers import VocabularyRecord
from dpnmt.training import metrics, run_dir
from dpnmt.training import privacy_report as privacy_report_module
from dpnmt.training.privacy_report import PrivacyReport, privacy_report


def _configs(**dp):
    config = config_lib.base_config()
    config.dp.update(dp)
    return config.dp, config.train


def test_poisson_plan_matches_an_independent_dp_accounting_computation():
    dp, train = _configs(target_epsilon=5.0, sampling="poisson")
    train.expected_lot_size, train.num_epochs = 100, 3
    plan = privacy.plan_privacy(dp, train, dataset_size=2_000)
    assert plan.num_steps == 60 and plan.sampling_rate == pytest.approx(0.05)
    accountant = pld_privacy_accountant.PLDAccountant()
    accountant.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(
                0.05, dp_accounting.GaussianDpEvent(plan.noise_multiplier)
            ),
            60,
        )
    )
    independent = accountant.get_epsilon(dp.delta)
    assert plan.epsilon_after(60) == pytest.approx(independent, rel=1e-9)
    assert 0.99 * 5.0 <= independent <= 5.0


def test_shuffle_plan_uses_full_lots_and_no_amplification():
    dp, train = _configs(target_epsilon=5.0, sampling="shuffle")
    train.expected_lot_size, train.num_epochs = 300, 2
    plan = privacy.plan_privacy(dp, train, dataset_size=1_000)
    assert plan.steps_per_epoch == 3 and plan.num_steps == 6
    # Two epochs of a Gaussian mechanism: no dependence on q.
    expected = dp_accounting.get_epsilon_gaussian(plan.noise_multiplier / 2**0.5, dp.delta)
    assert plan.epsilon_after(6) == pytest.approx(expected, rel=2e-3)
    assert plan.epsilon_after(6) <= 5.0
    # A started epoch counts whole.
    assert plan.epsilon_after(4) == plan.epsilon_after(6)
    assert plan.poisson_figure_not_a_guarantee(6) < plan.epsilon_after(6)


@pytest.mark.parametrize("target", [None, 5.0])
def test_given_sigma_reports_epsilon_and_wins_over_a_target(target):
    dp, train = _configs(noise_multiplier=1.5, target_epsilon=target)
    plan = privacy.plan_privacy(dp, train, dataset_size=10_000)
    assert plan.noise_multiplier == 1.5 and plan.epsilon_after(plan.num_steps) > 0


@pytest.mark.parametrize(
    "dp, lot_size, n, message",
    [
        (dict(target_epsilon=5.0), 2_000, 1_000, "expected_lot_size=2000"),
        (dict(target_epsilon=5.0), 1_000, 1_000, "expected_lot_size=1000"),
        (dict(target_epsilon=None, noise_multiplier=None), 10, 1_000, "target_epsilon"),
        (dict(target_epsilon=None, noise_multiplier=0.0), 10, 1_000, "nonprivate"),
        (dict(target_epsilon=1e-4), 500, 1_000, "unreachable"),
        (dict(target_epsilon=5.0, sampling="random"), 10, 1_000, "sampling"),
    ],
)
def test_bad_plans_are_clear_errors(dp, lot_size, n, message):
    dp_config, train = _configs(**dp)
    train.expected_lot_size = lot_size
    train.num_epochs = 1000 if dp.get("target_epsilon") == 1e-4 else 2
    with pytest.raises(ValueError, match=message):
        privacy.plan_privacy(dp_config, train, dataset_size=n)


def test_report_composes_vocabulary_and_flags_private_vocabulary():
    dp, train = _configs(target_epsilon=2.0)
    plan = privacy.plan_privacy(dp, train, dataset_size=5_000)
    dp_vocab = VocabularyRecord("dp_sentencepiece", True, epsilon=0.5, delta=1e-9)
    report = privacy_report(plan, plan.num_steps, dp_vocab).to_json()
    assert report["total_epsilon"] == pytest.approx(report["dp_sgd_epsilon"] + 0.5)
    assert report["total_delta"] == pytest.approx(dp.delta + 1e-9)
    private_vocab = VocabularyRecord("sentencepiece_private", False)
    assert privacy_report(plan, plan.num_steps, private_vocab).total_epsilon == float("inf")


def test_privacy_report_reads_back_from_its_results_json_form(tmp_path):
    """results.json's "privacy" object (inf as "inf") reads back to the same record."""
    dp, train = _configs(target_epsilon=2.0)
    plan = privacy.plan_privacy(dp, train, dataset_size=5_000)
    for vocabulary in (
        VocabularyRecord("dp_sentencepiece", True, epsilon=0.5, delta=1e-9),
        VocabularyRecord("sentencepiece_private", False),
    ):
        record = privacy_report(plan, plan.num_steps // 2, vocabulary)
        path = tmp_path / "results.json"
        run_dir.write_json(str(path), {"privacy": record.to_json()})
        loaded = json.loads(path.read_text())["privacy"]
        assert PrivacyReport.from_json(loaded) == record
        assert list(loaded) == list(record.to_json())


def test_nonprivate_plan_reports_infinite_epsilon():
    config = config_lib.make_config("nonprivate")
    plan = privacy.plan_privacy(config.dp, config.train, dataset_size=1_000)
    assert not plan.private and plan.noise_multiplier == 0.0
    assert plan.epsilon_after(plan.num_steps) == float("inf")
    assert isinstance(config, ml_collections.ConfigDict)


def test_early_stopping_reports_epsilon_at_the_planned_steps_as_the_guarantee():
    """The stop step is chosen from validation scores (adaptively): ε at it is no guarantee."""
    dp, train = _configs(target_epsilon=2.0)
    plan = privacy.plan_privacy(dp, train, dataset_size=5_000)
    vocabulary = VocabularyRecord("pretrained", True)
    stopped = plan.num_steps // 3
    report = privacy_report(plan, stopped, vocabulary).to_json()
    assert report["dp_sgd_epsilon"] == plan.epsilon_after(plan.num_steps)
    assert report["total_epsilon"] == report["dp_sgd_epsilon"]
    realised = report["epsilon_at_realised_stop_NOT_A_GUARANTEE"]
    assert realised == plan.epsilon_after(stopped) < report["dp_sgd_epsilon"]
    assert report["steps_done"] == stopped and report["steps_planned"] == plan.num_steps
    finished = privacy_report(plan, plan.num_steps, vocabulary).to_json()
    assert "epsilon_at_realised_stop_NOT_A_GUARANTEE" not in finished


def test_report_states_what_is_assumed_public_and_the_adjacency():
    vocabulary = VocabularyRecord("pretrained", True)
    for sampling, words in (("poisson", "add/remove one"), ("shuffle", "replace one")):
        dp, train = _configs(target_epsilon=2.0, sampling=sampling)
        plan = privacy.plan_privacy(dp, train, dataset_size=5_000)
        report = privacy_report(
            plan, plan.num_steps, vocabulary, validation_is_private=True
        ).to_json()
        assert words in report["adjacency"]
        assert any(item.startswith("dataset_size") for item in report["assumed_public"])
        assert report["validation_is_private"] is True


def test_a_fixed_seed_plan_reports_infinite_epsilon_everywhere():
    dp, train = _configs(target_epsilon=2.0, sampling="shuffle")
    plan = privacy.plan_privacy(dp, train, dataset_size=5_000, seed_is_secret=False)
    secret = privacy.plan_privacy(dp, train, dataset_size=5_000)
    assert math.isinf(plan.epsilon_after(1)) and "fixed seed" in plan.bound
    assert plan.poisson_figure_not_a_guarantee(plan.num_steps) is None
    report = privacy_report(plan, plan.num_steps, VocabularyRecord("pretrained", True)).to_json()
    assert math.isinf(report["dp_sgd_epsilon"]) and math.isinf(report["total_epsilon"])
    assert "fixed seed" in report["composition"]
    assert report["epsilon_if_seed_were_secret_NOT_A_GUARANTEE"] == secret.epsilon_after(
        plan.num_steps
    )


def test_rates_are_published_only_over_windows_of_at_least_50_lots():
    window = metrics.RateWindow(start_step=10, start_time=100.0)
    assert metrics.MIN_RATE_WINDOW_LOTS == 50
    for step in range(11, 60):
        assert window.update(step, 100.0 + (step - 10)) is None  # < 50 lots: nothing.
    assert window.update(60, 125.0) == pytest.approx(50 / 25.0)
    assert window.update(65, 126.0) == pytest.approx(2.0)  # Stale until the next window.
    assert window.update(110, 135.0) == pytest.approx(50 / 10.0)


def test_only_closed_windows_time_a_session():
    """The lots after the last closed window are never in the published total:
    with the windows' rates it would time fewer than 50 lots."""
    window = metrics.RateWindow(start_step=0, start_time=0.0)
    assert window.closed() == (0, 0.0)
    window.update(50, 20.0)
    window.update(71, 33.0)  # 21 lots: no window closes.
    assert window.closed() == (50, pytest.approx(20.0))
    window.update(100, 40.0)
    assert window.closed() == (100, pytest.approx(40.0))


def test_lot_size_equal_to_dataset_size_is_refused_by_the_plan_like_the_bridge():
    """plan_privacy accepts L == N; PoissonLots/ShuffledLots then refuse it
    ('must be smaller than the dataset size') after the vocabulary was learnt."""
    dp, train = _configs(target_epsilon=8.0)
    train.expected_lot_size = 1_000
    with pytest.raises(ValueError, match="expected_lot_size"):
        privacy.plan_privacy(dp, train, dataset_size=1_000)


def test_private_plan_with_zero_noise_is_refused_at_plan_time():
    """dp.enabled with dp.noise_multiplier=0 yields a 'private' plan with σ=0;
    it only fails later, inside the accountant, with a core-level message."""
    dp, train = _configs(target_epsilon=None, noise_multiplier=0.0)
    with pytest.raises(ValueError, match="noise_multiplier"):
        privacy.plan_privacy(dp, train, dataset_size=1_000)


class _Writer:
    def __init__(self):
        self.scalars = {}

    def write(self, step, scalars):
        self.scalars[step] = scalars


def test_progress_line_shows_dp_sgd_and_the_total_with_the_vocabulary(caplog):
    dp, train = _configs(noise_multiplier=1.0)
    plan = privacy.plan_privacy(dp, train, dataset_size=5_000)
    vocabulary = VocabularyRecord("dp_sentencepiece", True, epsilon=2.5, delta=1e-9)
    step = plan.num_steps // 2
    total = privacy_report_module.total_epsilon_after(plan, step, vocabulary)
    assert total == pytest.approx(plan.epsilon_after(step) + 2.5)
    writer = _Writer()
    with caplog.at_level("INFO"):
        metrics.log_progress(writer, plan, step, None, None, total_epsilon=total)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert f"DP-SGD {plan.epsilon_after(step):.4g}, total {total:.4g}" in line
    assert writer.scalars[step]["privacy/total_epsilon_spent"] == total
    # The report's total at the planned T is the same sum.
    report = privacy_report(plan, plan.num_steps, vocabulary)
    assert report.total_epsilon == privacy_report_module.total_epsilon_after(
        plan, plan.num_steps, vocabulary
    )


def test_progress_line_of_a_non_private_run_says_so(caplog):
    """Non-private: "non-private (ε ∞)", not a DP-SGD/total pair of infinities."""
    dp, train = _configs(enabled=False)
    plan = privacy.plan_privacy(dp, train, dataset_size=5_000)
    vocabulary = VocabularyRecord("sentencepiece_public", True)
    total = privacy_report_module.total_epsilon_after(plan, 3, vocabulary)
    with caplog.at_level("INFO"):
        metrics.log_progress(_Writer(), plan, 3, None, 1.5, total_epsilon=total)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert line.endswith("train loss 1.5000  non-private (ε ∞)"), line


def test_noise_mode_reaches_the_plan_the_step_and_results_json():
    """dp.noise_mode is recorded in results.json's "privacy"; older records read back "float"."""
    from dpnmt.training import steps

    vocabulary = VocabularyRecord("pretrained", True)
    for mode in ("float", "secure"):
        dp, train = _configs(target_epsilon=2.0, noise_mode=mode)
        plan = privacy.plan_privacy(dp, train, dataset_size=5_000)
        assert plan.noise_mode == mode
        assert steps.StepPrivacy.from_plan(plan).noise_mode == mode
        report = privacy_report(plan, plan.num_steps, vocabulary).to_json()
        assert report["noise_mode"] == mode
    del report["noise_mode"]  # A results.json written before the field existed.
    assert PrivacyReport.from_json(report).noise_mode == "float"


def test_progress_rate_counts_what_l_counts(caplog):
    """L counts groups with dp.unit=group: the rate is groups/s, not examples/s."""
    for unit, counted in (("group", "groups/s"), ("example", "examples/s")):
        dp, train = _configs(noise_multiplier=1.0, unit=unit, group_cap=4)
        plan = privacy.plan_privacy(dp, train, dataset_size=5_000, num_groups=500)
        caplog.clear()
        with caplog.at_level("INFO"):
            metrics.log_progress(_Writer(), plan, 3, 2.0, None)
        (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
        assert f"~{2.0 * plan.expected_lot_size:.1f} {counted} (L x lots/s" in line, line
