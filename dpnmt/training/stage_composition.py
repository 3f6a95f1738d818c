"""Two private stages, one accountant: DP pre-training then DP fine-tuning of its export.

A private run from a dpnmt export whose training data may overlap its own
(`pretrained_privacy`: the export's ε composes) has two DP-SGD runs on one
person's data. Basic composition adds the export's total (ε, δ) to this run's.
When both DP-SGD runs are Poisson-sampled Gaussians over single examples under
the same adjacency, and the export's record states its (σ, q, T, δ) and a
DP-SGD ε those numbers reproduce, the two runs also compose as ONE
dp_accounting event (`core.accounting.compute_epsilon_sequential`) at the sum
of their DP-SGD δ's: usually a smaller ε than the sum. The report takes the
smaller of the two valid bounds and says which; the vocabularies' ε (and any
other ε either record adds) still add. Anything else keeps the sum: shuffled
lots, group units, another adjacency, a record whose q is not its L / N, whose
steps_done exceeds steps_planned or whose total is below its DP-SGD ε, and an
export that itself started from a dpnmt export. A claim read with the
export's ledger (`training.ledger_report`) composes there instead: this
module serves claims recorded before the ledger (resumed, decoded, exported).

The joint bound treats both stages' (σ, q, T) as fixed in advance; if this
run's were chosen by looking at the export's outputs (adaptive choice), the
sum (or RDP) is the safer reading (docs/privacy.md).
"""

import dataclasses
import math
from typing import Any

from dpnmt import privacy
from dpnmt.core import accounting

# The record's "bound" ends with the accountant that computed its ε.
_ACCOUNTANTS = {"PLD accountant": "pld", "RDP accountant": "rdp"}
_RELATIVE_TOLERANCE = 1e-9  # Recomputing the record's ε must give it back (same library).


@dataclasses.dataclass(frozen=True)
class JointDpSgd:
    """Both stages' DP-SGD composed in one accountant.

    Attributes:
      epsilon: ε of the joint event at `delta`.
      delta: the sum of the two stages' DP-SGD δ.
      accountant: which accountant ("pld" or "rdp", this run's).
      other_epsilon: ε the export's record adds beyond its DP-SGD (its vocabulary).
      other_delta: δ the export's record adds beyond its DP-SGD.
    """

    epsilon: float
    delta: float
    accountant: str
    other_epsilon: float
    other_delta: float


def _number(record: dict[str, Any], key: str) -> float | None:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _stage_of(record: dict[str, Any], adjacency: str) -> tuple[float, float, int, float] | None:
    """(σ, q, T, δ) of an export's DP-SGD when it composes jointly with a run of `adjacency`."""
    if record.get("private") is not True or record.get("sampling") != privacy.POISSON:
        return None
    if record.get("adjacency") != adjacency or record.get("privacy_unit") is not None:
        return None
    parent = record.get("pretrained") or {}
    if parent.get("composed") or parent.get("declared_disjoint") or parent.get("epsilon"):
        return None  # It started from an export with an ε of its own: keep the sum.
    accountant = next((a for k, a in _ACCOUNTANTS.items() if k in str(record.get("bound"))), None)
    sigma, rate = _number(record, "noise_multiplier"), _number(record, "sampling_rate")
    steps, delta = record.get("steps_planned"), _number(record, "dp_sgd_delta")
    epsilon = _number(record, "dp_sgd_epsilon")
    if None in (accountant, sigma, rate, delta, epsilon) or not isinstance(steps, int):
        return None
    if not (sigma > 0 and 0 < rate <= 1 and steps >= 1 and 0 < delta < 1):
        return None
    lot, size, done = (
        _number(record, "expected_lot_size"),
        _number(record, "dataset_size"),
        record.get("steps_done"),
    )
    if lot is None or not size or not isinstance(done, int) or not 0 <= done <= steps:
        return None
    if abs(rate - lot / size) > _RELATIVE_TOLERANCE * rate:
        return None  # q is not its expected lot over its dataset size.
    again = accounting.compute_epsilon(sigma, rate, steps, delta, accountant)
    if abs(again - epsilon) > _RELATIVE_TOLERANCE * max(1.0, epsilon):
        return None  # The record's numbers do not give its ε: trust only its total.
    return sigma, rate, steps, delta


def joint_dp_sgd(plan: privacy.PrivacyPlan, claim, adjacency: str) -> JointDpSgd | None:
    """Both DP-SGD runs composed in one accountant (module docstring), or None.

    Args:
      plan: this run's privacy plan (Poisson, example unit, secret seed).
      claim: the starting model's `PretrainedClaim` (composed, with its record).
      adjacency: this run's neighbouring datasets (`composition_rules.adjacency`).
    """
    if claim is None or not claim.composed or not isinstance(claim.record, dict):
        return None
    if not (plan.private and plan.seed_is_secret) or plan.sampling != privacy.POISSON:
        return None
    if plan.unit != privacy.EXAMPLE:
        return None
    record = claim.record
    stage = _stage_of(record, adjacency)
    total_epsilon, total_delta = _number(record, "total_epsilon"), _number(record, "total_delta")
    if stage is None or total_epsilon is None or total_delta is None:
        return None
    sigma, rate, steps, delta = stage
    other_epsilon = total_epsilon - _number(record, "dp_sgd_epsilon")
    if other_epsilon < 0 or total_delta < delta:
        return None  # A total below its own DP-SGD part: trust only the sum.
    joint_delta = delta + plan.delta
    epsilon = accounting.compute_epsilon_sequential(
        ((sigma, rate, steps), (plan.noise_multiplier, plan.sampling_rate, plan.num_steps)),
        joint_delta,
        plan.accountant,
    )
    return JointDpSgd(
        epsilon=epsilon,
        delta=joint_delta,
        accountant=plan.accountant,
        other_epsilon=other_epsilon,
        other_delta=total_delta - delta,
    )
