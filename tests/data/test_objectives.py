"""Span corruption and prefix LM: reassembly, counts, sentinel order, determinism."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpnmt.data import objectives

SENTINELS = list(range(1000, 900, -1))  # T5's layout: <extra_id_0> is the highest id.
texts = st.lists(st.integers(3, 899), min_size=0, max_size=200)
seeds = st.integers(0, 2**32 - 1)
densities = st.floats(0.01, 0.99)
spans_mean = st.floats(1.0, 10.0)


def _reassemble(inputs, targets, sentinels):
    """The text back: each sentinel in inputs replaced by its span from targets."""
    spans, current = {}, None
    for token in targets:
        if token in sentinels:
            current = token
            spans[current] = []
        else:
            spans[current].append(token)
    out = []
    for token in inputs:
        out += spans[token] if token in sentinels else [token]
    return out


@given(texts, seeds, densities, spans_mean)
def test_span_corruption_reassembles_the_text_with_the_derived_counts(ids, seed, density, mean):
    rng = np.random.default_rng(seed)
    inputs, targets = objectives.span_corruption(
        ids, rng, noise_density=density, mean_span_length=mean, sentinel_ids=SENTINELS
    )
    assert _reassemble(list(inputs), list(targets), set(SENTINELS)) == ids
    n = len(ids)
    spans = objectives.span_count(n, noise_density=density, mean_span_length=mean)
    used_in = [t for t in inputs if t in SENTINELS]
    used_out = [t for t in targets if t in SENTINELS]
    assert used_in == used_out == SENTINELS[:spans]  # unique, in T5's order
    if n < 2:
        assert spans == 0 and list(inputs) == ids and len(targets) == 0
        return
    noise = len(targets) - spans
    assert noise == objectives.noise_token_count(n, density)
    assert 1 <= noise <= n - 1
    if 1 < round(n * density) < n - 1:
        assert abs(noise - n * density) <= 0.5  # round()'s error, unclipped
    assert 1 <= spans <= min(noise, n - noise)
    if 1 < round(noise / mean) < min(noise, n - noise):
        assert abs(spans - noise / mean) <= 0.5
    # Every span non-empty: no two sentinels adjacent in targets, none last.
    assert targets[-1] not in SENTINELS
    is_sentinel = np.isin(targets, SENTINELS)
    assert not np.any(is_sentinel[:-1] & is_sentinel[1:])
    is_sentinel = np.isin(inputs, SENTINELS)
    assert not np.any(is_sentinel[:-1] & is_sentinel[1:])  # Spans never touch.
    assert len(inputs) == n - noise + spans


@given(texts, seeds)
def test_span_corruption_is_a_function_of_the_generator_state(ids, seed):
    def run():
        return objectives.span_corruption(ids, np.random.default_rng(seed), sentinel_ids=SENTINELS)

    (a_in, a_out), (b_in, b_out) = run(), run()
    assert np.array_equal(a_in, b_in) and np.array_equal(a_out, b_out)


def test_span_corruption_masks_15_percent_in_spans_of_3_on_average():
    rng = np.random.default_rng(0)
    ids = list(range(3, 103))  # n = 100: 15 noise tokens in round(15/3) = 5 spans
    inputs, targets = objectives.span_corruption(ids, rng, sentinel_ids=SENTINELS)
    assert len(targets) == 15 + 5 and len(inputs) == 85 + 5


def test_a_single_span_falls_anywhere_in_a_short_text():
    """T5's layout always masked a one-span text's END; here each start is possible."""
    ids = list(range(3, 23))  # n = 20: 3 noise tokens in 1 span, starts 0..17
    starts = set()
    for seed in range(400):
        inputs, _ = objectives.span_corruption(
            ids, np.random.default_rng(seed), sentinel_ids=SENTINELS
        )
        starts.add(int(np.flatnonzero(inputs == SENTINELS[0])[0]))
    assert starts == set(range(18))  # P(a start missed) <= 18 (17/18)^400 ~ 1e-9


def test_span_positions_vary_with_the_generator():
    ids = list(range(3, 103))
    seen = {
        tuple(objectives.span_corruption(ids, np.random.default_rng(s), sentinel_ids=SENTINELS)[0])
        for s in range(20)
    }
    assert len(seen) == 20


def test_too_few_sentinels_and_bad_parameters_are_refused():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="needs 5 sentinel ids, got 2.*tokenizer.sentinels"):
        objectives.span_corruption(list(range(100)), np.random.default_rng(0), sentinel_ids=[7, 8])
    with pytest.raises(ValueError, match="noise_density=1.5"):
        objectives.span_corruption([1, 2], rng, noise_density=1.5, sentinel_ids=[9])
    with pytest.raises(ValueError, match="mean_span_length=0.5"):
        objectives.span_corruption([1, 2], rng, mean_span_length=0.5, sentinel_ids=[9])


@given(st.integers(0, 5000), densities, spans_mean)
def test_span_count_never_decreases_with_length(n, density, mean):
    kw = dict(noise_density=density, mean_span_length=mean)
    assert objectives.span_count(n, **kw) <= objectives.span_count(n + 1, **kw)


@given(texts, seeds, st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_prefix_lm_splits_inside_the_fraction_range(ids, seed, a, b):
    low, high = min(a, b), max(a, b)
    prefix, rest = objectives.prefix_lm(
        ids, np.random.default_rng(seed), min_fraction=low, max_fraction=high
    )
    assert list(prefix) + list(rest) == ids
    n = len(ids)
    if n < 2:
        assert len(rest) == 0
        return
    split = len(prefix)
    assert 1 <= split <= n - 1
    if low == high:
        assert split == min(max(round(low * n), 1), n - 1)
    else:
        first = min(max(math.ceil(low * n), 1), n - 1)
        assert first <= split <= max(min(math.floor(high * n), n - 1), first)


def test_prefix_lm_split_is_uniform_over_its_range():
    ids = list(range(10))  # splits 1..9 with the default range
    rng = np.random.default_rng(1)
    splits = [len(objectives.prefix_lm(ids, rng)[0]) for _ in range(9000)]
    counts = np.bincount(splits, minlength=10)
    assert counts[0] == 0
    # Each of the 9 splits: Binomial(9000, 1/9), sd = 29.8; 5 sd bounds.
    assert np.all(np.abs(counts[1:] - 1000) < 5 * 29.8)


def test_find_sentinel_ids_names_the_fix_when_missing():
    vocab = {"<extra_id_0>": 50, "<extra_id_1>": 49}
    assert objectives.find_sentinel_ids(vocab.get, 2) == [50, 49]
    with pytest.raises(
        ValueError, match=r"lacks the sentinel <extra_id_2>.*tokenizer.sentinels >= 3"
    ):
        objectives.find_sentinel_ids(vocab.get, 3)
    with pytest.raises(ValueError, match="distinct"):
        objectives.find_sentinel_ids({"<extra_id_0>": 5, "<extra_id_1>": 5}.get, 2)
