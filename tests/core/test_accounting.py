"""Privacy accounting: agreement with dp_accounting and Opacus, calibration, validation."""

import math
import subprocess
import sys

import dp_accounting
import numpy as np
import pytest
from absl.testing import absltest, parameterized
from dp_accounting.pld import pld_privacy_accountant, privacy_loss_distribution
from dp_accounting.rdp import rdp_privacy_accountant
from opacus.accountants.analysis import rdp as opacus_rdp

from dpnmt import core
from dpnmt.core import accounting, epsilon_memo

# (noise_multiplier, sampling_rate, num_steps, delta): a grid spanning the
# regimes users run, including the paper's WMT-16 Poisson setting.
GRID = (
    (0.8, 0.01, 1000, 1e-5),
    (1.1, 0.004, 10_000, 1e-6),
    (2.0, 0.1, 100, 1e-8),
    (5.0, 0.5, 50, 1e-8),
    (13.18, 524_288 / 4_551_054, 61, 1e-8),
    (0.6, 0.02, 300, 1e-5),
)


def _dp_accounting_epsilon(accountant, sigma, q, steps, delta):
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps
    )
    accountant.compose(event)
    return accountant.get_epsilon(delta)


class ComputeEpsilonTest(parameterized.TestCase):
    @parameterized.parameters(*GRID)
    def test_pld_equals_direct_dp_accounting(self, sigma, q, steps, delta):
        direct = _dp_accounting_epsilon(
            pld_privacy_accountant.PLDAccountant(), sigma, q, steps, delta
        )
        # Same accountant and (for ε < 10) the same 1e-4 discretisation: equal.
        self.assertAlmostEqual(core.compute_epsilon(sigma, q, steps, delta), direct, places=9)

    @parameterized.parameters(*GRID)
    def test_rdp_equals_direct_dp_accounting(self, sigma, q, steps, delta):
        direct = _dp_accounting_epsilon(
            rdp_privacy_accountant.RdpAccountant(), sigma, q, steps, delta
        )
        ours = core.compute_epsilon(sigma, q, steps, delta, accountant="rdp")
        self.assertAlmostEqual(ours, direct, places=9)

    @parameterized.parameters(*GRID)
    def test_rdp_agrees_with_opacus(self, sigma, q, steps, delta):
        """Opacus is an independent RDP implementation; only the order grids differ.

        Both minimise over a finite grid of Rényi orders, so they agree up to the
        grid's resolution: 1% relative (observed <= 0.2%).
        """
        orders = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + [128, 256, 512]
        rdp = opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=orders)
        theirs, _ = opacus_rdp.get_privacy_spent(orders=orders, rdp=rdp, delta=delta)
        ours = core.compute_epsilon(sigma, q, steps, delta, accountant="rdp")
        self.assertLess(abs(ours - theirs) / theirs, 0.01)

    @parameterized.parameters(*GRID)
    def test_pld_is_tighter_than_rdp(self, sigma, q, steps, delta):
        pld = core.compute_epsilon(sigma, q, steps, delta)
        rdp = core.compute_epsilon(sigma, q, steps, delta, accountant="rdp")
        self.assertLessEqual(pld, rdp)

    def test_epsilon_decreases_with_noise_and_grows_with_steps(self):
        eps = [core.compute_epsilon(s, 0.01, 500, 1e-6) for s in (0.7, 1.0, 2.0, 4.0)]
        self.assertEqual(eps, sorted(eps, reverse=True))
        eps = [core.compute_epsilon(1.0, 0.01, t, 1e-6) for t in (10, 100, 1000)]
        self.assertEqual(eps, sorted(eps))

    def test_large_epsilon_is_fast_and_close_to_rdp(self):
        # σ ≈ 0.1 is where PLD at the default discretisation takes minutes.
        pld = core.compute_epsilon(0.109, 0.1, 70, 1e-8)
        rdp = core.compute_epsilon(0.109, 0.1, 70, 1e-8, accountant="rdp")
        self.assertLessEqual(pld, rdp)
        self.assertGreater(pld, 900)


class CalibrateTest(parameterized.TestCase):
    @parameterized.parameters(
        (1.0, 0.01, 500, 1e-5, "pld"),
        (5.0, 0.05, 200, 1e-8, "pld"),
        (1000.0, 0.1, 70, 1e-8, "pld"),
        (1.0, 0.01, 500, 1e-5, "rdp"),
        (8.0, 0.2, 100, 1e-8, "rdp"),
    )
    def test_round_trip_is_within_one_percent_below_target(self, target, q, steps, delta, kind):
        sigma = core.calibrate_noise_multiplier(target, q, steps, delta, accountant=kind)
        spent = core.compute_epsilon(sigma, q, steps, delta, accountant=kind)
        self.assertLessEqual(spent, target)
        self.assertGreaterEqual(spent, 0.99 * target)
        # Smallest: 1% less noise overspends.
        self.assertGreater(
            core.compute_epsilon(sigma / 1.01, q, steps, delta, accountant=kind), target
        )

    def test_unreachable_target_is_a_clear_error(self):
        with self.assertRaisesRegex(ValueError, r"target_epsilon=0.01 is unreachable"):
            core.calibrate_noise_multiplier(0.01, 1.0, 100_000, 1e-8)

    @parameterized.parameters(0.0, -1.0, float("inf"), float("nan"))
    def test_invalid_target(self, target):
        with self.assertRaisesRegex(ValueError, "target_epsilon"):
            core.calibrate_noise_multiplier(target, 0.01, 100, 1e-6)


