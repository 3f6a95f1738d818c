"""Chains of exports: the person in corpus A gets every event that touched A (issue 59).

Each stage here is what `dpnmt.train` then `dpnmt.export` would leave, without
training: the starting model's claim (`pretrained_privacy.pretrained_claim`),
the report of a small Poisson plan (`privacy_report`) and the export's
dpnmt.json as `release.export_settings` writes it, into a copy of a tiny T5.
Every ε a chain reports is checked against dp_accounting directly: the
optimistic PLD of the events that touched A, a lower bound of the truth.
"""

import dataclasses
import json
import math
import shutil

import pytest
from dp_accounting.pld import privacy_loss_distribution

from dpnmt import release
from dpnmt.config import RunConfig
from dpnmt.data import tokenizers
from dpnmt.errors import ConfigError
from dpnmt.training import pretrained_privacy
from dpnmt.training.privacy_report import privacy_report
from tests.small_configs import FILES_ROWS, files_config, small_plan
from tests.tiny_export import write_tiny_export

PUBLIC_VOCABULARY = tokenizers.VocabularyRecord("pretrained", True, None, None, "the export's")
SIGMA = {"s0": 0.9, "s1": 1.1, "s2": 1.0}  # Stage 0 spends the most: ε0 > ε2.


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    return write_tiny_export(tmp_path_factory.mktemp("model"))


def _corpus(folder, tag: str) -> str:
    """A `files:` de-en corpus of its own text (`tag` in every sentence)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [(f"{a} {tag}", f"{b} {tag}") for a, b in FILES_ROWS]
    for split, part in (("train", rows), ("validation", rows[:8]), ("test", rows[:8])):
        text = "de\ten\n" + "".join(f"{a}\t{b}\n" for a, b in part)
        (folder / f"{split}.tsv").write_text(text, encoding="utf-8")
    return f"files:{folder}"


def _plan(stage: str, private: bool = True):
    plan = small_plan(private=private, sigma=SIGMA[stage])
    return dataclasses.replace(plan, accountant="pld")


class Chain:
    """Stages trained one after the other, each from the last one's export."""

    def __init__(self, tmp_path, model_folder):
        self.tmp, self.model = tmp_path, model_folder
        self.corpora = {name: _corpus(tmp_path / f"corpus_{name}", name) for name in "ABD"}
        self.last = str(model_folder)  # Stage 0 starts from a model that is not an export.
        self.count = 0

    def run(self, corpus: str, stage: str, *, declared=False, private=True, sampling="poisson"):
        """(the run's config, its claim, its report); raises ConfigError when refused."""
        config = files_config(self.tmp / "unused", "eps8" if private else "nonprivate")
        config.data.corpus = self.corpora[corpus]
        config.model.name_or_path, config.model.family = self.last, "none"
        config.model.pretrained_data_disjoint = declared
        run = RunConfig.of(config)
        claim = pretrained_privacy.pretrained_claim(run)
        plan = dataclasses.replace(_plan(stage, private), sampling=sampling)
        report = privacy_report(plan, plan.num_steps, PUBLIC_VOCABULARY, pretrained=claim)
        return run, claim, report

    def export(self, run, report):
        """Writes the run's export (a tiny T5 and its dpnmt.json); later stages start from it."""
        folder = self.tmp / f"export{self.count}"
        self.count += 1
        shutil.copytree(self.model, folder)
        privacy = json.loads(json.dumps(report.to_json()))
        settings = release.export_settings(run, privacy)
        (folder / "dpnmt.json").write_text(json.dumps(settings))
        self.last = str(folder)

    def stage(self, corpus, stage, **kwargs):
        run, _, report = self.run(corpus, stage, **kwargs)
        self.export(run, report)
        return report


def _optimistic(*stages: str) -> float:
    """dp_accounting's optimistic PLD ε of these stages' DP-SGD on one person (a lower bound)."""
    composed = None
    for stage in stages:
        plan = _plan(stage)
        one = privacy_loss_distribution.from_gaussian_mechanism(
            plan.noise_multiplier,
            pessimistic_estimate=False,
            sampling_prob=plan.sampling_rate,
        ).self_compose(plan.num_steps)
        composed = one if composed is None else composed.compose(one)
    return composed.get_epsilon_for_delta(sum(_plan(s).delta for s in stages))


