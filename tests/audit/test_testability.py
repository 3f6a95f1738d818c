"""Can an audit contradict its claim at all? Reachable bounds, outcomes, the plan."""

import math

import numpy as np
import pytest
from scipy import special

from dpnmt import auditing
from dpnmt.config import RunConfig
from tests.small_configs import load_config

CONFIDENCE, DELTA = 0.95, 1e-8


def reachable(num_inserted, num_held_out=None, delta=DELTA):
    num_held_out = num_inserted if num_held_out is None else num_held_out
    return auditing.reachable_lower_bound(
        num_inserted, num_held_out, confidence=CONFIDENCE, delta=delta
    )


def test_reachable_bound_at_100_canaries_is_about_2_5():
    # All 50 guesses right: P = sigmoid(ε)^50 <= 0.05 / 3 (Bonferroni over the 3
    # thresholds of tied, separated scores); the δ term (2 M δ = 2e-6) is negligible.
    analytic = special.logit((0.05 / 3) ** (1 / 50))
    assert reachable(50) == pytest.approx(analytic, abs=0.01)
    assert 2.4 < reachable(50) < 2.5


def test_reachable_bound_grows_with_the_canaries_until_delta_dominates():
    bounds = [reachable(m) for m in (10, 20, 50, 100, 200, 500, 1000, 5000)]
    assert all(a < b for a, b in zip(bounds, bounds[1:], strict=False))
    # At δ = 1e-5 the δ term 2 M δ wins past a few thousand canaries.
    assert reachable(50_000, delta=1e-5) < reachable(5_000, delta=1e-5)
    assert reachable(0, 10) == reachable(10, 0) == 0.0


@pytest.mark.parametrize("seed", range(4))
def test_no_scores_give_more_than_the_reachable_bound(seed):
    rng = np.random.default_rng(seed)
    num_in, num_out = rng.integers(20, 60, size=2)
    for shift in (0.0, 2.0, 100.0):  # Indistinguishable, overlapping, perfectly separated.
        report = auditing.membership_audit(
            rng.normal(size=num_in) + shift,
            rng.normal(size=num_out),
            claimed_epsilon=1.0,
            claimed_delta=DELTA,
            repeats=1,
            confidence=CONFIDENCE,
        )
        assert report["epsilon_lower_bound"] <= report["reachable_epsilon_lower_bound"] + 1e-9
        assert report["reachable_epsilon_lower_bound"] == pytest.approx(reachable(num_in, num_out))


@pytest.mark.parametrize(
    "lower, reach, epsilon, delta, outcome",
    [
        (0.0, 2.5, math.inf, 1e-8, auditing.NO_CLAIM),
        (0.0, 2.5, 3.0, 1.5, auditing.VACUOUS),
        (2.4, 2.5, 11.7, 1e-8, auditing.UNTESTABLE),
        (0.0, 2.5, 2.5, 1e-8, auditing.UNTESTABLE),  # The bound cannot exceed 2.5.
        (0.0, 2.5, 1.0, 1e-8, auditing.CONSISTENT),
        (1.0, 2.5, 1.0, 1e-8, auditing.CONSISTENT),
        (1.9, 2.5, 1.0, 1e-8, auditing.INCONSISTENT),
    ],
)
def test_audit_outcome(lower, reach, epsilon, delta, outcome):
    assert auditing.audit_outcome(lower, reach, epsilon, delta) == outcome


def test_a_claim_above_the_reachable_bound_is_untestable_not_consistent():
    """The README's case in small: perfect scores cannot contradict ε = 8 with 80 canaries."""
    in_scores, out_scores = np.arange(40) + 100.0, np.arange(40.0)
    report = auditing.membership_audit(
        in_scores, out_scores, claimed_epsilon=8.0, claimed_delta=DELTA, repeats=1, confidence=0.95
    )
    assert report["outcome"] == auditing.UNTESTABLE and not report["contradicted"]
    assert report["epsilon_lower_bound"] == pytest.approx(report["reachable_epsilon_lower_bound"])
    search = auditing.canaries_to_test(8.0, confidence=0.95, delta=DELTA)
    assert search.num_canaries is not None and search.bound > 8.0
    assert report["verdict"].startswith("UNTESTABLE")
    assert f"{report['reachable_epsilon_lower_bound']:.3g}" in report["verdict"]
    assert f"M = {search.num_canaries:,}" in report["verdict"]


