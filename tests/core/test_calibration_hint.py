"""`hint=` of the σ calibrations: returned only when two fresh ε evaluations prove it the answer."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpnmt import core
from dpnmt.core import accounting

TOL = 1e-3
POISSON = dict(target_epsilon=3.0, sampling_rate=0.05, num_steps=60, delta=1e-6)
SHUFFLED = dict(target_epsilon=3.0, num_epochs=4, delta=1e-6)


@pytest.fixture
def evaluations(monkeypatch):
    """Every ε the calibration asks for, computed afresh (no memo), in order."""
    calls = []

    def counted(event, delta, accountant="pld"):
        calls.append(event)
        return accounting._epsilon_of(event, delta, accountant)

    monkeypatch.setattr(accounting, "event_epsilon", counted)
    return calls


def _holds(epsilon, target, sigma):
    """The calibration's contract: ε(σ) <= target < ε(σ / (1 + tol))."""
    return epsilon(sigma) <= target < epsilon(sigma / (1 + TOL))


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_the_searchs_own_answer_as_hint_costs_two_evaluations(evaluations, accountant):
    answer = core.calibrate_noise_multiplier(**POISSON, accountant=accountant)
    searched = len(evaluations)
    evaluations.clear()
    again = core.calibrate_noise_multiplier(**POISSON, accountant=accountant, hint=answer)
    assert again == answer and len(evaluations) == 2 < searched


@pytest.mark.parametrize("factor", [2.0, 1.01, 1 / 1.01, 0.5])
def test_a_wrong_hint_is_ignored_and_the_search_answers(factor):
    answer = core.calibrate_noise_multiplier(**POISSON, accountant="rdp")
    hinted = core.calibrate_noise_multiplier(**POISSON, accountant="rdp", hint=answer * factor)
    assert hinted == answer  # Too much noise (utility) or too little (privacy): not taken.


@pytest.mark.parametrize("factor", [1.05, 1.01, 1 / 1.01])
def test_pld_refuses_a_hint_near_its_answer_that_the_contract_rules_out(factor):
    answer = core.calibrate_noise_multiplier(**POISSON)
    assert core.calibrate_noise_multiplier(**POISSON, hint=answer * factor) == answer


def test_pld_refuses_rdps_answer_as_hint():
    rdp = core.calibrate_noise_multiplier(**POISSON, accountant="rdp")
    pld = core.calibrate_noise_multiplier(**POISSON)
    assert pld < rdp / (1 + TOL)  # RDP's σ meets the target under PLD too, with room to spare.
    assert core.calibrate_noise_multiplier(**POISSON, hint=rdp) == pld


def test_a_hint_at_the_search_floor_is_not_taken_and_the_floor_still_warns():
    floor_epsilon = core.compute_epsilon(1e-2, 0.5, 1, 1e-5, "rdp")  # Met at the floor σ.
    with pytest.warns(UserWarning, match="smallest noise multiplier"):
        sigma = core.calibrate_noise_multiplier(floor_epsilon, 0.5, 1, 1e-5, "rdp", hint=1e-2)
    assert sigma == 1e-2


@pytest.mark.parametrize(
    "hint", [math.nan, math.inf, -1.0, 0.0, 1e-3, 1e5, True, "2.0", None, 10**400]
)
def test_a_hint_that_is_not_a_sigma_in_range_is_ignored(hint):
    answer = core.calibrate_noise_multiplier(**POISSON, accountant="rdp")
    assert core.calibrate_noise_multiplier(**POISSON, accountant="rdp", hint=hint) == answer


@settings(deadline=None, max_examples=40)
@given(hint=st.floats(1e-3, 1e5))
def test_any_hint_leaves_the_contract_intact(hint):
    sigma = core.calibrate_noise_multiplier(**POISSON, accountant="rdp", hint=hint)

    def epsilon(s):
        return core.compute_epsilon(
            s, POISSON["sampling_rate"], POISSON["num_steps"], POISSON["delta"], "rdp"
        )

    assert _holds(epsilon, POISSON["target_epsilon"], sigma)


def test_shuffled_calibration_takes_its_own_answer_and_refuses_a_smaller_one(evaluations):
    answer = core.calibrate_noise_multiplier_shuffled(**SHUFFLED, accountant="rdp")
    evaluations.clear()
    assert core.calibrate_noise_multiplier_shuffled(**SHUFFLED, accountant="rdp", hint=answer) == (
        answer
    )
    assert len(evaluations) == 2
    smaller = core.calibrate_noise_multiplier_shuffled(
        **SHUFFLED, accountant="rdp", hint=answer / 1.01
    )
    assert smaller == answer