def _epsilon(stage: str) -> float:
    plan = _plan(stage)
    return plan.epsilon_after(plan.num_steps)


def test_a_private_middle_stage_declared_disjoint_then_a_on_a_again(model_folder, tmp_path):
    """A -> B (DP, declared disjoint) -> A: the last run reported max(ε0, ε1, ε2); a
    person in A is in stages 0 and 2. Declaring A disjoint from the lineage is refused; not
    declared, the total is at least dp_accounting's composed ε of stages 0 and 2."""
    chain = Chain(tmp_path, model_folder)
    chain.stage("A", "s0")
    chain.stage("B", "s1", declared=True)
    with pytest.raises(ConfigError, match="stage 0"):
        chain.run("A", "s2", declared=True)
    _, claim, report = chain.run("A", "s2")
    assert claim.composed
    assert report.total_epsilon >= _optimistic("s0", "s2") > max(_epsilon(s) for s in SIGMA)
    assert report.total_epsilon >= _optimistic("s1", "s2")
    assert report.total_delta >= _plan("s0").delta + _plan("s2").delta
    _runs_report_agrees(report)


def _runs_report_agrees(report):
    """`dpnmt.report --runs` recomputes the ledger's total with dp_accounting alone, and
    refuses it lowered, or a stage's DP-SGD ε edited below its σ, q, T, δ."""
    from dpnmt.sweeps import epsilon_check  # noqa: PLC0415

    published = json.loads(json.dumps(report.to_json()))
    check = epsilon_check.check_run(published)
    assert check.agrees, check.note
    assert check.total_recomputed == pytest.approx(report.total_epsilon, rel=1e-3)
    tolerance = epsilon_check.RELATIVE_TOLERANCE * check.total_recomputed
    assert check.total_recomputed - 0.9 * report.total_epsilon > tolerance  # Lowered: refused.
    edited = json.loads(json.dumps(published))
    edited["ledger"]["stages"][0]["events"][0]["epsilon"] = 0.01
    assert "below its recomputation" in epsilon_check.check_run(edited).note


def test_a_middle_stage_composed_by_sum_then_a_declared_disjoint(model_folder, tmp_path):
    """A -> B (DP, not declared: summed) -> A declared disjoint reported max(ε0+ε1, ε2):
    refused; not declared, at least the composition of all three stages."""
    chain = Chain(tmp_path, model_folder)
    chain.stage("A", "s0")
    chain.stage("B", "s1")
    with pytest.raises(ConfigError, match="stage 0"):
        chain.run("A", "s2", declared=True)
    _, _, report = chain.run("A", "s2")
    assert report.total_epsilon >= _optimistic("s0", "s1", "s2")


def test_a_non_private_middle_stage_passes_stage_0_on(model_folder, tmp_path):
    """A -> B (no DP, public, declared disjoint) -> D declared disjoint reported ε2 alone
    ("the starting export was trained without DP"), dropping ε0: export1 is post-processing
    of export0. The total is now max(ε0, ε2); A again is refused, declared or not."""
    chain = Chain(tmp_path, model_folder)
    chain.stage("A", "s0")
    chain.stage("B", "s1", declared=True, private=False)
    _, claim, report = chain.run("D", "s2", declared=True)
    assert _epsilon("s0") > _epsilon("s2")
    assert report.total_epsilon >= _optimistic("s0")
    assert report.total_epsilon == pytest.approx(max(_epsilon("s0"), _epsilon("s2")), rel=1e-6)
    _runs_report_agrees(report)
    with pytest.raises(ConfigError, match="stage 0"):
        chain.run("A", "s2", declared=True)
    with pytest.raises(ConfigError, match="without DP"):
        chain.run("A", "s2")


