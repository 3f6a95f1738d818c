"""Published runs' guarantee together (`epsilon_check.released_together`), on committed runs."""

import json
import math
import pathlib

import dp_accounting
import pytest
from dp_accounting.pld import pld_privacy_accountant

from dpnmt.sweeps import epsilon_check, report, runs_details

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "results"
LORA8 = RESULTS / "m30k_from_captions_lora" / "eps8-poisson" / "seed0"
LORA1 = RESULTS / "m30k_from_captions_lora_eps1" / "eps1-poisson" / "seed0"
FULL8 = RESULTS / "m30k_from_public" / "eps8-poisson" / "seed0"
VOCAB8 = RESULTS / "multi30k" / "eps8-poisson" / "seed0"  # ε total adds a DP vocabulary's.
SHUFFLE8 = RESULTS / "multi30k" / "eps8-shuffle" / "seed0"
PARALLEL = RESULTS / "span_then_translate" / "b"  # A private export declared disjoint.
NONPRIVATE = RESULTS / "m30k_nonprivate_ref"
together = epsilon_check.released_together


def _privacy(folder: pathlib.Path) -> dict:
    return json.loads((folder / "results.json").read_text())["privacy"]


def _pld(privacy: dict, times: int, delta: float) -> float:
    q = privacy["expected_lot_size"] / privacy["dataset_size"]
    gaussian = dp_accounting.GaussianDpEvent(privacy["noise_multiplier"])
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(dp_accounting.PoissonSampledDpEvent(q, gaussian), times)
    return accountant.get_epsilon(delta)


def _at_delta(privacy: dict, delta: float) -> dict:
    """The same run stated at another δ (its ε recomputed there), as a run would record it."""
    moved = dict(privacy, dp_sgd_delta=delta, total_delta=delta)
    epsilon = epsilon_check.recompute_epsilon(moved)
    return dict(moved, dp_sgd_epsilon=epsilon, total_epsilon=epsilon)


def test_a_run_published_twice_is_its_steps_composed_twice():
    privacy = _privacy(LORA8)
    both = together([privacy, privacy])
    assert (both.delta, both.events, both.added) == (privacy["dp_sgd_delta"], 2, 0)
    steps = 2 * privacy["steps_planned"]
    assert both.epsilon == pytest.approx(_pld(privacy, steps, both.delta), rel=1e-3)
    assert privacy["dp_sgd_epsilon"] < both.epsilon < 2 * privacy["dp_sgd_epsilon"]


def test_together_is_monotone_order_free_and_below_the_sum():
    runs = [_privacy(p) for p in (LORA8, LORA1, FULL8)]
    two, three = together(runs[:2]), together(runs)
    assert three.epsilon == pytest.approx(together(runs[::-1]).epsilon, rel=1e-6)
    assert max(r["dp_sgd_epsilon"] for r in runs[:2]) < two.epsilon < three.epsilon
    assert three.epsilon < sum(r["dp_sgd_epsilon"] for r in runs) and three.delta == 1e-8


def test_the_event_is_read_at_the_largest_delta():
    loose = _at_delta(_privacy(LORA1), 1e-6)
    both = together([_privacy(LORA8), loose])
    assert both.delta == 1e-6 and both.events == 2
    single = together([_privacy(LORA8)])
    assert both.epsilon < single.epsilon  # At δ 1e-6, not 1e-8: still a guarantee.
    assert together([loose, _privacy(LORA8)]).delta == 1e-6


def test_a_vocabulary_epsilon_composes_by_its_whole_total():
    lora, vocab = _privacy(LORA8), _privacy(VOCAB8)
    assert vocab["total_epsilon"] > vocab["dp_sgd_epsilon"] + 1  # The DP vocabulary's ε.
    both = together([lora, vocab])
    assert (both.events, both.added) == (1, 1)
    assert both.epsilon == pytest.approx(lora["dp_sgd_epsilon"] + vocab["total_epsilon"], rel=1e-3)
    assert both.delta == pytest.approx(lora["dp_sgd_delta"] + vocab["total_delta"])
    # A reported total above the recomputed one (within the check's tolerance) is the one added.
    higher = dict(vocab, total_epsilon=vocab["total_epsilon"] + 0.05)
    assert together([lora, higher]).epsilon == pytest.approx(both.epsilon + 0.05, rel=1e-4)
    # A δ recorded above the DP-SGD one keeps a run out of the event; one never recorded
    # is rebuilt from its parts.
    wider = dict(lora, total_delta=3e-8)
    assert (together([wider]).events, together([wider]).delta) == (0, 3e-8)
    old = {k: v for k, v in vocab.items() if k != "total_delta"}
    assert together([old]).delta == pytest.approx(vocab["total_delta"])


def test_a_private_export_declared_disjoint_is_added_whole_with_its_own_total():
    parallel, lora = _privacy(PARALLEL), _privacy(LORA8)
    record = parallel["pretrained"]["record"]
    assert parallel["pretrained"]["parallel"] and record["private"]
    alone = together([parallel])
    assert (alone.events, alone.added) == (0, 1)
    assert alone.epsilon >= max(parallel["total_epsilon"], record["total_epsilon"])
    assert alone.delta == pytest.approx(parallel["dp_sgd_delta"] + record["total_delta"])
    both = together([parallel, lora])
    assert both.epsilon == pytest.approx(alone.epsilon + lora["dp_sgd_epsilon"], rel=1e-3)


