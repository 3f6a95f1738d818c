"""Parallel composition: a DP export declared disjoint from this run's data (its record private).

Each person's data are in one stage's training set only, so the run's total
(ε, δ) is the larger of the export's own total and this run's
(`composition_rules.parallel_total`, the ledger's classes: `training.ledger_report`).
"""

import json
import math

import pytest

from dpnmt.config import RunConfig
from dpnmt.data import tokenizers
from dpnmt.sweeps import epsilon_check
from dpnmt.training import setup
from dpnmt.training.privacy_report import (
    PretrainedClaim,
    PrivacyReport,
    parallel_total,
    privacy_report,
)
from dpnmt.training.run_dir import write_json
from tests.train import test_pretrained_privacy as exports
from tests.train.test_pretrained_privacy import (
    EXPORT_DELTA,
    EXPORT_EPSILON,
    _config,
    _export,
    _pretrained_privacy,
    _record,
)

model_folder = exports.model_folder  # The tiny T5 folder fixture, built once per module.


def test_a_group_run_is_told_disjoint_means_sharing_no_group(tmp_path):
    """With dp.unit=group the neighbour is a whole group: data declared disjoint must
    share no group (user, document), not merely no sentence pair."""
    pretrained_privacy = _pretrained_privacy()
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "dpnmt.json").write_text(json.dumps({"privacy": _record(private=False)}))
    config = _config(tmp_path, str(folder))
    (problem,) = pretrained_privacy.pretrained_problems(RunConfig.of(config))
    assert "share no example with this run's" in problem
    config.dp.unit, config.dp.group_cap = "group", 4
    (problem,) = pretrained_privacy.pretrained_problems(RunConfig.of(config))
    assert "share no group (user or document" in problem and "no example" not in problem


@pytest.mark.parametrize("export_epsilon", [1000.0, 0.01, math.inf])
def test_a_private_export_declared_disjoint_composes_in_parallel(
    model_folder, tmp_path, export_epsilon
):
    """Declared disjoint, a DP export's ε was dropped: the total was this run's alone (a
    stage 1 at ε 1000 or ∞, then ε 8: "ε 8"). Each person's data are in one stage's set
    only: the total is the larger of the two (ε and δ), ∞ with an unbounded export."""
    from dpnmt import model_card  # noqa: PLC0415
    from dpnmt.sweeps import epsilon_check  # noqa: PLC0415
    from dpnmt.training.run_dir import write_json  # noqa: PLC0415

    pretrained_privacy = _pretrained_privacy()
    record = _record(epsilon=export_epsilon)
    record["total_delta"] = 0.5  # Above this run's δ: the max is the export's.
    config = _config(tmp_path, _export(model_folder, tmp_path, record))
    config.model.pretrained_data_disjoint = True
    run = RunConfig.of(config)
    if math.isinf(export_epsilon):  # A private run that could claim only ∞ is refused.
        (problem,) = pretrained_privacy.pretrained_problems(run)
        assert "parallel composition" in problem and "∞" in problem
    else:
        assert pretrained_privacy.pretrained_problems(run) == []
    claim = pretrained_privacy.pretrained_claim(run, refuse=False)
    assert claim.parallel and not claim.composed and claim.epsilon == export_epsilon
    # This run's plan and vocabulary (from the same model, not an export).
    built = setup.build_run(
        RunConfig.of(_config(tmp_path, str(model_folder))), str(tmp_path / "run")
    )
    plan, vocabulary = built.privacy.plan, built.privacy.vocabulary
    report = privacy_report(plan, plan.num_steps, vocabulary, pretrained=claim)
    ours = report.dp_sgd_epsilon
    assert math.isfinite(ours) and ours > 0.01
    assert report.total_epsilon == max(ours, export_epsilon)
    assert report.total_delta == (0.5 if math.isfinite(export_epsilon) else plan.delta)
    assert report.composition.startswith("parallel composition over disjoint data (declared")
    assert f"ε = {export_epsilon:.6g}" in report.composition
    published = json.loads(json.dumps(report.to_json()))
    assert published["pretrained"]["parallel"] and published["pretrained"]["record"] == record
    assert PrivacyReport.from_json(published) == report
    write_json(str(tmp_path / "p.json"), report.to_json())  # inf stored as "inf".
    stored = json.loads((tmp_path / "p.json").read_text())
    assert epsilon_check.check_run(stored).agrees  # The runs report recomputes the max.
    card = "\n".join(model_card._privacy_section(stored))
    assert "**Two private stages, disjoint data (declared).**" in card


