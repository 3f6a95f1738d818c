"""The group-privacy bound of a per-example run: exact at k = 1, never below a realisable group."""

import math

import dp_accounting
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant

from dpnmt import core

SIGMA, Q, T, DELTA = 1.1, 0.02, 50, 1e-5


def test_one_example_is_the_run_s_own_guarantee():
    assert core.compute_group_epsilon(
        noise_multiplier=SIGMA, sampling_rate=Q, num_steps=T, delta=DELTA, group_size=1
    ) == core.compute_epsilon(SIGMA, Q, T, DELTA)
    assert core.compute_group_epsilon_shuffled(
        noise_multiplier=SIGMA, num_epochs=3, delta=DELTA, group_size=1
    ) == core.compute_epsilon_shuffled(SIGMA, 3, DELTA)


def _aligned_group_epsilon(k: int) -> float:
    """ε of one realisable group, pessimistic PLD: k examples whose clipped gradients coincide.

    A lot holds j ~ Binomial(k, q) of them and its sum moves by jC: a mixture of
    Gaussians over T steps (add/remove adjacency). A valid bound for every
    group of k can never be below it.
    """
    probs = [math.comb(k, j) * Q**j * (1 - Q) ** (k - j) for j in range(k + 1)]
    event = dp_accounting.SelfComposedDpEvent(
        dp_event.MixtureOfGaussiansDpEvent(SIGMA, [float(j) for j in range(k + 1)], probs), T
    )
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    accountant.compose(event)
    return float(accountant.get_epsilon(DELTA))


@pytest.mark.parametrize("k", [2, 3])
def test_the_group_s_epsilon_is_bracketed_by_the_lower_and_upper_bound(k):
    kwargs = dict(noise_multiplier=SIGMA, sampling_rate=Q, num_steps=T, delta=DELTA, group_size=k)
    upper = core.compute_group_epsilon(**kwargs)
    lower = core.group_epsilon_lower_bound(**kwargs)
    realised = _aligned_group_epsilon(k)
    single = core.compute_epsilon(SIGMA, Q, T, DELTA)
    assert realised > single * 1.5, "the aligned group must cost visibly more than one example"
    # Optimistic vs pessimistic rounding of one mechanism: at most a grid step a composition apart.
    assert lower <= realised <= lower + T * (1e-2 + 1e-3), (lower, realised)
    assert upper >= realised, (upper, realised)


def test_one_example_s_lower_bound_is_its_epsilon():
    lower = core.group_epsilon_lower_bound(
        noise_multiplier=SIGMA, sampling_rate=Q, num_steps=T, delta=DELTA, group_size=1
    )
    assert lower <= core.compute_epsilon(SIGMA, Q, T, DELTA) <= lower + T * (1e-2 + 1e-4)


def test_the_shuffled_bound_is_tight_when_the_group_shares_one_lot():
    # All k in one lot each epoch: E Gaussian mechanisms of sensitivity kC, exactly the bound.
    k, epochs = 3, 2
    exact = core.compute_epsilon_shuffled(SIGMA / k, epochs, DELTA)
    assert core.compute_group_epsilon_shuffled(
        noise_multiplier=SIGMA, num_epochs=epochs, delta=DELTA, group_size=k
    ) == pytest.approx(exact, rel=1e-12)


def test_the_bound_grows_with_the_group():
    values = [
        core.compute_group_epsilon(
            noise_multiplier=SIGMA, sampling_rate=Q, num_steps=T, delta=DELTA, group_size=k
        )
        for k in (1, 2, 8)
    ]
    assert values == sorted(values) and values[0] < values[-1]


@pytest.mark.parametrize("k", [0, -1, 2.0, True])
def test_a_group_size_that_is_not_a_positive_int_is_refused(k):
    with pytest.raises(ValueError, match="group_size"):
        core.compute_group_epsilon(
            noise_multiplier=SIGMA, sampling_rate=Q, num_steps=T, delta=DELTA, group_size=k
        )