def _from_export(run: dict, export: dict, **claim) -> dict:
    """`run` as if it had started from `export`'s private model (the claim's flags given)."""
    pretrained = {"dpnmt_export": True, "epsilon": export["total_epsilon"], "delta": 1e-8}
    return dict(run, pretrained=pretrained | claim | {"record": export})


def test_a_disjoint_export_below_the_run_is_still_counted_for_its_own_data():
    lora8, lora1 = _privacy(LORA8), _privacy(LORA1)
    flags = {"declared_disjoint": True, "composed": False}
    for claim in (flags | {"parallel": True}, flags):  # The second: a record before `parallel`.
        run = _from_export(lora8, lora1, **claim)
        assert epsilon_check.check_run(run).agrees
        alone = together([run])
        assert (alone.events, alone.added) == (0, 1) and alone.delta >= 2e-8
        both = together([run, lora1])  # The export's people are in lora1's data too.
        assert both.epsilon >= lora8["dp_sgd_epsilon"] + lora1["dp_sgd_epsilon"] - 1e-9


def test_a_composed_export_claim_below_its_record_is_refused():
    lora8, vocab = _privacy(LORA8), _privacy(VOCAB8)
    honest = _from_export(lora8, vocab, composed=True)
    honest["total_epsilon"] = lora8["dp_sgd_epsilon"] + vocab["total_epsilon"]
    honest["total_delta"] = lora8["dp_sgd_delta"] + vocab["total_delta"]
    result = together([honest])
    assert result.added == 1 and result.epsilon == pytest.approx(honest["total_epsilon"])
    low = _from_export(lora8, vocab, composed=True, epsilon=1.0)
    low["total_epsilon"] = lora8["dp_sgd_epsilon"] + 1.0
    assert "below its record's total" in epsilon_check.check_run(low).note
    with pytest.raises(ValueError, match="does not recompute"):
        together([low])
    cut = _from_export(lora8, dict(vocab, dp_sgd_epsilon=1.0, total_epsilon=5.03), composed=True)
    cut["total_epsilon"] = lora8["dp_sgd_epsilon"] + 5.03  # Its record does not recompute.
    assert not epsilon_check.check_run(cut).agrees


def test_no_bound_for_a_run_without_one_or_for_different_units():
    assert together([_privacy(LORA8), _privacy(NONPRIVATE)]).epsilon == math.inf
    groups = [_privacy(RESULTS / "groups_bsd" / unit) for unit in ("group", "pair")]
    mixed = together(groups)
    assert mixed.epsilon == math.inf and "different units" in mixed.note
    group = together([groups[0], groups[0]])
    assert math.isfinite(group.epsilon) and group.unit.startswith("one whole group")
    unbounded = _privacy(RESULTS / "groups_clinspen" / "pair")  # A private vocabulary: ε ∞.
    assert together([_privacy(LORA8), unbounded]).epsilon == math.inf
    shuffled = together([_privacy(LORA8), _privacy(SHUFFLE8)])
    assert math.isfinite(shuffled.epsilon) and shuffled.added == 1
    assert "not for either relation alone" in shuffled.note
    alone = together([_privacy(SHUFFLE8), _privacy(SHUFFLE8)])
    assert alone.events == 0 and alone.note == ""
    texts = together([_privacy(LORA8), dict(_privacy(LORA1), example="one text")])
    assert "at most one example in each run's data" in texts.note
    wrong = dict(_privacy(LORA1), dp_sgd_epsilon=0.5)
    with pytest.raises(ValueError, match="does not recompute"):
        together([_privacy(LORA8), wrong])
    with pytest.raises(ValueError, match="at least one"):
        together([])


def test_the_report_states_the_rows_together_rounded_up_and_names_the_rest(tmp_path):
    folders = [str(p) for p in (NONPRIVATE, FULL8, LORA8, LORA1)]
    markdown = report.write_runs_report(folders, str(tmp_path / "out"), samples=0)
    joint = together([_privacy(p) for p in (FULL8, LORA8, LORA1)])
    section = markdown.split("## The rows released together")[1].split("##")[0]
    stated = float(section.split("together are ε ")[1].split(" ")[0])
    assert joint.epsilon <= stated < joint.epsilon + 0.01
    assert "at δ 1e-08 for one training example" in section
    assert "Not private: m30k_nonprivate_ref." in section
    single = report.write_runs_report([str(LORA8)], str(tmp_path / "one"), samples=0)
    assert "One private run, " in single
    none = report.write_runs_report([str(NONPRIVATE)], str(tmp_path / "none"), samples=0)
    assert "No private run among the trained rows: none of them has a guarantee." in none
    assert runs_details._up(11.2101, 4) == "11.22" and runs_details._up(1e-8, 3) == "1e-08"
    assert runs_details._up(3.0000000000000004e-08, 3) == "3e-08"
    assert runs_details._up(3.0001e-08, 3) == "3.01e-08"
    from dpnmt.sweeps import runs_table

    runs, _ = runs_table.load_runs([str(LORA8), str(LORA1)])
    starts = [{"run": f"s (zero-shot){t}", "epsilon_total": 3.0} for t in ("", " [n6]")]
    text = runs_details.released_together(runs, starts + [{"run": "p", "epsilon_total": 0.0}])
    assert "Starts with an ε of their own on this corpus: s (zero-shot); not composed" in text
    mixed = runs_details.released_together(runs + runs_table.load_runs([str(VOCAB8)])[0])
    assert (
        "the DP-SGD of 2 runs composed with dp_accounting, the whole totals of 1 run added" in mixed
    )
