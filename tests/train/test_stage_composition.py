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


@pytest.mark.parametrize(
    "change",
    [
        {"expected_lot_size": 9},  # q is not its L / N: its numbers are not what it ran.
        {"dataset_size": 50},
        {"steps_done": 11},  # More lots than planned: its ε does not cover them.
        {"total_epsilon": 0.1},  # A total below its own DP-SGD ε (was clamped to 0 before).
        {"privacy_unit": {"unit": "group", "group_cap": 4}},  # Whole groups, not examples.
        {"adjacency": "replace one training example by a null example"},  # Other neighbours.
        {"pretrained": {"dpnmt_export": True, "composed": False, "declared_disjoint": True}},
    ],
)
def test_a_record_whose_numbers_do_not_fit_one_event_keeps_the_sum(change):
    record = _export_record()
    record.update(change)
    plan = small_plan()
    report = privacy_report(plan, plan.num_steps, VOCAB, pretrained=_claim(record))
    assert report.joint_dp_sgd is None and "one dp_accounting event" not in report.composition


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_a_record_of_either_accountant_composes_in_one_event(accountant):
    record = _export_record(accountant=accountant)
    assert ("RDP" if accountant == "rdp" else "PLD") in record["bound"]
    plan = small_plan()
    report = privacy_report(plan, plan.num_steps, VOCAB, pretrained=_claim(record))
    assert report.joint_dp_sgd is not None
    assert report.total_epsilon < report.dp_sgd_epsilon + 0.5 + record["total_epsilon"]


def test_a_chain_through_a_declared_disjoint_export_keeps_the_first_stage_epsilon():
    """0 -> 1 (declared disjoint from 0) -> 2 (may overlap 0 or 1): stage 0's ε counts for 2,
    composed with stage 2's in one PLD event (the ledger), never left out."""
    from dpnmt.training import ledger, ledger_report  # noqa: PLC0415

    stage0 = _export_record()
    epsilon0, delta0 = stage0["total_epsilon"], stage0["total_delta"]
    stage1 = _export_record()
    stage1["pretrained"] = PretrainedClaim(
        True, False, True, epsilon0, delta0, "declared disjoint", stage0, stage0["adjacency"]
    ).to_json()
    stages = ledger.lineage_of_record(stage1)
    assert [s.declared_disjoint for s in stages] == [False, True]
    lineage = ledger_report.class_totals(stages)
    claim = PretrainedClaim(
        True, True, False, lineage.epsilon, lineage.delta, "composed", stage1, "x", ledger=stages
    )
    plan = small_plan()
    report = privacy_report(plan, plan.num_steps, VOCAB, pretrained=claim)
    assert report.joint_dp_sgd is None and report.ledger is not None
    # Each class: its stage's DP-SGD and this run's in one event, plus both vocabularies.
    joint = ledger_report.events_epsilon(
        [*stages[0].events, *ledger_report.own_stage(plan, (0.5, 1e-9), declared=False).events]
    )
    assert report.total_epsilon == pytest.approx(joint[0])
    assert report.total_epsilon > report.dp_sgd_epsilon + 0.5 + 0.5
    assert report.total_epsilon < report.dp_sgd_epsilon + 0.5 + stage1["total_epsilon"] + epsilon0
    # Stage 0 without a finite guarantee: no finite total.
    stage1["pretrained"]["record"] = {**stage0, "total_epsilon": "inf"}
    assert ledger_report.class_totals(ledger.lineage_of_record(stage1)).epsilon == float("inf")