def test_a_non_private_middle_stage_not_declared_disjoint_leaves_a_unprotected(
    model_folder, tmp_path
):
    """A -> B (no DP, not declared: B may hold A's people) -> D: A's people have no
    guarantee (trained on without DP), so a private run from it is refused."""
    chain = Chain(tmp_path, model_folder)
    chain.stage("A", "s0")
    chain.stage("B", "s1", private=False)
    with pytest.raises(ConfigError, match="∞"):
        chain.run("D", "s2", declared=True)


def test_an_edited_total_below_its_own_dp_sgd_is_refused(model_folder, tmp_path):
    """total_epsilon set to 0.01 in an export whose σ, q, T, δ give its DP-SGD ε: the next
    run reported its own ε plus 0.01. Refused, naming the recomputation."""
    chain = Chain(tmp_path, model_folder)
    chain.stage("A", "s0")
    settings_path = tmp_path / "export0" / "dpnmt.json"
    settings = json.loads(settings_path.read_text())
    settings["privacy"]["total_epsilon"] = 0.01
    for stage in settings.get("ledger", []):
        for event in stage["events"]:
            event["epsilon"] = 0.01
    settings_path.write_text(json.dumps(settings))
    for declared in (False, True):
        with pytest.raises(ConfigError, match="below") as error:
            chain.run("D", "s2", declared=declared)
        assert f"{_epsilon('s0'):.6g}" in str(error.value)


def test_the_ledger_travels_with_every_export_and_is_recomputed(model_folder, tmp_path):
    """Each export's dpnmt.json holds every stage (corpora, events); the report states each
    class's (ε, δ) and the worst, and reads back unchanged."""
    from dpnmt.training.privacy_report import PrivacyReport  # noqa: PLC0415

    chain = Chain(tmp_path, model_folder)
    chain.stage("A", "s0")
    chain.stage("B", "s1", declared=True, private=False)
    report = chain.stage("D", "s2", declared=True)
    settings = json.loads((tmp_path / "export2" / "dpnmt.json").read_text())
    stages = settings["ledger"]
    assert [s["corpora"][0]["corpus"] for s in stages] == [
        "files:corpus_A",
        "files:corpus_B",
        "files:corpus_D",
    ]
    assert [s["private"] for s in stages] == [True, False, True]
    assert stages[0]["events"][0]["noise_multiplier"] == SIGMA["s0"]
    assert "train_text_digest" in stages[1]["corpora"][0]  # Public text only.
    assert "train_text_digest" not in stages[0]["corpora"][0]
    published = json.loads(json.dumps(report.to_json()))
    classes = published["ledger"]["classes"]
    assert [c["counted"] for c in classes] == [True, False, True]
    assert published["total_epsilon"] == max(c["epsilon"] for c in classes if c["counted"])
    assert PrivacyReport.from_json(published) == report
    assert not math.isinf(report.total_epsilon)


def _as_before_the_ledger(folder):
    """Rewrites an export's dpnmt.json as dpnmt wrote it before the ledger (issue 59)."""
    path = folder / "dpnmt.json"
    settings = json.loads(path.read_text())
    settings.pop("ledger")
    settings["privacy"].pop("ledger", None)
    if isinstance(settings["privacy"].get("pretrained"), dict):
        settings["privacy"]["pretrained"].pop("ledger", None)
    path.write_text(json.dumps(settings))


def test_a_pre_ledger_lineage_with_unrecorded_corpora_cannot_be_declared_disjoint(
    model_folder, tmp_path
):
    """A (DP) -> B (DP, declared) -> A declared disjoint, both exports from before the
    ledger: stage 0 is rebuilt from export1's embedded record, which names no corpora, so
    the check passed vacuously and the run reported max(ε0, ε1, ε2). Refused in one line;
    not declared, A's people get stages 0 and 2 composed."""
    chain = Chain(tmp_path, model_folder)
    chain.stage("A", "s0")
    _as_before_the_ledger(tmp_path / "export0")
    chain.stage("B", "s1", declared=True)
    _as_before_the_ledger(tmp_path / "export1")
    with pytest.raises(ConfigError, match="corpora are not recorded") as error:
        chain.run("A", "s2", declared=True)
    assert "\n" not in str(error.value) and "drop model.pretrained_data_disjoint" in str(
        error.value
    )
    _, _, report = chain.run("A", "s2")
    assert report.total_epsilon >= _optimistic("s0", "s2")


