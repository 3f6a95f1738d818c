"""Group privacy of a per-example DP-SGD run: what it guarantees k examples as a whole.

`compute_group_epsilon` (Poisson lots) and `compute_group_epsilon_shuffled`
(shuffled lots): the ε a run whose unit is one example gives a group of k
examples (one person's sentences, one document) together, for reporting a
group's exposure.
"""

import math

import dp_accounting
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant

from dpnmt.core import validation
from dpnmt.core.accounting import (
    compute_epsilon,
    compute_epsilon_shuffled,
    dp_sgd_event,
    event_epsilon,
)


def _check_group_size(group_size: int) -> int:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size={group_size!r} must be an int >= 1 (examples in the group).")
    return group_size


# Binomial tail mass moved onto the largest shift (k) instead of listed one by one.
_GROUP_TAIL_MASS = 1e-12
# PLD grids of the group bound; pessimistic rounding adds at most the grid a step to ε.
_GROUP_PLD_INTERVAL = 1e-3
_GROUP_COARSE_INTERVAL = 0.5
_GROUP_COARSE_ENOUGH = 50.0
# Above this k, the looser bound (rate 1-(1-q)^k, noise σ/k, RDP).
_GROUP_MIXTURE_MAX = 256


def _binomial_shifts(k: int, q: float) -> tuple[list[float], list[float]]:
    """Shifts j = 0..J with P(j) of Binomial(k, q), the tail beyond J moved onto shift k."""
    if q >= 1.0:
        return [float(k)], [1.0]
    log_q, log_p = math.log(q), math.log1p(-q)
    shifts, probs, total = [], [], 0.0
    for j in range(k + 1):
        log_pmf = (
            math.lgamma(k + 1)
            - math.lgamma(j + 1)
            - math.lgamma(k - j + 1)
            + j * log_q
            + (k - j) * log_p
        )
        shifts.append(float(j))
        probs.append(math.exp(log_pmf))
        total += probs[-1]
        if j > k * q and 1.0 - total < _GROUP_TAIL_MASS:
            break
    if shifts[-1] < k:  # The rest, charged as the largest shift: only ever more ε.
        shifts.append(float(k))
        probs.append(max(0.0, 1.0 - total))
    return shifts, probs


def compute_group_epsilon(
    *,
    noise_multiplier: float,
    sampling_rate: float,
    num_steps: int,
    delta: float,
    group_size: int,
) -> float:
    """ε for a group of k examples, as a whole, in a Poisson-sampled per-example run.

    The run protects one example (add/remove-one adjacency); a person with k
    examples is protected as a group, less. Each lot holds j ~ Binomial(k, q)
    of the group's examples and their clipped gradients move the lot's sum by a
    vector of norm at most jC. Per step that is dominated by the scalar
    mixture of Gaussians sum_j P(j) N(jC, σ²C²) against N(0, σ²C²) (a vector
    mixture is dominated by the mixture of its norms, Choquette-Choo et al.
    2023, "Privacy amplification for matrix mechanisms", Cor. 4.7, and each
    Gaussian's divergence grows with its shift), and the group whose k
    gradients coincide realises it: the bound is tight for DP-SGD analysed by
    (q, σ, T, k). Composed over T steps by PLD with pessimistic rounding (a
    grid of 1e-3, at most that per step above the exact value; 0.5 when ε
    exceeds 50 there, where no finer figure would mean more). For k = 1 this
    is `compute_epsilon`; for k > 256 a looser valid bound, each lot that
    holds any of the group charged as holding all k (a Poisson-sampled
    Gaussian of rate 1 - (1 - q)^k and noise multiplier σ/k, RDP).

    Args:
      noise_multiplier: σ > 0 of the run.
      sampling_rate: q = L/N of the run, in (0, 1].
      num_steps: T >= 1 steps taken.
      delta: δ in (0, 1), for the group.
      group_size: k >= 1, the group's examples in the training data.

    Returns:
      ε for the group at δ (float; inf if no finite ε exists).
    """
    group_size = _check_group_size(group_size)
    noise_multiplier = validation.check_positive("noise_multiplier", noise_multiplier)
    sampling_rate = validation.check_sampling_rate(sampling_rate)
    num_steps = validation.check_num_steps("num_steps", num_steps)
    delta = validation.check_delta(delta)
    if group_size == 1:
        return compute_epsilon(noise_multiplier, sampling_rate, num_steps, delta)
    if group_size > _GROUP_MIXTURE_MAX:
        # The mixture's PLD spans losses up to (kσ)²/2: too slow here. A looser
        # valid bound: every lot holding any of the group charged as holding all k.
        rate = -math.expm1(group_size * math.log1p(-sampling_rate)) if sampling_rate < 1 else 1.0
        return event_epsilon(
            dp_sgd_event(noise_multiplier / group_size, rate, num_steps), delta, "rdp"
        )
    shifts, probs = _binomial_shifts(group_size, sampling_rate)
    event = dp_accounting.SelfComposedDpEvent(
        dp_event.MixtureOfGaussiansDpEvent(noise_multiplier, shifts, probs), num_steps
    )

    def epsilon_on(interval: float) -> float:
        pld = pld_privacy_accountant.PLDAccountant(value_discretization_interval=interval)
        pld.compose(event)
        return float(pld.get_epsilon(delta))

    # Any grid gives a valid (pessimistic) bound. A coarse one first: past
    # _GROUP_COARSE_ENOUGH the group has no meaningful protection and a finer
    # grid (slow: the PLD's support grows as ε / grid) would change nothing.
    coarse = epsilon_on(_GROUP_COARSE_INTERVAL)
    if coarse > _GROUP_COARSE_ENOUGH:
        return coarse
    return min(coarse, epsilon_on(_GROUP_PLD_INTERVAL))


def compute_group_epsilon_shuffled(
    *,
    noise_multiplier: float,
    num_epochs: int,
    delta: float,
    group_size: int,
    accountant: str = "pld",
) -> float:
    """ε for a group of k examples, as a whole, in a run with shuffled lots.

    Zero-out adjacency of the whole group, worst case over the shuffle (no
    amplification, as for one example). Given the permutation, the group's
    examples sit m_j of them in lot j (sum m_j = k): lot j is a Gaussian
    mechanism of sensitivity m_j C fixed in advance, and an epoch's lots
    compose to one Gaussian of sensitivity sqrt(sum m_j^2) C <= kC, reached
    when all k share a lot. E epochs: E Gaussian mechanisms of noise
    multiplier σ / k.

    Args:
      noise_multiplier: σ > 0 of the run.
      num_epochs: E >= 1 epochs started.
      delta: δ in (0, 1), for the group.
      group_size: k >= 1, the group's examples in the training data.
      accountant: "pld" (default) or "rdp".

    Returns:
      ε for the group at δ.
    """
    group_size = _check_group_size(group_size)
    noise_multiplier = validation.check_positive("noise_multiplier", noise_multiplier)
    return compute_epsilon_shuffled(noise_multiplier / group_size, num_epochs, delta, accountant)
