"""Published runs' guarantee together (`epsilon_check.released_together`), on committed runs."""

import json
import math
import pathlib

import dp_accounting
import pytest
from dp_accounting.pld import pld_privacy_accountant

from dpnmt.sweeps import epsilon_check, report

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "results"
LORA8 = RESULTS / "m30k_from_captions_lora" / "eps8-poisson" / "seed0"
LORA1 = RESULTS / "m30k_from_captions_lora_eps1" / "eps1-poisson" / "seed0"
FULL8 = RESULTS / "m30k_from_public" / "eps8-poisson" / "seed0"
VOCAB8 = RESULTS / "multi30k" / "eps8-poisson" / "seed0"  # ε total adds a DP vocabulary's.
NONPRIVATE = RESULTS / "m30k_nonprivate_ref"


def _privacy(folder: pathlib.Path) -> dict:
    return json.loads((folder / "results.json").read_text())["privacy"]


def test_a_run_published_twice_is_its_steps_composed_twice():
    privacy = _privacy(LORA8)
    epsilon, delta = epsilon_check.released_together([privacy, privacy])
    q = privacy["expected_lot_size"] / privacy["dataset_size"]
    step = dp_accounting.PoissonSampledDpEvent(
        q, dp_accounting.GaussianDpEvent(privacy["noise_multiplier"])
    )
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(step, 2 * privacy["steps_planned"])
    assert delta == privacy["dp_sgd_delta"]
    assert epsilon == pytest.approx(accountant.get_epsilon(delta), rel=1e-3)
    assert privacy["dp_sgd_epsilon"] < epsilon < 2 * privacy["dp_sgd_epsilon"]


def test_together_is_monotone_order_free_and_below_the_sum():
    runs = [_privacy(p) for p in (LORA8, LORA1, FULL8)]
    two, _ = epsilon_check.released_together(runs[:2])
    three, delta = epsilon_check.released_together(runs)
    reversed_three, _ = epsilon_check.released_together(runs[::-1])
    assert three == pytest.approx(reversed_three, rel=1e-6)
    assert max(r["dp_sgd_epsilon"] for r in runs[:2]) < two < three
    assert three < sum(r["dp_sgd_epsilon"] for r in runs) and delta == 1e-8


def test_a_vocabulary_epsilon_composes_by_its_whole_total():
    lora, vocab = _privacy(LORA8), _privacy(VOCAB8)
    assert vocab["total_epsilon"] > vocab["dp_sgd_epsilon"] + 1  # The DP vocabulary's ε.
    epsilon, delta = epsilon_check.released_together([lora, vocab])
    alone, _ = epsilon_check.released_together([lora])
    assert alone == pytest.approx(lora["dp_sgd_epsilon"], rel=1e-3)
    assert epsilon == pytest.approx(alone + vocab["total_epsilon"], rel=1e-3)
    assert delta == pytest.approx(lora["dp_sgd_delta"] + vocab["total_delta"])


def test_a_non_private_or_wrong_record_gives_no_bound():
    assert epsilon_check.released_together([_privacy(LORA8), _privacy(NONPRIVATE)])[0] == math.inf
    wrong = dict(_privacy(LORA1), dp_sgd_epsilon=0.5)
    with pytest.raises(ValueError, match="does not recompute"):
        epsilon_check.released_together([_privacy(LORA8), wrong])
    with pytest.raises(ValueError, match="at least one"):
        epsilon_check.released_together([])


def test_the_report_states_the_rows_together_and_names_the_non_private_one(tmp_path):
    folders = [str(p) for p in (NONPRIVATE, FULL8, LORA8, LORA1)]
    markdown = report.write_runs_report(folders, str(tmp_path / "out"), samples=0)
    epsilon, _ = epsilon_check.released_together([_privacy(p) for p in (FULL8, LORA8, LORA1)])
    section = markdown.split("## The rows released together")[1].split("##")[0]
    assert f"The 3 private rows published together are ε {epsilon:.2f} at δ 1e-08" in section
    assert "Not private: m30k_nonprivate_ref." in section
    single = report.write_runs_report([str(LORA8)], str(tmp_path / "one"), samples=0)
    assert "1 private run: its row's ε is the table's guarantee." in single
