"""`dpnmt.report --runs`: one table of published run folders, on the committed docs/results."""

import csv
import json
import math
import pathlib
import shutil

import numpy as np
import pytest
from absl import flags
from absl.testing import flagsaver

from dpnmt import report as report_app
from dpnmt.errors import ConfigError
from dpnmt.sweeps import epsilon_check, extrapolate, report, runs_table

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"
COMMITTED = sorted(p.parent for p in RESULTS.glob("**/results.json"))
PRIVATE = [
    p for p in COMMITTED if json.loads((p / "results.json").read_text())["privacy"]["private"]
]


def _copy(folder: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    target = tmp_path / "runs" / folder.relative_to(RESULTS)
    shutil.copytree(folder, target)
    return target


def _edit_privacy(folder: pathlib.Path, **changes) -> None:
    results = json.loads((folder / "results.json").read_text())
    results["privacy"].update(changes)
    (folder / "results.json").write_text(json.dumps(results))


def test_every_committed_private_run_recomputes_its_epsilon_with_dp_accounting():
    assert {p.parent.name for p in PRIVATE} >= {"eps1-poisson", "eps8-poisson", "eps8-shuffle"}
    for folder in PRIVATE:
        privacy = json.loads((folder / "results.json").read_text())["privacy"]
        check = epsilon_check.check_run(privacy)
        assert check.agrees and check.recomputed is not None, (folder, check)
        assert check.recomputed == pytest.approx(privacy["dp_sgd_epsilon"], rel=1e-3)
        # float(): a vocabulary outside the guarantee publishes total ε "inf".
        assert check.total_recomputed == pytest.approx(float(privacy["total_epsilon"]), rel=1e-3)


@pytest.mark.parametrize(
    "run, changes",
    [
        ("multi30k/eps8-poisson/seed0", {"noise_multiplier": 0.6278367307634745 * 1.05}),
        ("multi30k/eps8-poisson/seed0", {"steps_planned": 100}),
        ("multi30k/eps8-poisson/seed0", {"total_epsilon": 7.99}),  # Vocabulary's ε dropped.
        # A shuffled run's ε recomputed as if Poisson (the literature's mistake) is far smaller.
        ("multi30k/eps8-shuffle/seed0", {"sampling": "poisson"}),
        ("multi30k/eps1-poisson/seed0", {"dp_sgd_epsilon": 0.9}),
    ],
)
def test_a_run_whose_epsilon_does_not_recompute_is_refused_before_writing(run, changes, tmp_path):
    folder = _copy(RESULTS / run, tmp_path)
    _edit_privacy(folder, **changes)
    out = tmp_path / "report"
    with pytest.raises(ConfigError, match="does not recompute.*DISAGREES"):
        report.write_runs_report([str(folder)], str(out))
    assert not out.exists()


def test_a_nonprivate_run_claiming_a_finite_epsilon_is_refused(tmp_path):
    folder = _copy(RESULTS / "multi30k/nonprivate-shuffle/seed0", tmp_path)
    _edit_privacy(folder, dp_sgd_epsilon=8.0)
    with pytest.raises(ConfigError, match="does not recompute"):
        runs_table.load_runs([str(folder)])


def test_table_rows_are_the_runs_results(tmp_path):
    markdown = report.write_runs_report([str(RESULTS / "multi30k" / "*" / "seed0")], str(tmp_path))
    with open(tmp_path / report.TABLE_CSV) as f:
        rows = {r["run"]: r for r in csv.DictReader(f)}
    assert set(rows) == {
        f"{c}/seed0" for c in ("eps1-poisson", "eps8-poisson", "eps8-shuffle", "nonprivate-shuffle")
    }
    for name, r in rows.items():
        results = json.loads((RESULTS / "multi30k" / name / "results.json").read_text())
        privacy = results["privacy"]
        assert float(r["bleu"]) == results["test"]["bleu"]
        assert float(r["epsilon"]) == float(privacy["dp_sgd_epsilon"])
        assert float(r["sigma"]) == privacy["noise_multiplier"]
        assert int(r["lot_size"]) == privacy["expected_lot_size"]
        expected_epochs = (
            results["steps_done"] * privacy["expected_lot_size"] / privacy["dataset_size"]
        )
        assert float(r["epochs"]) == pytest.approx(expected_epochs)
        assert math.isnan(float(r["epsilon_recomputed"])) == (not privacy["private"])
    assert "| eps8-poisson/seed0 | poisson | 0.39 |" in markdown
    assert "eps8-poisson/seed0: noise σC√d/L = 2.52" in markdown  # From its noise_to_signal.json.
    assert "eps8-shuffle/seed0: noise std per coordinate" in markdown  # None published: σC/L.
    assert markdown.count(extrapolate.LABEL) >= 4
    assert (tmp_path / "learning_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_curves_read_validation_only_from_metrics_jsonl_last_record_wins(tmp_path):
    folder = _copy(RESULTS / "multi30k/eps8-poisson/seed0", tmp_path)
    lines = [
        {"step": 0, "validation/loss": 8.0},
        {"step": 12, "train/loss": 1.0, "privacy/epsilon_spent": 5.0},
        {"step": 12, "validation/loss": 7.0, "validation/bleu": 0.1},
        {"step": 12, "validation/loss": 6.5, "validation/bleu": 0.2},  # A resumed session.
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    run = runs_table.load_runs([str(folder)])[0][0]
    curve = runs_table.validation_curve(run)
    assert [p["step"] for p in curve] == [0, 12]
    assert curve[1] == {
        "step": 12,
        "epoch": pytest.approx(12 * 512 / 29000),
        "loss": 6.5,
        "bleu": 0.2,
    }


def test_a_private_runs_carved_validation_curve_is_not_shown(tmp_path):
    folder = _copy(RESULTS / "multi30k/eps8-poisson/seed0", tmp_path)
    results = json.loads((folder / "results.json").read_text())
    results["validation_is_private"] = True
    (folder / "results.json").write_text(json.dumps(results))
    markdown = report.write_runs_report([str(folder)], str(tmp_path / "out"))
    assert "seed0: validation carved from the private train split: not shown." in markdown
    assert runs_table.validation_curve(runs_table.load_runs([str(folder)])[0][0]) == []


def test_samples_come_from_the_published_test_decode(tmp_path):
    folder = _copy(RESULTS / "multi30k/eps8-poisson/seed0", tmp_path)
    (folder / "decode_test").mkdir()
    (folder / "decode_test" / "hypotheses.test.txt").write_text(
        "A man .\n\nTwo dogs .\nA fourth line\n"
    )
    markdown = report.write_runs_report([str(folder)], str(tmp_path / "out"), samples=3)
    assert "  1. A man .\n  2. (empty)\n  3. Two dogs .\n" in markdown
    assert "A fourth line" not in markdown


def test_saturating_fit_recovers_a_known_curve_and_labels_extrapolation():
    epochs = np.arange(1, 11, dtype=float)
    bleu = 30 - 25 * np.exp(-epochs / 2.0)
    fit = extrapolate.fit(epochs, bleu)
    assert fit.plateau == pytest.approx(30, abs=1e-3) and fit.scale == pytest.approx(2, abs=1e-3)
    curve = [{"epoch": e, "bleu": b} for e, b in zip(epochs, bleu, strict=True)]
    line = extrapolate.describe("run", curve, at_epochs=20)
    assert f"{extrapolate.LABEL}: {30 - 25 * np.exp(-10):.2f} at epoch 20.0, plateau 30.00" in line
    # Still rising linearly: the plateau is not named.
    rising = [{"epoch": e, "bleu": 0.5 * e} for e in epochs]
    assert "plateau not identified" in extrapolate.describe("run", rising)
    assert extrapolate.fit(epochs[:3], bleu[:3]) is None
    # Falling towards 1 from above: written with a plus sign, and said to fall.
    falling = [{"epoch": e, "bleu": 1 + 2 * np.exp(-e / 2.0)} for e in epochs]
    line = extrapolate.describe("run", falling)
    assert "(fit 1.00 + 2.00·exp(−epoch/2.00)" in line and "the fitted curve falls" in line
    assert "−" not in line.split("(fit ")[1].split("·")[0]
    # Risen before the first point (the LoRA row's shape): only the plateau is named.
    steps = [{"epoch": e, "bleu": 10 + 0.3 * (-1) ** i} for i, e in enumerate(2 * epochs)]
    line = extrapolate.describe("run", steps)
    assert "flat from the first point" in line and "exp(" not in line and "falls" not in line
    plateau = extrapolate.fit([p["epoch"] for p in steps], [p["bleu"] for p in steps]).plateau
    assert plateau == pytest.approx(10, abs=0.1) and f"plateau {plateau:.2f}" in line


def test_app_needs_exactly_one_source_and_an_out_folder(tmp_path):
    runs = f"--runs={RESULTS / 'multi30k' / '*' / 'seed0'}"
    for extra, message in (([], "--runs needs --out"), ([f"--workdir={tmp_path}"], "exactly one")):
        with flagsaver.flagsaver():
            flags.FLAGS(["report", runs, *extra])
            with pytest.raises(ConfigError, match=message):
                report_app.main(["report"])
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("flag", ["--starts=docs/results/captions_zeroshot_test", "--decodings=x"])
@pytest.mark.parametrize("source", [["--workdir=W"], ["--tuning", "--runs=W"]])
def test_starts_and_decodings_belong_to_the_runs_table_only(tmp_path, flag, source):
    args = [a.replace("=W", f"={tmp_path}") for a in source]
    with flagsaver.flagsaver():
        flags.FLAGS(["report", *args, flag, f"--out={tmp_path / 'out'}"])
        with pytest.raises(ConfigError, match="belongs to the runs table"):
            report_app.main(["report"])
    assert not (tmp_path / "out").exists()


def test_noise_to_signal_says_when_no_run_is_private(tmp_path):
    folder = _copy(RESULTS / "m30k_nonprivate_ref", tmp_path)
    markdown = report.write_runs_report([str(folder)], str(tmp_path / "out"), samples=1)
    section = markdown.split("## Noise to signal (private runs)")[1].split("##")[0]
    assert section.strip() == "No private run among these runs."
    private = report.write_runs_report([str(_copy(PRIVATE[0], tmp_path))], str(tmp_path / "o2"))
    assert "No private run" not in private


def test_tuning_rule_prefers_bleu_then_the_lower_loss_among_ties():
    from dpnmt.sweeps import tuning_table

    def rows(*specs):
        out = []
        for run, bleu, loss, epsilon, finetune in specs:
            out.append(
                dict(run=run, validation_bleu=bleu, validation_loss=loss)
                | dict(epsilon=epsilon, finetune=finetune)
            )
        return out

    def chosen(specs):
        marked = tuning_table.choose(rows(*specs))
        return [r["run"] for r in marked if r["chosen"] == tuning_table.CHOSEN]

    # A clear BLEU winner wins despite a higher loss.
    assert chosen([("a", 5.0, 3.0, 8, "all"), ("b", 4.0, 2.0, 8, "all")]) == ["a"]
    # Within 0.5 BLEU of the best: the lower loss wins.
    assert chosen([("a", 5.0, 3.0, 8, "all"), ("b", 4.6, 2.0, 8, "all")]) == ["b"]
    # One winner per (ε, fine-tuned parameters) group.
    groups = [
        ("a", 1.0, 3.0, 8, "all"),
        ("b", 1.0, 2.0, 8, "all"),
        ("c", 1.0, 3.0, 1, "all"),
        ("d", 1.0, 2.5, 1, "all"),
        ("e", 1.0, 2.0, 8, "lora"),
    ]
    assert chosen(groups) == ["b", "d", "e"]
    # Calibrated to one target at other L or T (ε 7.99 and 8.00): one group, one winner.
    target = [("a", 1.0, 3.0, 7.99, "lora"), ("b", 1.0, 2.0, 8.00, "lora")]
    assert chosen(target) == ["a", "b"]  # Without the target: two groups.
    marked = tuning_table.choose([r | {"target_epsilon": 8.0} for r in rows(*target)])
    assert [r["run"] for r in marked if r["chosen"] == tuning_table.CHOSEN] == ["b"]
    # Only a σ calibrated to the target counts: a given σ is grouped by its achieved ε.
    dp = {"enabled": True, "target_epsilon": 8.0, "noise_multiplier": None}
    assert tuning_table._target({"dp": dp}) == 8.0
    assert tuning_table._target({"dp": dp | {"noise_multiplier": 0.5}}) is None
    assert tuning_table._target({"dp": dp | {"enabled": False}}) is None
    # Another δ, sampling or unit is another group.
    setting = [{"setting": (1e-8, "poisson", "example")}, {"setting": (1e-5, "poisson", "example")}]
    marked = tuning_table.choose(
        [r | d | {"target_epsilon": 8.0} for r, d in zip(rows(*target), setting, strict=True)]
    )
    assert [r["run"] for r in marked if r["chosen"] == tuning_table.CHOSEN] == ["a", "b"]


def test_tuning_table_reads_the_committed_grid_and_refuses_unfinished(tmp_path):
    from dpnmt.sweeps import report, tuning_table

    runs = str(RESULTS / "standin" / "*" / "eps8-poisson" / "seed0")
    markdown = report.write_tuning_report([runs], str(tmp_path / "t"))
    lines = [line for line in markdown.splitlines() if line.startswith("| ")]
    assert lines[0].startswith("| run | fine-tuned | learning rate | C |")
    body = [line.split(" | ") for line in lines[1:]]
    assert len(body) >= 3 and sum(tuning_table.CHOSEN in row[-1] for row in body) == 1
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "results.json").write_text('{"finished": false}')
    with pytest.raises(ConfigError, match="--tuning needs finished runs only"):
        report.write_tuning_report([runs, str(unfinished)], str(tmp_path / "u"))


def test_tuning_refuses_a_run_validated_on_private_pairs(tmp_path):
    from dpnmt.sweeps import report

    run = tmp_path / "carved"
    shutil.copytree(RESULTS / "standin" / "lr3e-3_C1.0" / "eps8-poisson" / "seed0", run)
    results = json.loads((run / "results.json").read_text())
    assert results["privacy"]["private"] is True
    results["validation_is_private"] = True
    (run / "results.json").write_text(json.dumps(results))
    with pytest.raises(ConfigError, match="carved from the private train split"):
        report.write_tuning_report([str(run)], str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_a_tagged_test_decoding_adds_a_row_with_its_scores_and_the_runs_epsilon(tmp_path):
    run = RESULTS / "m30k_from_public" / "eps8-poisson" / "seed0"
    folders = [str(RESULTS / "m30k_nonprivate_ref"), str(run)]  # The reference has no tag.
    report.write_runs_report(folders, str(tmp_path / "out"), decodings=["norepeat6"])
    with open(tmp_path / "out" / report.TABLE_CSV) as f:
        rows = list(csv.DictReader(f))
    assert [r["run"] for r in rows] == [
        "m30k_nonprivate_ref",
        "m30k_from_public/eps8-poisson/seed0",
        "m30k_from_public/eps8-poisson/seed0 [norepeat6]",
    ]
    decoded = json.loads((run / "decode_test_norepeat6" / "results.json").read_text())
    own, tagged = rows[1], rows[2]
    assert float(tagged["bleu"]) == decoded["scores"]["bleu"] != float(own["bleu"])
    assert float(tagged["bertscore_f1"]) == decoded["scores"]["bertscore"]["f1"]
    for column in ("epsilon", "epsilon_total", "sigma", "steps", "epsilon_recomputed"):
        assert tagged[column] == own[column], column


@pytest.mark.parametrize(
    "change",
    [
        {"steps_done": 565},  # Another checkpoint.
        {"split": "validation"},
        {"scores": {"num_sentences": 50}},  # dpnmt.decode --max_examples=50.
        {"privacy": {"noise_multiplier": 1.5}},  # Another run's decode.
        {"privacy": {"dp_sgd_epsilon": 3.0}},
    ],
)
def test_a_tagged_decoding_that_is_not_this_runs_whole_test_decode_is_refused(tmp_path, change):
    folder = _copy(RESULTS / "m30k_from_public" / "eps8-poisson" / "seed0", tmp_path)
    path = folder / "decode_test_norepeat6" / "results.json"
    decoded = json.loads(path.read_text())
    for key, value in change.items():
        decoded[key] = {**decoded[key], **value} if isinstance(value, dict) else value
    path.write_text(json.dumps(decoded))
    with pytest.raises(ConfigError, match="not a whole test decode"):
        report.write_runs_report([str(folder)], str(tmp_path / "out"), decodings=["norepeat6"])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("tag,message", [("norepeat9", "no run has"), ("../x", "not tags")])
def test_a_decodings_tag_no_run_has_or_malformed_is_refused(tmp_path, tag, message):
    run = RESULTS / "m30k_from_public" / "eps8-poisson" / "seed0"
    with pytest.raises(ConfigError, match=message):
        report.write_runs_report([str(run)], str(tmp_path / "out"), decodings=[tag])
    assert not (tmp_path / "out").exists()


START = RESULTS / "captions_zeroshot_test"  # The captions stage's export decoded zero-shot.


def test_a_zero_shot_start_adds_rows_first_with_its_scores_and_epsilon_zero(tmp_path):
    run = RESULTS / "m30k_from_captions_lora" / "eps8-poisson" / "seed0"  # The start's corpus.
    out = tmp_path / "out"
    report.write_runs_report([str(run)], str(out), decodings=["norepeat6"], starts=[str(START)])
    with open(out / report.TABLE_CSV) as f:
        rows = list(csv.DictReader(f))
    assert [r["run"] for r in rows[:2]] == [
        "captions_zeroshot_test (zero-shot)",
        "captions_zeroshot_test (zero-shot) [norepeat6]",
    ]
    for row, folder in zip(rows, ("decode_test", "decode_test_norepeat6"), strict=False):
        scores = json.loads((START / folder / "results.json").read_text())["scores"]
        assert float(row["bleu"]) == scores["bleu"]
        assert float(row["bertscore_f1"]) == scores["bertscore"]["f1"]
        assert float(row["epsilon"]) == float(row["epsilon_total"]) == 0.0
        assert row["sampling"] == runs_table.NO_PRIVATE_DATA
        assert row["steps"] == "0" and math.isnan(float(row["sigma"]))
    assert rows[2]["run"] == "seed0"  # The DP run's own rows follow.


@pytest.mark.parametrize(
    "change",
    [
        {"steps_done": 566},  # A trained run's decode, not a zero-shot one.
        {"split": "validation"},
        {"scores": {"num_sentences": 50}},
        {"privacy": {"private": True}},
    ],
)
def test_a_start_that_is_not_a_whole_zero_shot_test_decode_is_refused(tmp_path, change):
    folder = tmp_path / "start"
    shutil.copytree(START, folder)
    path = folder / "decode_test" / "results.json"
    decoded = json.loads(path.read_text())
    for key, value in change.items():
        decoded[key] = {**decoded[key], **value} if isinstance(value, dict) else value
    path.write_text(json.dumps(decoded))
    run = RESULTS / "m30k_from_captions_lora" / "eps8-poisson" / "seed0"
    with pytest.raises(ConfigError, match="not a whole zero-shot decode"):
        report.write_runs_report([str(run)], str(tmp_path / "out"), starts=[str(folder)])
    assert not (tmp_path / "out").exists()


def _start_copy(tmp_path, **privacy):
    """A copy of START whose decodes' privacy records have `privacy` merged in (None: dropped)."""
    folder = tmp_path / "start"
    shutil.copytree(START, folder, dirs_exist_ok=True)
    for name in ("decode_test", "decode_test_norepeat6"):
        path = folder / name / "results.json"
        decoded = json.loads(path.read_text())
        for key, value in privacy.items():
            if value is None:
                decoded["privacy"].pop(key, None)
            elif isinstance(value, dict):
                decoded["privacy"][key] = {**decoded["privacy"][key], **value}
            else:
                decoded["privacy"][key] = value
        path.write_text(json.dumps(decoded))
    return folder


def _start_row(tmp_path, folder):
    run = RESULTS / "m30k_from_captions_lora" / "eps8-poisson" / "seed0"  # Its own corpus.
    report.write_runs_report([str(run)], str(tmp_path / "out"), starts=[str(folder)])
    with open(tmp_path / "out" / report.TABLE_CSV) as f:
        return next(csv.DictReader(f))


@pytest.mark.parametrize(
    "privacy, expected",
    [
        ({}, 0.0),  # The captions start: public data, declared disjoint, no DP.
        ({"pretrained": {"declared_disjoint": False, "composed": True, "epsilon": 3.0}}, 3.0),
        (
            {"pretrained": {"declared_disjoint": False, "composed": True, "epsilon": "inf"}},
            math.inf,
        ),
        ({"pretrained": {"parallel": True, "epsilon": 2.5}}, 2.5),  # Disjoint, DP-trained.
        ({"pretrained": {"composed": True, "epsilon": -1.0}}, math.inf),  # No guarantee.
        ({"pretrained": {"composed": True, "epsilon": False}}, math.inf),  # Not a number.
        # An export of this corpus (not declared disjoint) that composes nothing: never 0.
        ({"pretrained": {"declared_disjoint": False, "composed": False, "epsilon": 3.0}}, 3.0),
        # A declaration refused (e.g. the export was trained on this corpus), or no record.
        ({"pretrained_problems": ["declared disjoint, but trained on this corpus"]}, math.inf),
    ],
)
def test_a_starts_epsilon_is_its_models_own_on_this_corpus(tmp_path, privacy, expected):
    claim = json.loads((START / "decode_test" / "results.json").read_text())["privacy"]
    assert claim["pretrained"]["declared_disjoint"] and not claim["pretrained_problems"]
    row = _start_row(tmp_path, _start_copy(tmp_path, **privacy))
    assert float(row["epsilon_total"]) == expected and float(row["epsilon"]) == 0.0
    label = runs_table.NO_PRIVATE_DATA if expected == 0 else runs_table.ZERO_SHOT
    assert row["sampling"] == label


@pytest.mark.parametrize(
    "privacy, message",
    [
        ({"pretrained_problems": None}, "no record of the decoded model's own privacy"),
        ({"pretrained_problems": ""}, "must be a list"),
        ({"pretrained": None}, "missing or malformed"),
        ({"pretrained": {"epsilon": "many"}}, "missing or malformed"),
        ({"corpus": "files:multi30k_test2017"}, "none of the runs'"),
    ],
)
def test_a_start_without_a_sound_record_of_its_model_or_corpus_is_refused(
    tmp_path, privacy, message
):
    folder = _start_copy(tmp_path, **privacy)
    with pytest.raises(ConfigError, match=message):
        _start_row(tmp_path, folder)
    assert not (tmp_path / "out").exists()


def test_a_start_without_a_test_decode_is_refused(tmp_path):
    run = RESULTS / "m30k_from_public" / "eps8-poisson" / "seed0"
    with pytest.raises(ConfigError, match="--starts: .* has no decode_test"):
        report.write_runs_report([str(run)], str(tmp_path / "out"), starts=[str(run.parent)])
