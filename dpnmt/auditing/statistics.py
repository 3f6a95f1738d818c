"""The membership audit's statistics: group claims, the one-run ε lower bound, testability.

The bound is Steinke, Nasr & Jagielski 2023 (jax_privacy `CanaryScoreAuditor`);
`reachable_lower_bound` is what M canaries all guessed right can give, so a
claim at or above it is UNTESTABLE (`audit_plan` says so before training).
"""

import dataclasses
import functools
import math

import numpy as np

from dpnmt.auditing.options import AuditOptions
from dpnmt.config import RunConfig
from dpnmt.data import dp_sentencepiece
from dpnmt.errors import ConfigError


def group_claim(epsilon: float, delta: float, group_size: int) -> tuple[float, float]:
    """(ε, δ) an (epsilon, delta)-DP mechanism guarantees for a group of `group_size`.

    Vadhan 2017, Lemma 2.2: (kε, k e^{(k-1)ε} δ). For k = 1 the claim itself.
    """
    if group_size == 1 or not math.isfinite(epsilon):
        return epsilon, delta
    return group_size * epsilon, group_size * math.exp((group_size - 1) * epsilon) * delta


# Outcomes of the membership audit (`audit_outcome`).
NO_CLAIM = "no claim"  # Non-private run (or a vocabulary outside the guarantee).
VACUOUS = "vacuous"  # The group claim's δ is ≥ 1: no guarantee for r copies.
UNTESTABLE = "UNTESTABLE"  # No scores could give a bound above the claim at this M.
CONSISTENT = "consistent"  # Testable, and the lower bound does not exceed the claim.
INCONSISTENT = "INCONSISTENT"  # The lower bound exceeds the claim: look for a bug.

# The search for a testing M stops here: more canaries than that is not an audit
# anyone runs (and each bound evaluation costs O(M)).
MAX_CANARIES_SEARCHED = 10_000_000


def reachable_lower_bound(
    num_inserted: int, num_held_out: int, *, confidence: float, delta: float
) -> float:
    """The largest ε lower bound the one-run audit can report with these canaries.

    jax_privacy's `epsilon_one_run` on the best case for the attack: every
    inserted canary scores above every held-out one (all guessed right), with
    the scores tied within each group (the fewest thresholds, so the smallest
    Bonferroni correction). No scores give a larger bound; when it is at most
    the claim, the audit cannot contradict the claim whatever the code does.

    Args:
      num_inserted: canaries inserted into training (about M / 2).
      num_held_out: canaries held out.
      confidence: of the bound, in (0.5, 1).
      delta: the δ of the claim tested, in (0, 1].

    Returns:
      The bound (0.0 when either group is empty: nothing to compare).
    """
    if num_inserted < 1 or num_held_out < 1:
        return 0.0
    from jax_privacy import auditing  # Deferred: only the audit needs it.

    auditor = auditing.CanaryScoreAuditor(np.ones(num_inserted), np.zeros(num_held_out))
    return float(auditor.epsilon_one_run(significance=1 - confidence, delta=delta))


@functools.lru_cache(maxsize=256)
def _half_inserted_bound(num_canaries: int, confidence: float, delta: float) -> float:
    """`reachable_lower_bound` for M canaries, half inserted (the fair coins' mean).

    Cached: the plan before training and the verdict after it search the same Ms.
    """
    inserted = num_canaries // 2
    return reachable_lower_bound(
        inserted, num_canaries - inserted, confidence=confidence, delta=delta
    )


