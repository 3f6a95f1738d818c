"""Regression tests from the privacy review of dpnmt.core: noise-seed entropy,
low-precision sensitivity, and pessimism of the widened PLD interval.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution
from dp_accounting.rdp import rdp_privacy_accountant

from dpnmt import core
from dpnmt.core import accounting


def test_noise_seeds_differing_above_bit_32_give_different_noise():
    """Regression (core/noise.py:58, core/aggregation.py:63): `fresh_seed()` promises 63
    CSPRNG bits, but `jax.random.key(seed)` (x64 off, the default) keeps only the
    low 32 bits, so two seeds that differ only in bits >= 32 draw identical noise
    and a release run's noise key has 32 bits of entropy, not 63."""
    low = 123456789
    high = low + (1 << 40)  # A different 63-bit seed with the same low 32 bits.
    per_example = {"w": jnp.ones((4, 8), jnp.float32)}
    noisy = []
    for seed in (low, high):
        tx = core.dp_aggregate(l2_clip=1.0, noise_multiplier=1.0, expected_lot_size=4.0, seed=seed)
        update, _ = tx.update(per_example, tx.init({"w": jnp.zeros(8)}))
        noisy.append(np.asarray(update["w"]))
    assert not np.array_equal(noisy[0], noisy[1]), "seeds differing above bit 32 collide"


def test_bfloat16_accumulator_keeps_sensitivity_at_most_clip():
    """Regression (core/accumulation.py:43-45 and core/clipping.py:79): the lot sum is
    kept in the parameter dtype. With bfloat16 parameters the accumulated sum is
    rounded to 8 mantissa bits after every micro-batch, and removing ONE example
    (norm <= C) can move the released sum by a whole bf16 ulp of the lot sum:
    here 16 C, not C. Accumulate (and return micro-batch sums) in float32."""
    l2_clip = 1.0
    params = {"w": jnp.zeros((1,), jnp.bfloat16)}
    ones = jnp.ones((16, 1), jnp.bfloat16)  # Every example's gradient has norm exactly C.

    def lot_sum(last_microbatch_real_rows: int) -> float:
        state = core.init_accumulator(params)
        for _ in range(128):  # 128 full micro-batches of 16: sum 2048 (exact in bf16).
            grad_sum, _ = core.clip_and_sum({"w": ones}, l2_clip)
            state = core.accumulate(state, grad_sum, 16)
        mask = jnp.arange(16) < last_microbatch_real_rows
        grad_sum, _ = core.clip_and_sum({"w": ones}, l2_clip, mask)
        state = core.accumulate(state, grad_sum, last_microbatch_real_rows)
        return float(state.grad_sum["w"][0])

    with_example, without_example = lot_sum(9), lot_sum(8)  # Neighbouring lots.
    assert abs(with_example - without_example) <= l2_clip * (1 + 1e-2), (
        f"one example moved the bf16 lot sum by {abs(with_example - without_example)} > C"
    )


# (sigma, q, steps, delta, interval of the optimistic lower bound). RDP ε > 100 and
# > 1000: `compute_epsilon` widens the PLD discretisation interval to 1e-3 and 1e-2.
_LARGE_EPSILON_CASES = [(0.3, 0.3, 30, 1e-8, 1e-4), (0.109, 0.1, 70, 1e-8, 1e-3)]


@pytest.mark.parametrize("sigma, q, steps, delta, finer", _LARGE_EPSILON_CASES)
def test_widened_pld_interval_is_sandwiched_by_lower_and_upper_bounds(
    sigma, q, steps, delta, finer
):
    """The widened-interval PLD ε is pessimistic yet tight: >= the optimistic PLD
    on a 10x finer grid (a lower bound on the true ε), <= RDP (an independent
    upper bound), and within 0.1% of the lower bound. (Pessimistic estimates on
    two grids are both upper bounds but not ordered: at σ = 0.109 the 1e-3 grid
    gives 1000.881 and the 1e-2 grid 1000.880, both above the 1000.839 floor.)"""
    rdp = rdp_privacy_accountant.RdpAccountant()
    rdp.compose(accounting.dp_sgd_event(sigma, q, steps))
    rdp_epsilon = rdp.get_epsilon(delta)
    assert rdp_epsilon >= 100  # The case really takes a widened interval.
    ours = core.compute_epsilon(sigma, q, steps, delta)

    optimistic = privacy_loss_distribution.from_gaussian_mechanism(
        sigma, sampling_prob=q, value_discretization_interval=finer, pessimistic_estimate=False
    )
    lower_bound = optimistic.self_compose(steps).get_epsilon_for_delta(delta)
    assert lower_bound <= ours <= rdp_epsilon
    assert ours <= 1.001 * lower_bound
