"""Two private stages in one accountant (`training.stage_composition`), without training:
the joint DP-SGD ε is used only when it is below the sum and the export's record
reproduces its own ε; otherwise the sum (basic composition) stays."""

import dataclasses
import json

import pytest

from dpnmt.data.tokenizers import VocabularyRecord
from dpnmt.sweeps import epsilon_check
from dpnmt.training.privacy_report import PretrainedClaim, PrivacyReport, privacy_report
from tests.small_configs import small_plan

VOCAB = VocabularyRecord("dp_sentencepiece", True, epsilon=0.5, delta=1e-9)
TEXT = "one text (a line of de text; data.objective=span_corruption, ...)"


def _export_record(**change):
    """Stage 1's published record: a DP span-corruption run's results.json "privacy"."""
    plan = dataclasses.replace(small_plan(sigma=1.5), **change)
    return json.loads(
        json.dumps(privacy_report(plan, plan.num_steps, VOCAB, example=TEXT).to_json())
    )


def _claim(record):
    epsilon, delta = record["total_epsilon"], record["total_delta"]
    return PretrainedClaim(
        True, True, False, epsilon, delta, "composed", record, record["adjacency"]
    )


def test_both_stages_in_one_accountant_are_below_the_sum_and_state_both_units():
    record = _export_record()
    plan = small_plan()
    report = privacy_report(plan, plan.num_steps, VOCAB, pretrained=_claim(record), example=None)
    summed = report.dp_sgd_epsilon + 0.5 + record["total_epsilon"]
    joint = report.joint_dp_sgd
    assert joint.delta == pytest.approx(record["dp_sgd_delta"] + plan.delta)
    assert joint.other_epsilon == pytest.approx(0.5)  # The export's vocabulary.
    assert report.total_epsilon == pytest.approx(joint.epsilon + 0.5 + 0.5)
    assert report.total_epsilon < summed
    assert report.total_delta == pytest.approx(2 * (1e-6 + 1e-9))  # Unchanged by the joint.
    assert "one dp_accounting event" in report.composition
    assert f"per {TEXT}" in report.composition and "per one sentence pair" in report.composition
    published = json.loads(json.dumps(report.to_json()))
    assert PrivacyReport.from_json(published) == report
    # The runs report's independent check (dp_accounting only) recomputes the joint total.
    check = epsilon_check.check_run(published)
    assert check.agrees and check.total_recomputed == pytest.approx(report.total_epsilon, rel=1e-6)


@pytest.mark.parametrize(
    "change",
    [
        {"noise_multiplier": 9.0},  # Its σ does not give its ε: its numbers are not trusted.
        {"sampling": "shuffle"},  # Another mechanism (no amplification): the sum stays.
        {"pretrained": {"composed": True}},  # Already composed an earlier export.
    ],
)
def test_a_record_that_cannot_be_composed_jointly_keeps_the_sum(change):
    record = _export_record()
    record.update(change)
    plan = small_plan()
    report = privacy_report(plan, plan.num_steps, VOCAB, pretrained=_claim(record))
    assert report.joint_dp_sgd is None and "one dp_accounting event" not in report.composition
    assert report.total_epsilon == pytest.approx(
        report.dp_sgd_epsilon + 0.5 + record["total_epsilon"]
    )
