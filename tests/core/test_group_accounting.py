"""Group privacy of a per-example run: exact at k = 1, tight at k > 1, valid for large k."""

import math

import dp_accounting
import pytest
from dp_accounting.pld import privacy_loss_distribution

from dpnmt import core

SIGMA, Q, T, DELTA = 1.1, 0.02, 50, 1e-5


def _group(k, **overrides):
    kwargs = dict(noise_multiplier=SIGMA, sampling_rate=Q, num_steps=T, delta=DELTA, group_size=k)
    return core.compute_group_epsilon(**{**kwargs, **overrides})


def _aligned_group_optimistic(k: int, interval: float = 1e-3) -> float:
    """A lower bound on ε of one realisable group: k examples with one clipped gradient.

    A lot holds j ~ Binomial(k, q) of them and its sum moves by jC: a mixture of
    Gaussians over T steps, PLD with optimistic rounding (never above the truth).
    """
    probs = [math.comb(k, j) * Q**j * (1 - Q) ** (k - j) for j in range(k + 1)]
    pld = privacy_loss_distribution.from_mixture_gaussian_mechanism(
        standard_deviation=SIGMA,
        sensitivities=[float(j) for j in range(k + 1)],
        sampling_probs=probs,
        pessimistic_estimate=False,
        value_discretization_interval=interval,
        use_connect_dots=False,
    )
    return float(pld.self_compose(T).get_epsilon_for_delta(DELTA))


def test_one_example_is_the_run_s_own_guarantee():
    assert _group(1) == core.compute_epsilon(SIGMA, Q, T, DELTA)
    assert core.compute_group_epsilon_shuffled(
        noise_multiplier=SIGMA, num_epochs=3, delta=DELTA, group_size=1
    ) == core.compute_epsilon_shuffled(SIGMA, 3, DELTA)


@pytest.mark.parametrize("k", [2, 3])
def test_the_bound_is_valid_and_tight_for_a_group_whose_gradients_coincide(k):
    bound = _group(k)
    realised = _aligned_group_optimistic(k)
    # Each lot holding any of the group charged as holding all k: valid, looser.
    rate = 1 - (1 - Q) ** k
    loose = core.compute_epsilon(SIGMA / k, rate, T, DELTA)
    assert core.compute_epsilon(SIGMA, Q, T, DELTA) * 1.5 < realised <= bound
    # Pessimistic vs optimistic rounding on 1e-3 grids: at most a grid step each, a step.
    assert bound <= realised + T * 2e-3, (bound, realised)
    assert bound < loose, (bound, loose)


def test_large_groups_take_the_looser_bound_without_overflow():
    big = _group(1100)
    assert math.isfinite(big) and big > _group(200)


def test_the_bound_grows_with_the_group():
    values = [_group(k) for k in (1, 2, 8)]
    assert values == sorted(values) and values[0] < values[-1]


def test_the_shuffled_bound_is_e_gaussians_of_sensitivity_k():
    # E Gaussian mechanisms of noise σ/k compose to one of noise σ/(k√E) (μ-GDP).
    k, epochs = 3, 2
    exact = dp_accounting.get_epsilon_gaussian(SIGMA / (k * math.sqrt(epochs)), DELTA)
    assert core.compute_group_epsilon_shuffled(
        noise_multiplier=SIGMA, num_epochs=epochs, delta=DELTA, group_size=k
    ) == pytest.approx(exact, rel=2e-3)


@pytest.mark.parametrize("k", [0, -1, 2.0, True])
def test_a_group_size_that_is_not_a_positive_int_is_refused(k):
    with pytest.raises(ValueError, match="group_size"):
        _group(k)