def _drop_stage_0(settings):
    settings["ledger"].pop(0)


def _rename_stage_0(settings):
    settings["ledger"][0]["corpora"][0]["corpus"] = "files:another_corpus"


def _stage_0_spent_nothing(settings):
    settings["ledger"][0]["events"] = [{"kind": "epsilon_delta", "epsilon": 0.0, "delta": 0.0}]


def _stage_1_declared(settings):
    settings["ledger"][1]["declared_disjoint"] = True


def _drop_stage_0_from_both_copies(settings):
    settings["ledger"].pop(0)
    settings["privacy"]["ledger"]["stages"].pop(0)


@pytest.mark.parametrize(
    ("declared_1", "forge"),
    [
        (True, _drop_stage_0),
        (True, _rename_stage_0),
        (True, _stage_0_spent_nothing),
        (False, _stage_1_declared),
        (True, _drop_stage_0_from_both_copies),
    ],
)
def test_a_ledger_forged_against_its_own_record_is_refused(
    model_folder, tmp_path, declared_1, forge
):
    """export1's dpnmt.json "ledger" was trusted as written: a stage dropped or renamed,
    its events replaced by ε 0, or a stage marked declared lowered the next run's ε (and
    `dpnmt.report --runs` agreed). The ledger is now rebuilt from the export's own privacy
    record and refused when it differs, or when its worst class is below the record's total."""
    chain = Chain(tmp_path, model_folder)
    chain.stage("A", "s0")
    chain.stage("B", "s1", declared=declared_1)
    _, honest, _ = chain.run("A", "s2")
    path = tmp_path / "export1" / "dpnmt.json"
    settings = json.loads(path.read_text())
    forge(settings)
    path.write_text(json.dumps(settings))
    for declared in (False, True):
        with pytest.raises(ConfigError, match="contradicts its privacy record") as error:
            chain.run("A", "s2", declared=declared)
        assert "\n" not in str(error.value)
    # The report of a run that trusted such a ledger: `dpnmt.report --runs` refuses it.
    from dpnmt.sweeps import epsilon_check  # noqa: PLC0415
    from dpnmt.training import ledger  # noqa: PLC0415

    forged = ledger.parse_stages(settings["ledger"], "the forged ledger")
    claim = dataclasses.replace(honest, ledger=forged)
    plan = _plan("s2")
    report = privacy_report(plan, plan.num_steps, PUBLIC_VOCABULARY, pretrained=claim)
    check = epsilon_check.check_run(json.loads(json.dumps(report.to_json())))
    assert not check.agrees and "contradicts its privacy record" in check.note


def test_a_non_private_stage_declared_disjoint_is_checked_too(model_folder, tmp_path):
    """A (DP) -> A again without DP, declared disjoint -> D: the declaration was checked only
    in private runs, yet the ledger recorded it, so the run on D reported max(ε0, ε2) while
    A's people had been trained on without DP. The non-private run is refused as a DP one."""
    chain = Chain(tmp_path, model_folder)
    chain.stage("A", "s0")
    with pytest.raises(ConfigError, match="stage 0"):
        chain.run("A", "s1", declared=True, private=False)
    chain.stage("A", "s1", private=False)  # Not declared: A's people have no guarantee.
    with pytest.raises(ConfigError, match="∞"):
        chain.run("D", "s2", declared=True)


def test_the_adjacency_note_follows_the_worst_class_not_the_direct_parent(model_folder, tmp_path):
    """A (shuffled lots) -> B (Poisson, declared) -> A (Poisson): A's people, the worst
    class, compose a replace-with-null ε and an add/remove one, but the note compared this
    run's relation with export1's alone (both Poisson) and said nothing."""
    chain = Chain(tmp_path, model_folder)
    chain.stage("A", "s0", sampling="shuffle")
    chain.stage("B", "s1", declared=True)
    _, _, report = chain.run("A", "s2")
    assert report.ledger.classes[0].epsilon == report.total_epsilon  # A's people: the worst.
    assert "the two ε are for different neighbouring datasets" in report.composition
    assert "replace one training example by a null example" in report.composition
