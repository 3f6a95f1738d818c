"""The σ search of the noise calibrations (`accounting.calibrate_noise_multiplier*`).

`search` finds the smallest σ within a factor 1 + tol whose ε meets a target;
`hint_holds` checks a candidate against the same contract in two evaluations.
Both take ε(σ) as a function: no accountant here.
"""

import math
import numbers


def search(epsilon_at, target_epsilon: float, lo: float, hi: float, tol: float) -> float:
    """Smallest σ within a factor 1 + tol whose ε(σ) <= target; needs ε(lo) > target >= ε(hi).

    A bracketed secant in (log σ, log ε), where ε(σ) is nearly a straight
    line: each step aims at the secant's root between the last two points (a
    bisection where that root leaves the bracket or a value is not finite;
    bisections only, once a secant step fails to halve the one before); once
    the root is pinned, one point just above it and one just below close the
    bracket. Every σ it returns had its ε computed <= target (the bracket's
    invariant), as bisection's did, in about a third of bisection's
    evaluations (each a PLD of T steps: seconds).
    """
    last = [(lo, epsilon_at(lo)), (hi, epsilon_at(hi))]  # The two latest points.
    secant = True

    def record(sigma: float) -> None:
        nonlocal lo, hi
        epsilon = epsilon_at(sigma)
        if epsilon <= target_epsilon:
            hi = sigma
        else:
            lo = sigma
        last[:] = [last[-1], (sigma, epsilon)]

    previous_move = math.inf
    while hi / lo > 1.0 + tol:
        guess = secant_root(last, target_epsilon, lo, hi) if secant else None
        if guess is None or not lo < guess < hi:
            record(math.sqrt(lo * hi))
            continue
        move = abs(math.log(guess / last[-1][0]))
        if move > previous_move / 2:
            secant = False  # Not converging faster than bisection: bisect from here on.
            continue
        previous_move = move
        if move < math.log1p(tol) / 4:
            # Pinned: bracket the root within (1 + tol) by a point each side.
            half = math.log1p(tol) * 0.45
            above = min(guess * math.exp(half), hi)
            if above < hi:
                record(above)
            below = max(guess * math.exp(-half), lo)
            if below > lo and hi / lo > 1.0 + tol:
                record(below)
        else:
            record(guess)
    return hi


def secant_root(last, target_epsilon: float, lo: float, hi: float) -> float | None:
    """Where the line through the two points' (log σ, log ε) meets log target, inside (lo, hi).

    None where that is undefined (a value 0 or not finite, equal values) or
    outside the bracket (the search then bisects).
    """
    (s0, e0), (s1, e1) = last
    if not (0 < e0 < math.inf and 0 < e1 < math.inf) or e0 == e1:
        return None
    f0, f1 = math.log(e0 / target_epsilon), math.log(e1 / target_epsilon)
    x0, x1 = math.log(s0), math.log(s1)
    root = x1 - f1 * (x1 - x0) / (f1 - f0)
    if not math.log(lo) < root < math.log(hi):
        return None
    return math.exp(root)


def hint_holds(
    epsilon_at, target_epsilon: float, hint, tol: float, floor: float, ceiling: float
) -> bool:
    """Whether ε(hint) <= target < ε(hint / (1 + tol)): the search's own answer contract.

    ε falls as σ grows, so a σ within a factor 1 + tol above one that misses the
    target is at most (1 + tol) times the optimum, the guarantee `search` gives.
    A hint above `ceiling`, or whose lower point falls below `floor` (the
    searched range), is not tried: the search handles the floor.
    """
    if not isinstance(hint, numbers.Real) or isinstance(hint, bool):
        return False  # None, text, bool: no σ.
    try:
        hint = float(hint)
    except (TypeError, ValueError, OverflowError):
        return False
    below = hint / (1.0 + tol)
    if not (floor <= below and hint <= ceiling):
        return False  # Also False for NaN.
    return epsilon_at(hint) <= target_epsilon < epsilon_at(below)
