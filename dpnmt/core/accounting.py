"""Privacy accounting for DP-SGD on top of `dp_accounting` (PLD default, RDP).

Three bounds, named for the sampling they describe:

* `compute_epsilon`: Poisson sampling with rate q (each example joins each lot
  independently), T steps, add/remove-one adjacency. This is the guarantee of
  a run whose lots came from Poisson sampling.
* `compute_epsilon_shuffled`: fixed-size lots from a shuffle, each example in
  at most one lot per epoch. No amplification by sampling is assumed: the
  bound is the E-fold composition of the Gaussian mechanism (zero-out
  adjacency: an example replaced by a null example that contributes zero).
* `epsilon_if_poisson_not_a_guarantee`: the Poisson figure computed for a
  shuffled run, as often (wrongly) reported in the literature. Only for
  comparison with such papers; it is not a privacy guarantee.
"""

import contextlib
import enum
import functools
import logging
import math
import warnings

import dp_accounting
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from dpnmt.core import epsilon_memo, sigma_search, validation

# Search interval for σ in `calibrate_noise_multiplier`.
_MIN_NOISE_MULTIPLIER = 1e-2
MAX_NOISE_MULTIPLIER = 1e4
_SEARCHED = (_MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER)
# PLD discretisation interval: dp_accounting's default 1e-4, widened for large ε
# (1e-5 of the RDP estimate, rounded down to a power of ten), where 1e-4 takes
# minutes (σ ≈ 0.1). Discretisation over-estimates ε, never under-estimates it.
_PLD_MIN_DISCRETIZATION = 1e-4
_PLD_RELATIVE_DISCRETIZATION = 1e-5


class _DropRdpConvergenceWarnings(logging.Filter):
    """Drops dp_accounting's per-order RDP convergence warnings.

    At small σ it warns for every Rényi order whose series does not converge and
    leaves that order out (the bound stays valid); dozens of such lines per
    calibration would drown the run's log.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return "failed to converge" not in record.getMessage()


@contextlib.contextmanager
def _quiet_rdp_convergence():
    """Drops those warnings (absl's logger) while dp_accounting runs, and only then."""
    logger, drop = logging.getLogger("absl"), _DropRdpConvergenceWarnings()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


class Accountant(enum.StrEnum):
    """Which `dp_accounting` accountant computes ε."""

    PLD = "pld"  # Privacy loss distributions: tight (default).
    RDP = "rdp"  # Rényi DP: looser, the classic DP-SGD analysis.


def _parse_accountant(accountant: str) -> Accountant:
    try:
        return Accountant(accountant)
    except ValueError:
        raise ValueError(
            f"accountant must be one of {[a.value for a in Accountant]}, got {accountant!r}."
        ) from None


def dp_sgd_event(noise_multiplier: float, sampling_rate: float, num_steps: int):
    """The `DpEvent` of T Poisson-sampled Gaussian steps."""
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(
            sampling_rate, dp_accounting.GaussianDpEvent(noise_multiplier)
        ),
        num_steps,
    )


def event_epsilon(event, delta: float, accountant: str = "pld") -> float:
    """ε at `delta` of any dp_accounting `DpEvent` (RDP, or PLD after an RDP estimate).

    Args:
      event: a `dp_accounting.DpEvent` (e.g. `dp_sgd_event(...)`, or a composition).
      delta: the δ of the guarantee.
      accountant: "pld" (default) or "rdp".

    A repeat of (event, δ, accountant) in the process is looked up (`epsilon_memo`).
    """
    key = epsilon_memo.key(event, delta, accountant)
    epsilon = epsilon_memo.recall(key)
    if epsilon is None:
        with _quiet_rdp_convergence():
            epsilon = epsilon_memo.remember(key, _epsilon_of(event, delta, accountant))
    return epsilon


def _epsilon_of(event, delta: float, accountant: str) -> float:
    rdp = rdp_privacy_accountant.RdpAccountant()
    rdp.compose(event)
    rdp_epsilon = float(rdp.get_epsilon(delta))
    if _parse_accountant(accountant) is Accountant.RDP or not math.isfinite(rdp_epsilon):
        return rdp_epsilon
    interval = max(_PLD_MIN_DISCRETIZATION, _PLD_RELATIVE_DISCRETIZATION * rdp_epsilon)
    interval = 10.0 ** math.floor(math.log10(interval))
    pld = pld_privacy_accountant.PLDAccountant(value_discretization_interval=interval)
    pld.compose(event)
    return float(pld.get_epsilon(delta))


