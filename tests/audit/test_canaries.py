"""Canary drawing, insertion, candidates and exposure (no training)."""

import math

import datasets
import numpy as np
import pytest

from dpnmt import auditing
from dpnmt.auditing import canaries


def draw(num=200, seed=0, **kwargs):
    return canaries.make_canaries(num, key_length=3, secret_length=4, seed=seed, **kwargs)


def test_canaries_have_distinct_keys_secret_only_in_target_and_fair_coins():
    drawn = draw(num=400)
    assert len({c.key for c in drawn}) == 400
    for c in drawn:
        assert c.secret not in c.source and c.secret in c.target
        assert c.source == canaries.SOURCE_TEMPLATE.replace("{key}", c.key)
        assert len(c.secret.split()) == 4 and all(len(d) == 1 for d in c.secret.split())
    inserted = sum(c.inserted for c in drawn)
    # Binomial(400, 1/2): sd 10; 4 sd either side.
    assert 160 <= inserted <= 240
    assert draw(num=400) == drawn  # Same seed, same canaries.
    assert [c.secret for c in draw(num=400, seed=1)] != [c.secret for c in drawn]


def test_training_pairs_repeat_inserted_canaries_and_never_hold_outs():
    drawn = draw()
    pairs = canaries.training_pairs(drawn, 3)
    inserted = [c for c in drawn if c.inserted]
    assert len(pairs) == 3 * len(inserted)
    assert set(pairs) == {(c.source, c.target) for c in inserted}
    held_out_sources = {c.source for c in drawn if not c.inserted}  # Keys are distinct.
    assert held_out_sources and not held_out_sources & {s for s, _ in pairs}
    with pytest.raises(ValueError, match="repeats"):
        canaries.training_pairs(drawn, 0)


@pytest.mark.parametrize(
    "source, target, match",
    [
        ("code {key} {secret}", "is {secret}", "no {secret}"),
        ("code", "is {secret}", "exactly one {key}"),
        ("code {key}", "is", "exactly one {secret}"),
        ("{key}", "is {secret}", "words besides"),
    ],
)
def test_bad_templates_are_refused_with_the_reason(source, target, match):
    with pytest.raises(ValueError, match=match):
        canaries.check_templates(source, target)


def test_too_few_keys_or_canaries_is_a_clear_error():
    with pytest.raises(ValueError, match="raise key_length"):
        canaries.make_canaries(200, key_length=2, secret_length=2, seed=0)
    with pytest.raises(ValueError, match="at least 10"):
        canaries.make_canaries(4, key_length=2, secret_length=2, seed=0)


def test_candidates_are_distinct_exclude_nothing_but_the_truth_and_cover_small_spaces():
    rng = np.random.default_rng(0)
    every = canaries.candidate_secrets("0 4 2", 3, 5000, rng)
    assert every[0] == "0 4 2" and len(every) == len(set(every)) == 1000
    sample = canaries.candidate_secrets("0 4 2", 3, 50, rng)
    assert sample[0] == "0 4 2" and len(set(sample)) == 51 and "0 4 2" not in sample[1:]


def test_exposure_is_maximal_for_a_first_rank_and_counts_ties_against_the_secret():
    others = np.arange(255.0)
    assert canaries.exposure(1000.0, others) == pytest.approx(8.0)
    assert canaries.exposure(-1.0, others) == pytest.approx(0.0)
    assert canaries.exposure(254.0, others) == pytest.approx(8.0 - 1.0)  # Tie: rank 2.
    # An unlearnt secret is uniformly ranked: mean exposure about 1/ln 2 bits.
    rng = np.random.default_rng(0)
    values = [canaries.exposure(rng.normal(), rng.normal(size=255)) for _ in range(4000)]
    # Per-draw sd is about 1.4 bits: 4000 draws give a standard error of 0.023.
    assert np.mean(values) == pytest.approx(1 / math.log(2), abs=0.1)


def test_group_claim_follows_group_privacy():
    assert auditing.group_claim(1.0, 1e-8, 1) == (1.0, 1e-8)
    eps, delta = auditing.group_claim(1.0, 1e-8, 3)
    assert eps == 3.0 and delta == pytest.approx(3 * math.exp(2) * 1e-8)
    assert auditing.group_claim(math.inf, 1e-8, 8) == (math.inf, 1e-8)


def test_membership_audit_separated_scores_contradict_a_small_claim():
    in_scores, out_scores = np.arange(40) + 100.0, np.arange(40.0)
    report = auditing.membership_audit(
        in_scores, out_scores, claimed_epsilon=0.5, claimed_delta=1e-8, repeats=1, confidence=0.95
    )
    assert report["auc"] == 1.0
    # 40 correct guesses: p = sigmoid(eps)^40 <= 0.05 / 3 (Bonferroni) at eps ~ 2.3.
    assert 2.0 < report["epsilon_lower_bound"] < 2.6
    assert report["outcome"] == auditing.INCONSISTENT and report["contradicted"]
    assert "INCONSISTENT" in report["verdict"]
    relaxed = auditing.membership_audit(
        in_scores, out_scores, claimed_epsilon=8.0, claimed_delta=1e-8, repeats=1, confidence=0.95
    )
    # No scores of 80 canaries can contradict ε = 8: not "consistent", untestable.
    assert relaxed["outcome"] == auditing.UNTESTABLE and not relaxed["contradicted"]


def test_membership_audit_of_indistinguishable_scores_finds_nothing():
    rng = np.random.default_rng(0)
    report = auditing.membership_audit(
        rng.normal(size=50),
        rng.normal(size=50),
        claimed_epsilon=0.1,
        claimed_delta=1e-8,
        repeats=1,
        confidence=0.95,
    )
    assert report["epsilon_lower_bound"] <= 0.1 and report["outcome"] == auditing.CONSISTENT
    assert abs(report["auc"] - 0.5) < 0.15  # AUC sd for 50 vs 50 is about 0.058.


def test_add_pairs_to_train_appends_to_train_only():
    features = datasets.Features(
        {"translation": {"de": datasets.Value("string"), "en": datasets.Value("string")}}
    )

    def split(rows):
        return datasets.Dataset.from_dict(
            {"translation": [{"de": s, "en": t} for s, t in rows]}, features=features
        )

    corpus = datasets.DatasetDict(
        train=split([("a", "b")]), validation=split([("c", "d")]), test=split([("e", "f")])
    )
    out = auditing.add_pairs_to_train([("x", "y"), ("x", "y")], "de-en")(corpus)
    assert out["train"]["translation"] == [
        {"de": "a", "en": "b"},
        {"de": "x", "en": "y"},
        {"de": "x", "en": "y"},
    ]
    assert len(out["validation"]) == len(out["test"]) == 1