class ShuffledTest(parameterized.TestCase):
    @parameterized.parameters((1.0, 1, 1e-5), (2.0, 3, 1e-8), (13.18, 7, 1e-8))
    def test_equals_composed_gaussian_mechanism(self, sigma, epochs, delta):
        # E Gaussian mechanisms of noise σ compose to one of noise σ/√E.
        analytic = dp_accounting.get_epsilon_gaussian(sigma / math.sqrt(epochs), delta)
        ours = core.compute_epsilon_shuffled(sigma, epochs, delta)
        self.assertAlmostEqual(ours, analytic, delta=2e-3 * analytic)

    def test_no_amplification_so_larger_than_poisson_figure(self):
        sigma, q, epochs, delta = 13.18, 524_288 / 4_551_054, 7, 1e-8
        shuffled = core.compute_epsilon_shuffled(sigma, epochs, delta)
        heuristic = core.epsilon_if_poisson_not_a_guarantee(sigma, q, round(epochs / q), delta)
        self.assertGreater(shuffled, 2 * heuristic)

    @parameterized.parameters((1.0, 3, "pld"), (8.0, 10, "pld"), (1.0, 3, "rdp"))
    def test_calibrate_round_trip(self, target, epochs, kind):
        sigma = core.calibrate_noise_multiplier_shuffled(target, epochs, 1e-8, accountant=kind)
        spent = core.compute_epsilon_shuffled(sigma, epochs, 1e-8, accountant=kind)
        self.assertLessEqual(spent, target)
        self.assertGreaterEqual(spent, 0.99 * target)

    def test_num_epochs_must_be_whole(self):
        with self.assertRaisesRegex(ValueError, "num_epochs"):
            core.compute_epsilon_shuffled(1.0, 2.5, 1e-5)


class ValidationTest(parameterized.TestCase):
    @parameterized.named_parameters(
        ("zero_sigma", dict(noise_multiplier=0.0), "noise_multiplier"),
        ("negative_sigma", dict(noise_multiplier=-1.0), "noise_multiplier"),
        ("delta_zero", dict(delta=0.0), "delta"),
        ("delta_one", dict(delta=1.0), "delta"),
        ("q_zero", dict(sampling_rate=0.0), "sampling_rate"),
        ("q_above_one", dict(sampling_rate=1.5), "sampling_rate"),
        ("steps_zero", dict(num_steps=0), "num_steps"),
        ("steps_float", dict(num_steps=10.5), "num_steps"),
        ("accountant", dict(accountant="moments"), "accountant"),
    )
    def test_invalid_value_is_named(self, override, name):
        args = dict(noise_multiplier=1.0, sampling_rate=0.01, num_steps=10, delta=1e-6)
        args.update(override)
        with self.assertRaisesRegex(ValueError, name):
            core.compute_epsilon(**args)

    def test_delta_at_least_one_over_n_warns(self):
        with self.assertWarnsRegex(UserWarning, r"delta=0.001 is >= 1/N"):
            core.compute_epsilon(1.0, 0.01, 10, 1e-3, dataset_size=10_000)
        with self.assertNoLogs(level="WARNING"):
            core.compute_epsilon(1.0, 0.01, 10, 1e-8, dataset_size=10_000)


class ImportTest(absltest.TestCase):
    def test_core_imports_no_torch_transformers_or_datasets(self):
        code = (
            "import sys, dpnmt.core; "
            "heavy = ('torch', 'transformers', 'datasets', 'opacus'); "
            "bad = [m for m in heavy if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)"
        )
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)


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


def test_a_repeated_event_is_looked_up_and_an_inexact_one_computed_again(monkeypatch):
    """The process's memo: the same (event, δ, accountant) computes once; an event
    holding a field it cannot key exactly (a NumPy scalar) is never remembered."""
    monkeypatch.setattr(epsilon_memo, "_EPSILONS", {})
    computed = []
    original = accounting._epsilon_of

    def counted(event, delta, accountant):
        computed.append(event)
        return original(event, delta, accountant)

    monkeypatch.setattr(accounting, "_epsilon_of", counted)
    first = core.compute_epsilon(1.3, 0.05, 20, 1e-6)
    assert core.compute_epsilon(1.3, 0.05, 20, 1e-6) == first and len(computed) == 1
    core.compute_epsilon(1.3, 0.05, 21, 1e-6)  # Another T, another ε.
    core.compute_epsilon(1.3, 0.05, 20, 1e-6, "rdp")  # Another accountant.
    core.compute_epsilon(1.3, 0.05, 20, 2e-6)  # Another δ.
    assert len(computed) == 4
    inexact = accounting.dp_sgd_event(np.float64(1.3), 0.05, 20)
    assert accounting.event_epsilon(inexact, 1e-6) == first
    assert accounting.event_epsilon(inexact, 1e-6) == first and len(computed) == 6
    # Keys that must not meet: signed zeros, a NaN (never kept), a NumPy δ, a plain
    # subclass (its own attributes would be left out).
    event = accounting.dp_sgd_event(1.3, 0.05, 20)
    assert epsilon_memo.key(accounting.dp_sgd_event(0.0, 0.05, 20), 1e-6, "pld") != (
        epsilon_memo.key(accounting.dp_sgd_event(-0.0, 0.05, 20), 1e-6, "pld")
    )
    assert epsilon_memo.key(accounting.dp_sgd_event(math.nan, 0.05, 20), 1e-6, "pld") is None
    assert epsilon_memo.key(event, np.float32(1e-6), "pld") is None
    assert epsilon_memo.key(event, 1e-6, "pld") is not None

    class Subclass(dp_accounting.GaussianDpEvent):
        pass

    assert epsilon_memo.key(Subclass(1.3), 1e-6, "pld") is None


if __name__ == "__main__":
    absltest.main()
