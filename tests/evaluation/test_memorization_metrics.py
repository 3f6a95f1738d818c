"""Memorization metrics: EM, token accuracy and normalised edit distance of token ids."""

import functools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpnmt.evaluation import memorization

ids = st.lists(st.integers(0, 4), max_size=9)


def reference_distance(a, b):
    """Levenshtein by its recursive definition (memoised)."""

    @functools.cache
    def d(i, j):
        if i == 0 or j == 0:
            return i + j
        return min(d(i - 1, j) + 1, d(i, j - 1) + 1, d(i - 1, j - 1) + (a[i - 1] != b[j - 1]))

    return d(len(a), len(b))


@given(ids, ids)
def test_edit_distance_is_levenshtein(a, b):
    assert memorization.edit_distance(a, b) == reference_distance(tuple(a), tuple(b))


@given(ids, ids, ids)
def test_edit_distance_is_a_metric(a, b, c):
    d = memorization.edit_distance
    assert d(a, b) == d(b, a)
    assert (d(a, b) == 0) == (a == b)
    assert d(a, c) <= d(a, b) + d(b, c)
    assert abs(len(a) - len(b)) <= d(a, b) <= max(len(a), len(b))


def test_known_distances():
    d = memorization.edit_distance
    assert d([1, 2, 3], [1, 2, 3]) == 0
    assert d([], [5, 6]) == 2
    assert d([1, 2, 3, 4], [1, 3, 4]) == 1  # One deletion.
    assert d([1, 2, 3], [3, 2, 1]) == 2  # Two substitutions.


def test_until_eos_cuts_before_the_first_eos():
    assert memorization.until_eos([5, 6, 1, 7, 1, 0], eos_id=1) == [5, 6]
    assert memorization.until_eos([5, 6, 7], eos_id=1) == [5, 6, 7]  # No eos: all of it.
    assert memorization.until_eos([1, 5], eos_id=1) == []


def test_text_scores_of_copies_shifts_and_extensions():
    target = [10, 11, 12, 13]
    assert memorization.text_scores(target, target) == {
        "exact_match": 1.0,
        "token_accuracy": 1.0,
        "edit_distance": 0.0,
    }
    # One token dropped at the front: every position shifts (TA 0), one edit (MED 1/4).
    shifted = memorization.text_scores([11, 12, 13], target)
    assert shifted == {"exact_match": 0.0, "token_accuracy": 0.0, "edit_distance": 0.25}
    # The target then more: TA counts the target's positions only, MED the extra tokens.
    longer = memorization.text_scores(target + [14, 15], target)
    assert longer == {"exact_match": 0.0, "token_accuracy": 1.0, "edit_distance": 0.5}
    # Nothing generated: MED is 1 (every target token inserted).
    assert memorization.text_scores([], target)["edit_distance"] == 1.0


@given(ids, ids.filter(bool))
def test_text_scores_ranges(generated, target):
    scores = memorization.text_scores(generated, target)
    assert 0.0 <= scores["token_accuracy"] <= 1.0
    assert scores["edit_distance"] >= 0.0
    assert (scores["exact_match"] == 1.0) == (generated == target)
    if scores["exact_match"]:
        assert scores["token_accuracy"] == 1.0 and scores["edit_distance"] == 0.0


def test_set_scores_average_texts_equally_and_refuse_empty_input():
    rows = [
        memorization.text_scores([1, 2], [1, 2]),
        memorization.text_scores([9, 9, 9, 9], [1, 2, 3, 4]),
    ]
    assert memorization.set_scores(rows) == {
        "exact_match": 0.5,
        "token_accuracy": 0.5,
        "edit_distance": 0.5,
    }
    with pytest.raises(ValueError, match="at least one text"):
        memorization.set_scores([])
    with pytest.raises(ValueError, match="empty target"):
        memorization.text_scores([1], [])