def compute_epsilon(
    noise_multiplier: float,
    sampling_rate: float,
    num_steps: int,
    delta: float,
    accountant: str = "pld",
    *,
    dataset_size: int | None = None,
) -> float:
    """ε of DP-SGD with Poisson sampling (add/remove-one adjacency).

    Args:
      noise_multiplier: σ > 0 (noise stddev / clipping norm).
      sampling_rate: q = L/N in (0, 1].
      num_steps: T >= 1, steps taken (empty lots included).
      delta: δ in (0, 1).
      accountant: "pld" (default, tight) or "rdp".
      dataset_size: N; if given, warns when δ >= 1/N.

    Returns:
      ε (float; inf if no finite ε exists at this δ).
    """
    noise_multiplier = validation.check_positive("noise_multiplier", noise_multiplier)
    sampling_rate = validation.check_sampling_rate(sampling_rate)
    num_steps = validation.check_num_steps("num_steps", num_steps)
    delta = validation.check_delta(delta)
    validation.warn_if_delta_too_large(delta, dataset_size)
    return event_epsilon(
        dp_sgd_event(noise_multiplier, sampling_rate, num_steps), delta, accountant
    )


def calibrate_noise_multiplier(
    target_epsilon: float,
    sampling_rate: float,
    num_steps: int,
    delta: float,
    accountant: str = "pld",
    *,
    dataset_size: int | None = None,
    relative_tolerance: float = 1e-3,
    hint: float | None = None,
) -> float:
    """Smallest σ (within `relative_tolerance`) with `compute_epsilon(σ, ...) <= target`.

    Args:
      target_epsilon: ε to spend, > 0 and finite.
      sampling_rate: q = L/N in (0, 1].
      num_steps: T >= 1 planned steps.
      delta: δ in (0, 1).
      accountant: "pld" (default) or "rdp".
      dataset_size: N; if given, warns when δ >= 1/N.
      relative_tolerance: in [1e-12, 1]; the returned σ is at most (1 + tol) times the optimum.
      hint: a σ to try first (e.g. an earlier calibration's answer to the same
        arguments), never trusted: returned only when two ε evaluations prove it
        the answer, see `sigma_search.hint_holds`; otherwise the search runs.

    Returns:
      σ whose ε (by the same accountant) is <= target_epsilon.

    Raises:
      ValueError: for invalid arguments, or a target no σ in
        [1e-2, 1e4] reaches.

    Warns:
      UserWarning: when the target is met already at σ = 1e-2, the floor of the
        search, which is then returned (a smaller σ might meet it too).
    """
    target_epsilon = validation.check_positive("target_epsilon", target_epsilon)
    sampling_rate = validation.check_sampling_rate(sampling_rate)
    num_steps = validation.check_num_steps("num_steps", num_steps)
    delta = validation.check_delta(delta)
    relative_tolerance = _check_tolerance(relative_tolerance)
    validation.warn_if_delta_too_large(delta, dataset_size)

    kind = _parse_accountant(accountant)

    @functools.cache  # The search revisits its bracket's ends.
    def epsilon_at(sigma: float, accountant: str = kind) -> float:
        return event_epsilon(dp_sgd_event(sigma, sampling_rate, num_steps), delta, accountant)

    if sigma_search.hint_holds(epsilon_at, target_epsilon, hint, relative_tolerance, *_SEARCHED):
        return float(hint)
    hi = MAX_NOISE_MULTIPLIER
    if epsilon_at(hi) > target_epsilon:
        raise ValueError(
            f"target_epsilon={target_epsilon:g} is unreachable: even noise_multiplier={hi:g} "
            f"gives ε={epsilon_at(hi):.4g} (sampling_rate={sampling_rate:g}, "
            f"num_steps={num_steps}, delta={delta:g}). Raise the target or delta, take "
            "fewer steps, or use a smaller sampling rate."
        )
    lo = _MIN_NOISE_MULTIPLIER
    if kind is Accountant.PLD:
        # Searching PLD over [1e-2, 1e4] is slow. RDP never reports less ε than
        # PLD, so the RDP-calibrated σ is an upper end; bracket below it.
        def rdp_at(sigma: float) -> float:
            return epsilon_at(sigma, Accountant.RDP)

        if rdp_at(lo) <= target_epsilon and epsilon_at(lo) <= target_epsilon:
            return _at_floor(target_epsilon, epsilon_at(lo))
        hi = sigma_search.search(rdp_at, target_epsilon, lo, hi, 1e-2)
        lo = hi
        while epsilon_at(lo) <= target_epsilon:
            if lo <= _MIN_NOISE_MULTIPLIER:
                return _at_floor(target_epsilon, epsilon_at(lo))
            lo = max(lo / 1.5, _MIN_NOISE_MULTIPLIER)
        while epsilon_at(hi) > target_epsilon:  # Defensive: restore ε(hi) <= target.
            hi *= 1.5
    elif epsilon_at(lo) <= target_epsilon:
        return _at_floor(target_epsilon, epsilon_at(lo))
    return sigma_search.search(epsilon_at, target_epsilon, lo, hi, relative_tolerance)