def test_parallel_composition_takes_an_earlier_private_stage_left_out_of_the_total():
    """0 -> 1 (declared disjoint, a record from before the ledger: its total left stage 0's
    ε out) -> 2: read as a lineage, stage 0's people keep stage 0's ε, so the worst class
    counts it. A public (non-DP) stage 0 stays outside; a later run not declared disjoint
    composes each class with its own events (stage 0's ε and this run's, not their sum with
    stage 1's)."""
    from dpnmt.training import ledger, ledger_report  # noqa: PLC0415

    def total(record):
        composed = ledger_report.class_totals(ledger.lineage_of_record(record))
        return composed.epsilon, composed.delta

    stage0 = _record(epsilon=50.0)
    parent = {"dpnmt_export": True, "composed": False, "declared_disjoint": True}
    old = {**_record(), "pretrained": {**parent, "epsilon": 50.0, "delta": 0.1, "record": stage0}}
    assert total(old) == (50.0, EXPORT_DELTA)  # Stage 0's class: its record's total.
    public = {**old, "pretrained": {**old["pretrained"], "record": _record(private=False)}}
    assert total(public) == (EXPORT_EPSILON, EXPORT_DELTA)
    new = {**old, "pretrained": {**old["pretrained"], "parallel": True}}
    assert total(new) == (50.0, EXPORT_DELTA)
    classes = ledger_report.class_totals(ledger.lineage_of_record(old)).classes
    assert [k.epsilon for k in classes] == [50.0, EXPORT_EPSILON]


def test_the_max_is_against_this_run_s_total_and_the_runs_report_checks_it(model_folder, tmp_path):
    """An export's ε between this run's DP-SGD ε and its total (DP-SGD + a DP vocabulary's ε):
    the max is taken against the total. The runs report recomputes it and rejects a total
    that took the max against DP-SGD alone, a claim below the record it embeds (ε 40 next to
    a record whose total is 50), a δ that is not the max, and a record whose own ε is wrong."""
    config = _config(tmp_path, str(model_folder))
    plan = setup.build_run(RunConfig.of(config), str(tmp_path / "run")).privacy.plan
    ours = plan.epsilon_after(plan.num_steps)
    vocabulary = tokenizers.VocabularyRecord("dp_sentencepiece", True, 4.0, 1e-10, "DP vocabulary")
    theirs = ours + 2.0  # Above this run's DP-SGD ε, below its total ours + 4.
    record = {**_record(epsilon=theirs), "total_delta": 1e-12}
    claim = PretrainedClaim(True, False, True, theirs, 1e-12, "note", record, None, parallel=True)
    report = privacy_report(plan, plan.num_steps, vocabulary, pretrained=claim)
    assert report.total_epsilon == ours + 4.0 and report.total_delta == plan.delta + 1e-10
    write_json(str(tmp_path / "p.json"), report.to_json())
    stored = json.loads((tmp_path / "p.json").read_text())
    assert epsilon_check.check_run(stored).agrees

    def check(total=None, epsilon=None, record=None, **changes):
        pretrained = dict(stored["pretrained"])
        if record is not None:  # The claim as the export's record gives it, unless `epsilon`.
            pretrained.update(record=record, epsilon=record["total_epsilon"])
            pretrained["delta"] = record["total_delta"]
        pretrained["epsilon"] = epsilon or pretrained["epsilon"]
        changed = {**stored, **changes, "pretrained": pretrained}
        changed["total_epsilon"] = total or changed["total_epsilon"]
        return epsilon_check.check_run(changed)

    assert not check(total=theirs).agrees  # max(DP-SGD ε, export's): the vocabulary left out.
    assert not check(total=ours + 4.0 + 1.0).agrees
    fifty = {**_record(epsilon=50.0), "total_delta": 1e-12}
    understated = check(total=40.0, epsilon=40.0, record=fifty)
    assert not understated.agrees and "below its own record's total" in understated.note
    assert check(total=50.0, record=fifty).agrees
    assert not check(total_delta=plan.delta).agrees  # The export's δ or ours, not the max.
    # A record holding σ, q, T and δ (this run's own, as an export's): its ε is recomputed.
    inner = {key: value for key, value in stored.items() if key != "pretrained"}
    assert check(record=inner).agrees
    halved = {**inner, "dp_sgd_epsilon": ours / 2, "total_epsilon": ours / 2 + 4.0}
    wrong = check(record=halved)
    assert not wrong.agrees and "the export's record: DISAGREES" in wrong.note