def test_canaries_to_test_finds_the_smallest_m_to_ten_percent():
    search = auditing.canaries_to_test(4.0, confidence=CONFIDENCE, delta=DELTA)
    m = search.num_canaries
    assert auditing.reachable_lower_bound(
        m // 2, m - m // 2, confidence=CONFIDENCE, delta=DELTA
    ) == pytest.approx(search.bound)
    assert search.bound > 4.0
    smaller = int(m / 1.15)
    assert reachable(smaller // 2, smaller - smaller // 2) <= 4.0
    assert len(str(m).rstrip("0")) <= 2  # Two significant digits.


def test_canaries_to_test_says_when_no_m_or_more_than_the_cap_is_needed():
    peaked = auditing.canaries_to_test(8.0, confidence=CONFIDENCE, delta=1e-5)
    assert peaked.num_canaries is None and peaked.peaked and 6.0 < peaked.bound < 8.0
    assert "no number of canaries" in peaked.describe(8.0)
    capped = auditing.canaries_to_test(
        30.0, confidence=CONFIDENCE, delta=DELTA, max_canaries=10_000
    )
    assert capped.num_canaries is None and not capped.peaked
    assert capped.searched_up_to == 10_000
    assert "more than 10,000 canaries" in capped.describe(30.0)


def tiny_config(variant):
    return load_config("tiny", variant)


def test_forecast_claim_composes_dp_sgd_target_and_dp_vocabulary():
    epsilon, delta = auditing.forecast_claim(RunConfig.of(tiny_config("eps8")))
    assert epsilon == pytest.approx(11.72, abs=0.01)  # The trained run reports 11.72.
    assert delta == pytest.approx(1.1e-8)
    assert auditing.forecast_claim(RunConfig.of(tiny_config("nonprivate")))[0] == math.inf
    config = tiny_config("eps8")
    config.tokenizer.kind = "sentencepiece_public"
    assert auditing.forecast_claim(RunConfig.of(config)) == (8.0, 1e-8)
    config.dp.target_epsilon, config.dp.noise_multiplier = None, 1.0
    assert auditing.forecast_claim(RunConfig.of(config)) == (None, 1e-8)


def test_forecast_claim_counts_the_vocabulary_that_tokenizer_kind_auto_resolves_to():
    """tokenizer.kind=auto trains a DP-SentencePiece vocabulary from scratch: its ε counts."""
    explicit = auditing.forecast_claim(RunConfig.of(tiny_config("eps8")))
    config = tiny_config("eps8")
    config.tokenizer.kind = "auto"
    assert auditing.forecast_claim(RunConfig.of(config)) == explicit


def test_audit_plan_says_untestable_before_training():
    options = auditing.AuditOptions()
    outcome, line = auditing.audit_plan(50, 50, (4.0, DELTA), options)
    search = auditing.canaries_to_test(4.0, confidence=CONFIDENCE, delta=DELTA)
    assert outcome == auditing.UNTESTABLE
    assert "2.46" in line and f"M = {search.num_canaries:,}" in line and "Training anyway" in line
    outcome, line = auditing.audit_plan(50, 50, (1.0, DELTA), options)
    assert outcome == "testable" and "testable" in line
    outcome, line = auditing.audit_plan(50, 50, (math.inf, DELTA), options)
    assert outcome == auditing.NO_CLAIM and "nothing to contradict" in line
    outcome, line = auditing.audit_plan(50, 50, (None, DELTA), options)
    assert outcome == "unknown" and "2.46" in line
    grouped = auditing.AuditOptions(repeats=2)
    outcome, line = auditing.audit_plan(50, 50, (1.0, DELTA), grouped)  # Tests 2ε = 2.
    assert outcome == "testable"
    outcome, line = auditing.audit_plan(50, 50, (2.0, DELTA), grouped)  # Tests 2ε = 4.
    assert outcome == auditing.UNTESTABLE and "r = 1 tests the per-example ε" in line