def _at_floor(target_epsilon: float, epsilon: float) -> float:
    """The search floor σ, with a warning: a smaller σ might also meet the target."""
    warnings.warn(
        f"target_epsilon={target_epsilon:g} is met already at the smallest noise multiplier "
        f"searched, {_MIN_NOISE_MULTIPLIER:g} (ε={epsilon:.4g}); returning it. The run "
        "spends less ε than targeted, and so little noise gives almost no privacy: "
        "check the target.",
        UserWarning,
        stacklevel=3,
    )
    return _MIN_NOISE_MULTIPLIER


def _check_tolerance(relative_tolerance) -> float:
    """`relative_tolerance` as a float in [1e-12, 1]: finer than float64 can tell never ends."""
    tol = validation.check_positive("relative_tolerance", relative_tolerance)
    if not 1e-12 <= tol <= 1.0:
        raise ValueError(f"relative_tolerance must be in [1e-12, 1], got {tol!r}.")
    return tol


def compute_epsilon_sequential(
    stages: tuple[tuple[float, float, int], ...], delta: float, accountant: str = "pld"
) -> float:
    """ε of several Poisson-sampled DP-SGD runs on one person's data, composed in one accountant.

    Not in `dpnmt.core.__all__` (the two-stage report's helper,
    `dpnmt.training.stage_composition`). Each stage is T Poisson-sampled
    Gaussian steps (`compute_epsilon`'s event) under add/remove adjacency; the
    neighbour removes the person's example from every stage's data. The joint
    event's ε is never above the sum of the stages' ε at deltas summing to
    `delta` up to discretisation (the accountants are tight for composition).

    Args:
      stages: (σ > 0, q in (0, 1], T >= 1) of each run.
      delta: δ in (0, 1) of the composition.
      accountant: "pld" (default) or "rdp".

    Returns:
      ε (float; inf if none is finite at `delta`).
    """
    events = []
    for sigma, rate, steps in stages:
        sigma = validation.check_positive("noise_multiplier", sigma)
        rate = validation.check_sampling_rate(rate)
        steps = validation.check_num_steps("num_steps", steps)
        events.append(dp_sgd_event(sigma, rate, steps))
    delta = validation.check_delta(delta)
    return event_epsilon(dp_accounting.ComposedDpEvent(events), delta, accountant)


def compute_epsilon_shuffled(
    noise_multiplier: float,
    num_epochs: int,
    delta: float,
    accountant: str = "pld",
    *,
    dataset_size: int | None = None,
) -> float:
    """A valid ε for shuffled fixed-size lots: no amplification by sampling.

    Each epoch visits every example in at most one lot, so under zero-out
    adjacency one epoch is a single Gaussian mechanism on that example
    (parallel composition over lots), and E epochs compose E of them. Count a
    started epoch as a whole one.

    Args:
      noise_multiplier: σ > 0.
      num_epochs: E >= 1, epochs started (each example seen at most E times).
      delta: δ in (0, 1).
      accountant: "pld" (default) or "rdp".
      dataset_size: N; if given, warns when δ >= 1/N.

    Returns:
      ε (float).
    """
    noise_multiplier = validation.check_positive("noise_multiplier", noise_multiplier)
    num_epochs = validation.check_num_steps("num_epochs", num_epochs)
    delta = validation.check_delta(delta)
    validation.warn_if_delta_too_large(delta, dataset_size)
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.GaussianDpEvent(noise_multiplier), num_epochs
    )
    return event_epsilon(event, delta, accountant)