def test_a_claim_recorded_before_parallel_composition_is_read_as_parallel(tmp_path):
    """pretrained.json from before the "parallel" key: a DP export declared disjoint was
    read back with parallel=False, so resuming, decoding or exporting dropped its ε."""
    from dpnmt.training.run_dir import RunDir  # noqa: PLC0415

    pretrained_privacy = _pretrained_privacy()
    old_note = "pretrained on data declared disjoint from this run's: its ε is not composed"
    old = {
        "dpnmt_export": True,
        "composed": False,
        "declared_disjoint": True,
        "epsilon": 50.0,
        "delta": 1e-6,
        "note": old_note,
        "record": _record(epsilon=50.0),
        "adjacency": None,
    }
    config = _config(tmp_path, "/models/earlier-dp-export")
    config.model.pretrained_data_disjoint = True
    workdir = tmp_path / "run"
    workdir.mkdir()
    RunDir(str(workdir)).write_pretrained(old)
    claim = pretrained_privacy.recorded_claim(RunConfig.of(config), str(workdir))
    assert claim.parallel and not claim.composed and claim.epsilon == 50.0
    assert claim.note.startswith(old_note) and "parallel composition" in claim.note
    assert parallel_total(claim, 8.0, 1e-8) == (50.0, 1e-6)  # The max, no longer 8.
    # A public export, or one composed, stays as recorded; a new claim keeps its key.
    public = {**old, "record": _record(private=False)}
    assert not PretrainedClaim.from_json(public).parallel
    assert not PretrainedClaim.from_json({**old, "parallel": False}).parallel
    assert not PretrainedClaim.from_json({**old, "composed": True}).parallel


def test_the_progress_line_and_the_runs_table_name_the_parallel_rule(caplog):
    """The table said a total only adds a composed export's ε; a parallel total is a max."""
    import logging  # noqa: PLC0415
    import types  # noqa: PLC0415

    from dpnmt.sweeps import runs_table  # noqa: PLC0415
    from dpnmt.training import metrics  # noqa: PLC0415

    plan = types.SimpleNamespace(epsilon_after=lambda step: 2.0, num_steps=10)
    writer = types.SimpleNamespace(write=lambda step, scalars: None)
    with caplog.at_level(logging.INFO):
        metrics.log_progress(writer, plan, 5, None, None, total_epsilon=50.0)
    # The step line names both ε only; the plan line says what the total holds (issue 61).
    assert "ε spent: DP-SGD 2, total 50" in caplog.text
    notes = runs_table.to_markdown([], [])
    assert "declared disjoint: the larger of its total and the run's" in notes
