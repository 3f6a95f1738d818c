"""The σ search behind `calibrate_noise_multiplier`: its invariant, its optimality, its cost."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpnmt import core
from dpnmt.core import accounting, sigma_search


def _bisection_evaluations(lo: float, hi: float, tol: float) -> int:
    """How many evaluations bisection in log σ needs to shrink [lo, hi] to 1 + tol."""
    return math.ceil(math.log2(math.log(hi / lo) / math.log1p(tol)))


class _Counted:
    """ε(σ) = a σ^-b, optionally rounded UP to a grid (a pessimistic discretisation's steps)."""

    def __init__(self, a: float, b: float, grid: float | None):
        self.a, self.b, self.grid, self.calls = a, b, grid, []

    def __call__(self, sigma: float) -> float:
        self.calls.append(sigma)
        value = self.a * sigma**-self.b
        return value if self.grid is None else math.ceil(value / self.grid) * self.grid


@settings(deadline=None, max_examples=200)
@given(
    a=st.floats(0.1, 100.0),
    b=st.floats(0.3, 4.0),
    target=st.floats(0.05, 50.0),
    grid=st.one_of(st.none(), st.sampled_from([1e-4, 1e-2, 0.5])),
    tol=st.sampled_from([1e-3, 1e-2]),
)
def test_search_keeps_its_invariant_and_is_within_tol_of_the_smallest_sigma(
    a, b, target, grid, tol
):
    epsilon = _Counted(a, b, grid)
    lo, hi = 1e-2, 1e4
    if not epsilon(lo) > target >= epsilon(hi):
        return
    sigma = sigma_search.search(epsilon, target, lo, hi, tol)
    assert epsilon(sigma) <= target  # What a run is calibrated to: never above the target.
    # The smallest σ meeting the target, by a fine bisection on the same function.
    smallest = sigma_search.search(epsilon, target, lo, hi, 1e-9)
    assert smallest / (1 + 1e-9) <= sigma <= (1 + tol) * smallest
    assert lo < sigma <= hi


def test_search_takes_fewer_evaluations_than_bisection_on_a_curved_line():
    calls = []

    def epsilon(sigma):  # Curved in (log σ, log ε), as the Gaussian mechanism's ε is.
        calls.append(sigma)
        return math.expm1(3.0 / sigma)

    target, lo, hi = 1.0, 2.5, 6.0
    assert epsilon(lo) > target >= epsilon(hi)
    sigma = sigma_search.search(epsilon, target, lo, hi, 1e-3)
    assert sigma == pytest.approx(3.0 / math.log(2.0), rel=1e-3)
    # The two ends and at most five more points, against bisection's twelve.
    assert len(set(calls)) <= 7 < 2 + _bisection_evaluations(lo, hi, 1e-3)


def test_search_falls_back_to_bisection_where_the_secant_misleads():
    # A step function: flat pieces make the secant undefined or outside the bracket.
    epsilon = _Counted(5.0, 1.0, 0.5)
    sigma = sigma_search.search(epsilon, 2.0, 1e-2, 1e4, 1e-3)
    assert epsilon(sigma) <= 2.0 < epsilon(sigma / (1 + 1e-3))


@pytest.mark.parametrize(
    "target, q, steps",
    [(8.0, 512 / 3000, 6), (8.0, 4096 / 29_000, 142), (1.0, 1024 / 29_000, 566)],
)
def test_calibrated_sigma_is_the_smallest_within_the_tolerance(target, q, steps):
    sigma = core.calibrate_noise_multiplier(target, q, steps, 1e-8)
    assert core.compute_epsilon(sigma, q, steps, 1e-8) <= target
    assert core.compute_epsilon(sigma / 1.001, q, steps, 1e-8) > target


def test_pld_calibration_at_the_search_floor_warns_without_walking_down_to_it(monkeypatch):
    calls = []
    original = accounting.event_epsilon

    def counted(event, delta, accountant="pld"):
        calls.append(accountant)
        return original(event, delta, accountant)

    monkeypatch.setattr(accounting, "event_epsilon", counted)
    floor_epsilon = core.compute_epsilon(1e-2, 0.5, 1, 1e-5, "rdp")
    with pytest.warns(UserWarning, match="smallest noise multiplier searched"):
        sigma = core.calibrate_noise_multiplier(2 * floor_epsilon, 0.5, 1, 1e-5)
    assert sigma == 1e-2
    assert len(calls) <= 4


def test_search_bisects_where_the_secant_would_leave_the_bracket_far_behind():
    # Two nearly equal values on one side: the secant's root is astronomically far.
    def epsilon(sigma):
        return 50 * (1 + 1e-12 / sigma) if sigma < 100 else 1 / sigma

    sigma = sigma_search.search(epsilon, 1.0, 1e-2, 1e4, 1e-3)
    assert epsilon(sigma) <= 1.0 < epsilon(sigma / (1 + 1e-3))


@pytest.mark.parametrize("tol", [0.0, -1e-3, float("nan"), 1e-20, 2.0])
def test_a_tolerance_the_search_cannot_honour_is_refused(tol):
    with pytest.raises(ValueError, match="relative_tolerance"):
        core.calibrate_noise_multiplier(1.0, 0.01, 100, 1e-6, relative_tolerance=tol)
    with pytest.raises(ValueError, match="relative_tolerance"):
        core.calibrate_noise_multiplier_shuffled(1.0, 3, 1e-6, relative_tolerance=tol)