def calibrate_noise_multiplier_shuffled(
    target_epsilon: float,
    num_epochs: int,
    delta: float,
    accountant: str = "pld",
    *,
    dataset_size: int | None = None,
    relative_tolerance: float = 1e-3,
    hint: float | None = None,
) -> float:
    """Smallest σ (within `relative_tolerance`) with `compute_epsilon_shuffled(σ, ...) <= target`.

    Args:
      target_epsilon: ε to spend, > 0 and finite.
      num_epochs: E >= 1 epochs (each example in at most one lot per epoch).
      delta: δ in (0, 1).
      accountant: "pld" (default) or "rdp".
      dataset_size: N; if given, warns when δ >= 1/N.
      relative_tolerance: in [1e-12, 1]; the returned σ is at most (1 + tol) times the optimum.
      hint: a σ to try first, never trusted (as `calibrate_noise_multiplier`'s).

    Returns:
      σ whose shuffled-lot ε (same accountant) is <= target_epsilon.

    Raises:
      ValueError: invalid arguments, or a target no σ in [1e-2, 1e4] reaches.
    """
    target_epsilon = validation.check_positive("target_epsilon", target_epsilon)
    num_epochs = validation.check_num_steps("num_epochs", num_epochs)
    delta = validation.check_delta(delta)
    relative_tolerance = _check_tolerance(relative_tolerance)
    validation.warn_if_delta_too_large(delta, dataset_size)
    _parse_accountant(accountant)

    @functools.cache
    def epsilon_at(sigma: float) -> float:
        return compute_epsilon_shuffled(sigma, num_epochs, delta, accountant)

    if sigma_search.hint_holds(epsilon_at, target_epsilon, hint, relative_tolerance, *_SEARCHED):
        return float(hint)
    lo, hi = _MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER
    if epsilon_at(hi) > target_epsilon:
        raise ValueError(
            f"target_epsilon={target_epsilon:g} is unreachable with shuffled lots: even "
            f"noise_multiplier={hi:g} gives ε={epsilon_at(hi):.4g} over {num_epochs} epochs "
            f"(delta={delta:g}). Raise the target or train fewer epochs."
        )
    # E Gaussian mechanisms of noise σ compose to one of noise σ/√E: bracket
    # around the analytic answer (PLD is slow to evaluate at tiny σ).
    guess = math.sqrt(num_epochs) * dp_accounting.get_sigma_gaussian(target_epsilon, delta)
    lo, hi = max(lo, guess / 1.05), min(hi, guess * 1.05)
    while lo > _MIN_NOISE_MULTIPLIER and epsilon_at(lo) <= target_epsilon:
        lo = max(lo / 1.5, _MIN_NOISE_MULTIPLIER)
    while hi < MAX_NOISE_MULTIPLIER and epsilon_at(hi) > target_epsilon:
        hi = min(hi * 1.5, MAX_NOISE_MULTIPLIER)
    if epsilon_at(lo) <= target_epsilon:
        if lo <= _MIN_NOISE_MULTIPLIER:
            return _at_floor(target_epsilon, epsilon_at(lo))
        return lo
    return sigma_search.search(epsilon_at, target_epsilon, lo, hi, relative_tolerance)


def epsilon_if_poisson_not_a_guarantee(
    noise_multiplier: float,
    sampling_rate: float,
    num_steps: int,
    delta: float,
    accountant: str = "pld",
) -> float:
    """The Poisson-sampling ε for a run that actually SHUFFLED: NOT a guarantee.

    Shuffled fixed-size lots do not enjoy Poisson amplification; many papers
    report this number anyway. Use it only to compare with them, labelled as
    such; the bound for a shuffled run is `compute_epsilon_shuffled`.
    """
    return compute_epsilon(noise_multiplier, sampling_rate, num_steps, delta, accountant)
