"""A per-pair run over a corpus with groups says what its guarantee means for the largest group."""

import dataclasses
import json

import pytest

from dpnmt import config_lib, core, model_card, privacy
from dpnmt.data.tokenizers import VocabularyRecord
from dpnmt.training import run_dir
from dpnmt.training.privacy_report import PrivacyReport, privacy_report

VOCABULARY = VocabularyRecord("sentencepiece_public", True)


def _plan(sampling="poisson", largest_group=20, enabled=True):
    config = config_lib.base_config()
    config.dp.update(enabled=enabled, noise_multiplier=1.0, target_epsilon=None, sampling=sampling)
    config.train.expected_lot_size, config.train.num_epochs = 64, 2
    return privacy.plan_privacy(config.dp, config.train, 1_000, largest_group=largest_group)


def test_the_report_states_the_largest_group_s_epsilon_from_the_core():
    plan = _plan()
    claim = privacy_report(plan, plan.num_steps, VOCABULARY).group_privacy
    assert claim.largest_group == 20 and claim.unit == "pair"
    assert claim.dp_sgd_epsilon == core.compute_group_epsilon(
        noise_multiplier=plan.noise_multiplier,
        sampling_rate=plan.sampling_rate,
        num_steps=plan.num_steps,
        delta=plan.delta,
        group_size=20,
    )
    assert claim.dp_sgd_epsilon > plan.epsilon_after(plan.num_steps)
    assert "20 pairs" in claim.note and f"{claim.dp_sgd_epsilon:.3g}" in claim.note


def test_shuffled_lots_get_the_shuffled_group_bound():
    plan = _plan(sampling="shuffle", largest_group=5)
    claim = privacy_report(plan, plan.num_steps, VOCABULARY).group_privacy
    assert claim.dp_sgd_epsilon == core.compute_group_epsilon_shuffled(
        noise_multiplier=plan.noise_multiplier, num_epochs=2, delta=plan.delta, group_size=5
    )


@pytest.mark.parametrize("largest_group, enabled", [(None, True), (20, False)])
def test_no_groups_or_no_privacy_no_group_statement(largest_group, enabled):
    plan = _plan(largest_group=largest_group, enabled=enabled)
    report = privacy_report(plan, plan.num_steps, VOCABULARY)
    assert report.group_privacy is None and "group_privacy" not in report.to_json()


def test_the_statement_reads_back_from_results_json_and_reaches_the_model_card(tmp_path):
    plan = _plan()
    report = privacy_report(plan, plan.num_steps, VOCABULARY)
    path = tmp_path / "results.json"
    run_dir.write_json(str(path), {"privacy": report.to_json()})
    loaded = json.loads(path.read_text())["privacy"]
    assert PrivacyReport.from_json(loaded) == report
    card = "\n".join(model_card._privacy_section(loaded))
    assert report.group_privacy.note in card


def test_a_checkpoint_plan_saved_before_groups_still_matches():
    """Resuming a run whose checkpoint predates groups: the plan differs only by largest_group."""
    plan = _plan()
    saved = dataclasses.asdict(plan)
    del saved["largest_group"]
    assert privacy.PrivacyPlan(**saved) == dataclasses.replace(plan, largest_group=None)