def _round_up_two_digits(number: int) -> int:
    """`number` rounded up to two significant digits (1,075,200 -> 1,100,000)."""
    unit = 10 ** max(0, len(str(number)) - 2)
    return -(-number // unit) * unit


@dataclasses.dataclass(frozen=True)
class CanarySearch:
    """How many canaries would make a claim testable (`canaries_to_test`).

    Attributes:
      num_canaries: an M (within 10% of the smallest, two significant digits)
        whose reachable bound, half of them inserted, exceeds the claim; None
        if no M up to `searched_up_to` does.
      bound: the reachable bound at `num_canaries`, else the largest seen.
      bound_at: the M of `bound`.
      searched_up_to: the largest M tried.
      peaked: True if the bound stopped growing before the cap: its δ term
        (about 2 M δ) grows with M, so more canaries cannot help.
    """

    num_canaries: int | None
    bound: float
    bound_at: int
    searched_up_to: int
    peaked: bool

    def describe(self, epsilon: float) -> str:
        """One phrase: the M that tests ε, or why none does."""
        if self.num_canaries is not None:
            return (
                f"about M = {self.num_canaries:,} canaries (half inserted) would test "
                f"ε = {epsilon:.4g} (they can show up to {self.bound:.3g})"
            )
        if self.peaked:
            return (
                f"no number of canaries can test ε = {epsilon:.4g} at this δ: the reachable "
                f"bound peaks at about {self.bound:.3g} (M = {self.bound_at:,}) and then falls"
            )
        return (
            f"more than {self.searched_up_to:,} canaries would be needed to test "
            f"ε = {epsilon:.4g} (they can show up to {self.bound:.3g})"
        )


def canaries_to_test(
    epsilon: float,
    *,
    confidence: float,
    delta: float,
    start: int = 100,
    max_canaries: int = MAX_CANARIES_SEARCHED,
) -> CanarySearch:
    """Searches the smallest M whose reachable one-run bound exceeds `epsilon`.

    Doubles M from `start` until the bound (half inserted) exceeds `epsilon`,
    stops growing, or M reaches `max_canaries`; then bisects to within 2% and
    rounds up to two significant digits. Each step costs O(M) (jax_privacy's
    δ term): about 20 s for the tiny config's claim on a busy CPU, and the
    results are cached.

    Args:
      epsilon: the claim to test (finite, > 0).
      confidence: of the bound, in (0.5, 1).
      delta: the claim's δ.
      start: first M tried (at least 2).
      max_canaries: the cap on M.

    Returns:
      A `CanarySearch`.
    """

    def bound(m: int) -> float:
        return _half_inserted_bound(m, confidence, delta)

    low, low_bound = start, bound(start)
    if low_bound > epsilon:
        return CanarySearch(low, low_bound, low, low, False)
    while True:
        high = min(2 * low, max_canaries)
        high_bound = bound(high)
        if high_bound > epsilon:
            break
        if high_bound <= low_bound:
            return CanarySearch(None, low_bound, low, high, True)
        if high == max_canaries:
            return CanarySearch(None, high_bound, high, high, False)
        low, low_bound = high, high_bound
    while high - low > max(1, high // 50):
        middle = (low + high) // 2
        if bound(middle) > epsilon:
            high = middle
        else:
            low = middle
    rounded = _round_up_two_digits(high)
    if bound(rounded) > epsilon:
        high = rounded
    return CanarySearch(high, bound(high), high, high, False)


def audit_outcome(
    lower_bound: float, reachable_bound: float, tested_epsilon: float, tested_delta: float
) -> str:
    """Which of `NO_CLAIM`, `VACUOUS`, `INCONSISTENT`, `UNTESTABLE`, `CONSISTENT` holds.

    Args:
      lower_bound: the measured one-run ε lower bound.
      reachable_bound: the largest bound these canaries could give
        (`reachable_lower_bound`).
      tested_epsilon: the claim tested (inf: none).
      tested_delta: its δ.

    Returns:
      The outcome: INCONSISTENT when the bound exceeds the claim; else
      UNTESTABLE when no scores could have exceeded it; else consistent.
    """
    if not math.isfinite(tested_epsilon):
        return NO_CLAIM
    if not tested_delta < 1:
        return VACUOUS
    if lower_bound > tested_epsilon:
        return INCONSISTENT
    if reachable_bound <= tested_epsilon:
        return UNTESTABLE
    return CONSISTENT


def untestable_message(
    num_inserted: int,
    num_held_out: int,
    reachable_bound: float,
    tested_epsilon: float,
    tested_delta: float,
    repeats: int,
    confidence: float,
) -> str:
    """Why the claim cannot be contradicted, and the M (and r) that would test it."""
    search = canaries_to_test(tested_epsilon, confidence=confidence, delta=tested_delta)
    message = (
        f"UNTESTABLE: M = {num_inserted + num_held_out} canaries ({num_inserted} inserted"
        f"{f' {repeats} times' if repeats > 1 else ''}) can show at most ε ≥ "
        f"{reachable_bound:.3g} at {confidence:.0%}, even if every one is guessed right, "
        f"so the claim ε = {tested_epsilon:.4g} cannot be contradicted whatever the code "
        f"does; {search.describe(tested_epsilon)}"
    )
    if repeats > 1:
        message += (
            f". With r = {repeats} the claim tested is the group's ({repeats}ε); r = 1 tests "
            "the per-example ε, the smallest claim"
        )
    return message


def verdict_message(
    outcome: str,
    *,
    lower_bound: float,
    reachable_bound: float,
    tested_epsilon: float,
    tested_delta: float,
    num_inserted: int,
    num_held_out: int,
    repeats: int,
    confidence: float,
) -> str:
    """The sentence `audit.json` and the log give for an `audit_outcome`."""
    if outcome == NO_CLAIM:
        return "no finite ε claimed (non-private run): nothing to contradict"
    if outcome == VACUOUS:
        return f"the claim gives no guarantee for groups of r={repeats} (δ ≥ 1)"
    if outcome == INCONSISTENT:
        return (
            f"INCONSISTENT: the lower bound {lower_bound:.3g} > the claimed ε "
            f"{tested_epsilon:.4g}; a correct run shows this with probability ≤ "
            f"{1 - confidence:.2g}: look for a bug"
        )
    if outcome == UNTESTABLE:
        return untestable_message(
            num_inserted,
            num_held_out,
            reachable_bound,
            tested_epsilon,
            tested_delta,
            repeats,
            confidence,
        )
    return (
        f"consistent: the lower bound {lower_bound:.3g} ≤ the claimed ε {tested_epsilon:.4g} "
        f"(these canaries could have shown up to {reachable_bound:.3g})"
    )


def membership_audit(
    in_scores: np.ndarray,
    out_scores: np.ndarray,
    *,
    claimed_epsilon: float,
    claimed_delta: float,
    repeats: int,
    confidence: float,
) -> dict:
    """AUC, the one-run ε lower bound, the largest reachable one, and the outcome.

    Args:
      in_scores: [n_in] membership scores of inserted canaries (higher = more
        likely a member).
      out_scores: [n_out] scores of held-out canaries.
      claimed_epsilon: the run's claimed ε for one example (inf if non-private).
      claimed_delta: its δ, in (0, 1).
      repeats: r copies per inserted canary; the claim tested is the group claim.
      confidence: of the lower bound (0.95: it exceeds the true ε with
        probability at most 5%).

    Returns:
      dict with auc, epsilon_lower_bound, reachable_epsilon_lower_bound (the
      largest bound any scores of these canaries could give), the tested
      claim, `outcome` (see `audit_outcome`), `contradicted` (the bound exceeds
      the claim, which a correct DP run does with probability at most
      1 - confidence) and the verdict sentence.
    """
    from jax_privacy import auditing  # Deferred: only the audit needs it.

    auditor = auditing.CanaryScoreAuditor(np.asarray(in_scores), np.asarray(out_scores))
    epsilon, delta = group_claim(claimed_epsilon, claimed_delta, repeats)
    vacuous = not delta < 1
    bound_delta = claimed_delta if vacuous else delta
    lower_bound = float(auditor.epsilon_one_run(significance=1 - confidence, delta=bound_delta))
    num_inserted, num_held_out = int(np.size(in_scores)), int(np.size(out_scores))
    reachable = reachable_lower_bound(
        num_inserted, num_held_out, confidence=confidence, delta=bound_delta
    )
    outcome = audit_outcome(lower_bound, reachable, epsilon, delta)
    verdict = verdict_message(
        outcome,
        lower_bound=lower_bound,
        reachable_bound=reachable,
        tested_epsilon=epsilon,
        tested_delta=bound_delta,
        num_inserted=num_inserted,
        num_held_out=num_held_out,
        repeats=repeats,
        confidence=confidence,
    )
    return {
        "auc": float(auditor.attack_auroc()),
        "epsilon_lower_bound": lower_bound,
        "reachable_epsilon_lower_bound": reachable,
        "confidence": confidence,
        "bound_delta": bound_delta,
        "method": "one-run audit (Steinke, Nasr & Jagielski 2023), jax_privacy "
        "CanaryScoreAuditor.epsilon_one_run, Bonferroni over thresholds; reachable: the "
        "same on perfectly separated scores",
        "num_inserted": num_inserted,
        "num_held_out": num_held_out,
        "claimed_epsilon": claimed_epsilon,
        "claimed_delta": claimed_delta,
        "tested_epsilon": epsilon,
        "tested_delta": delta,
        "outcome": outcome,
        "contradicted": outcome == INCONSISTENT,
        "verdict": verdict,
    }


def forecast_claim(run: RunConfig) -> tuple[float | None, float]:
    """The run's total (ε, δ) as its config promises it, before anything is trained.

    DP-SGD's ε is the config's target (σ is calibrated to it; the plan's ε is
    at most that); a DP-SentencePiece vocabulary adds its ε and δ as the
    training report composes them (`PrivacyReport`). The final verdict uses the trained run's
    reported claim, not this.

    Args:
      run: the run's config (its `dp` and `tokenizer` sections).

    Returns:
      (ε, δ); ε is inf for a non-private run or a vocabulary learnt without DP,
      None when the config gives σ instead of a target ε (ε then depends on N).
    """
    dp, tokenizer = run.dp, run.tokenizer
    if not dp.enabled:
        return math.inf, dp.delta
    epsilon = None if dp.target_epsilon is None else float(dp.target_epsilon)
    delta = float(dp.delta)
    try:
        kind = run.tokenizer_kind  # "auto" from scratch is DP-SentencePiece: its ε counts.
    except ConfigError:
        kind = tokenizer.kind  # Training's checks refuse it, naming every other problem too.
    if kind == "sentencepiece_private":
        return math.inf, delta
    if kind == "dp_sentencepiece":
        params = dp_sentencepiece.DPVocabularyParams(
            noise_stddev=tokenizer.dp_noise_stddev,
            delta=tokenizer.dp_delta,
            max_words=tokenizer.dp_max_words,
        )
        if epsilon is not None:
            epsilon += max(params.epsilon, params.epsilon_analytic)
        delta += params.delta
    return epsilon, delta


def audit_plan(
    num_inserted: int,
    num_held_out: int,
    claim: tuple[float | None, float],
    options: AuditOptions,
) -> tuple[str, str]:
    """Before training: can these canaries contradict the claim at all?

    Args:
      num_inserted: canaries drawn for insertion.
      num_held_out: canaries held out.
      claim: `forecast_claim`'s (ε, δ) for one example; ε None if unknown.
      options: the audit's options (repeats, confidence).

    Returns:
      (expected outcome, or "unknown" when the claim is, and a log line).
    """
    confidence, repeats = options.confidence, options.repeats
    if claim[0] is None:
        reachable = reachable_lower_bound(
            num_inserted, num_held_out, confidence=confidence, delta=claim[1]
        )
        return "unknown", (
            f"Audit plan: {num_inserted + num_held_out} canaries ({num_inserted} inserted) can "
            f"show at most ε ≥ {reachable:.3g} at {confidence:.0%} (δ = {claim[1]:.3g}); the "
            "claim is known once the privacy plan is built (σ given, not a target ε); a "
            f"claim{f' for r = {repeats} copies' if repeats > 1 else ''} at or above that "
            "bound will be UNTESTABLE."
        )
    epsilon, delta = group_claim(*claim, repeats)
    vacuous = not delta < 1
    bound_delta = claim[1] if vacuous else delta
    reachable = reachable_lower_bound(
        num_inserted, num_held_out, confidence=confidence, delta=bound_delta
    )
    outcome = audit_outcome(0.0, reachable, epsilon, delta)
    if outcome == UNTESTABLE:
        detail = untestable_message(
            num_inserted, num_held_out, reachable, epsilon, bound_delta, repeats, confidence
        )
        line = (
            f"Audit plan: the config claims about ε = {epsilon:.4g} (δ = {delta:.3g}). {detail}. "
            "Training anyway: exposure and extraction still measure memorisation."
        )
    elif outcome == CONSISTENT:  # Testable: the bound may land on either side.
        outcome = "testable"
        line = (
            f"Audit plan: the config claims about ε = {epsilon:.4g} (δ = {delta:.3g}); "
            f"{num_inserted + num_held_out} canaries ({num_inserted} inserted) can show up to "
            f"ε ≥ {reachable:.3g} at {confidence:.0%}: the claim is testable."
        )
    else:
        line = "Audit plan: " + verdict_message(
            outcome,
            lower_bound=0.0,
            reachable_bound=reachable,
            tested_epsilon=epsilon,
            tested_delta=bound_delta,
            num_inserted=num_inserted,
            num_held_out=num_held_out,
            repeats=repeats,
            confidence=confidence,
        )
    return outcome, line
