r"""How many groups a group-level (user-level) run needs: from the accountant.

    PYTHONPATH=. python docs/results/groups_needed/make.py   # writes table.md beside it

A group-level run clips each sampled group's summed gradient to C, so one
group weighs what one pair weighs in a per-pair run: at the same L
(contributions a lot), σ and T it has the same noise to signal, and its ε per
group is the per-pair run's ε with N replaced by N_groups (q = L / N_groups).
For each reference per-pair run (its σ, L, T, δ from results.json) this
prints (1) the fewest groups N_g with which that recipe gives ε ≤ 8 and ε ≤ 1
per group (`dpnmt.core.compute_epsilon`, PLD, bisection over N_g), and (2) the
least ε per group reachable with ClinSpEn's 42 and BSD's 69 groups at the same
noise to signal σ / L and the same T (L_groups ≤ N_groups - 1, σ scaled by
L_groups / L; the best of the L_groups tried).
"""

import json
import math
import os

from dpnmt import core

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.dirname(HERE)
# (name, run folder below docs/results): per-pair runs at ε = 8.
REFERENCES = (
    ("ClinSpEn per pair (groups table)", "groups_clinspen/pair"),
    ("BSD per turn (groups table)", "groups_bsd/pair"),
    ("Multi30K from a public model (best DP BLEU here)", "two_stage_full/eps8-poisson/seed0"),
)
TARGETS = (8.0, 1.0)
GROUPS = (42, 69)  # ClinSpEn's case reports, BSD's dialogues.


def epsilon(sigma: float, lot: int, groups: int, steps: int, delta: float) -> float:
    """ε per group of T Poisson-sampled Gaussian steps with q = lot / groups."""
    return core.compute_epsilon(sigma, lot / groups, steps, delta, "pld")


def groups_needed(sigma: float, lot: int, steps: int, delta: float, target: float) -> int:
    """The fewest N_g > L with ε(q = L / N_g) ≤ target (ε falls as N_g grows)."""
    low, high = lot + 1, 2 * (lot + 1)
    while epsilon(sigma, lot, high, steps, delta) > target:
        low, high = high, 2 * high
    while high - low > max(1, high // 1000):  # Within 0.1%: rounded up, never down.
        middle = (low + high) // 2
        if epsilon(sigma, lot, middle, steps, delta) > target:
            low = middle
        else:
            high = middle
    return high


def least_epsilon(sigma: float, lot: int, steps: int, delta: float, groups: int):
    """(ε, L_groups): the least ε per group with `groups` groups at the noise to signal σ / L."""
    tried = sorted({groups - 1, groups // 2, max(1, groups // 4)})
    return min((epsilon(sigma * g / lot, g, groups, steps, delta), g) for g in tried)


def table() -> str:
    """The Markdown table, one row per reference run."""
    header = ["reference run", "N pairs", "L", "σ", "T", "test BLEU"]
    header += [f"N_groups for ε ≤ {t:g} per group" for t in TARGETS]
    header += [f"least ε per group with {g} groups (L_groups)" for g in GROUPS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, path in REFERENCES:
        with open(os.path.join(RESULTS, path, "results.json")) as f:
            results = json.load(f)
        p = results["privacy"]
        sigma, lot = p["noise_multiplier"], p["expected_lot_size"]
        steps, delta = p["steps_planned"], p["dp_sgd_delta"]
        cells = [name, f"{p['dataset_size']:,}", str(lot), f"{sigma:.3f}", str(steps)]
        cells.append(f"{results['test']['bleu']:.2f}")
        cells += [f"{groups_needed(sigma, lot, steps, delta, t):,}" for t in TARGETS]
        for g in GROUPS:
            eps, lot_g = least_epsilon(sigma, lot, steps, delta, g)
            cells.append(("∞" if math.isinf(eps) else f"{eps:,.0f}") + f" ({lot_g})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main():
    """Writes table.md and prints it."""
    text = table()
    with open(os.path.join(HERE, "table.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
