"""`dpnmt.report --groups`: per-pair and per-group guarantees side by side (issue 31, item 4).

On the committed runs of docs/results/groups_* (a per-pair and a group-level
run on ClinSpEn and on BSD).
"""

import json
import math
import pathlib
import shutil

import pytest
from absl import flags
from absl.testing import flagsaver

from dpnmt import report as report_app
from dpnmt.errors import ConfigError
from dpnmt.sweeps import epsilon_check, groups_table, report, runs_table

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "results"
CORPORA = ("groups_clinspen", "groups_bsd")


def _rows(corpus: str) -> dict:
    folders = [str(RESULTS / corpus / unit) for unit in ("pair", "group")]
    runs, not_finished = runs_table.load_runs(folders)
    assert not not_finished
    return {run.name: (run, groups_table.row(run)) for run in runs}


@pytest.mark.parametrize("corpus", CORPORA)
def test_a_group_run_publishes_its_unit_and_an_epsilon_per_group_dp_accounting_recomputes(corpus):
    results = json.loads((RESULTS / corpus / "group" / "results.json").read_text())
    privacy, unit = results["privacy"], results["privacy"]["privacy_unit"]
    assert unit["unit"] == "group" and unit["group_cap"] >= 1
    assert unit["num_groups"] == privacy["dataset_size"] < 100  # 42 reports, 69 dialogues.
    assert unit["epsilon_per_group"] == privacy["dp_sgd_epsilon"]
    assert unit["sampling_rate"] == pytest.approx(
        unit["expected_groups_per_lot"] / unit["num_groups"]
    )
    check = epsilon_check.check_run(privacy)
    assert check.agrees and check.recomputed == pytest.approx(unit["epsilon_per_group"], rel=1e-2)


@pytest.mark.parametrize("corpus", CORPORA)
def test_each_row_states_the_epsilon_of_both_units(corpus):
    rows = _rows(corpus)
    pair_run, pair = rows["pair"]
    group_run, group = rows["group"]
    claim = pair_run.privacy["group_privacy"]
    assert pair["unit"] == "pair" and pair["k"] == claim["largest_group"]
    assert pair["epsilon_pair"] == f"{pair_run.privacy['dp_sgd_epsilon']:.2f}"
    assert pair["epsilon_group"].startswith(f"{claim['dp_sgd_epsilon']:,.0f} (bound")
    # Same target ε per unit; the per-pair run's largest group gets far less.
    assert claim["dp_sgd_epsilon"] > 10 * pair_run.privacy["dp_sgd_epsilon"]
    unit = group_run.privacy["privacy_unit"]
    epsilon = group_run.privacy["dp_sgd_epsilon"]
    assert group["unit"] == "group" and group["n"] == unit["num_groups"]
    assert group["k"] == unit["group_cap"] and group["lot_size"] == unit["expected_groups_per_lot"]
    assert group["epsilon_group"] == f"{epsilon:.2f}"
    # A pair changed inside one group: group privacy over 2 groups, (2ε, (1 + e^ε) δ).
    delta = (1 + math.exp(epsilon)) * group_run.privacy["dp_sgd_delta"]
    assert group["epsilon_pair"] == f"≤ {2 * epsilon:.2f} (δ {delta:.1g}; 2 groups)"
    assert pair["vocabulary"] == group["vocabulary"]  # Comparable: the same vocabulary.


def test_a_group_run_whose_epsilon_does_not_recompute_is_refused_before_writing(tmp_path):
    folder = tmp_path / "group"
    shutil.copytree(RESULTS / "groups_clinspen" / "group", folder)
    results = json.loads((folder / "results.json").read_text())
    results["privacy"]["dataset_size"] *= 2  # N_groups doubled: a smaller ε than true.
    (folder / "results.json").write_text(json.dumps(results))
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match="does not recompute"):
        report.write_groups_report([str(folder)], str(out))
    assert not out.exists()


def test_app_groups_needs_runs(tmp_path):
    with flagsaver.flagsaver():
        flags.FLAGS(["report", "--groups", f"--workdir={tmp_path}"])
        with pytest.raises(ConfigError, match="--groups needs --runs"):
            report_app.main(["report"])


def test_the_groups_needed_table_in_the_docs_is_the_scripts_output():
    # docs/results/groups_needed/make.py writes table.md (minutes of PLD: not rerun here).
    table = (RESULTS / "groups_needed" / "table.md").read_text().strip()
    assert table.count("\n") >= 4, "one row per reference run"
    assert table in (RESULTS.parents[1] / "docs" / "privacy.md").read_text()
