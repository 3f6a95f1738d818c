"""Recomputes a published run's ε with dp_accounting from its results.json alone.

A reader can redo this check: σ, L, N, T, δ and the sampling are all in the
run's public "privacy" object. The recomputation calls `dp_accounting` directly
(not `dpnmt.core.accounting`), so a bug there cannot hide itself here:

* Poisson lots: T self-composed Poisson-sampled Gaussian steps, q = L/N.
* Shuffled lots: E = ⌈T / ⌊N/L⌋⌉ self-composed Gaussian mechanisms (each
  example in at most one lot per epoch; no amplification by sampling).

The accountant is the one the record names ("RDP" in its bound, else PLD on a
fine grid: PLD's discretisation over-estimates ε, never under-estimates it).
A ledger's earlier stages must also be the ones the starting export's record
(embedded in the report) gives (`training.ledger_check.report_problem`: a
consistency check of the record, not a recomputation).
"""

import dataclasses
import math
from collections.abc import Sequence

import dp_accounting
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from dpnmt.core.accounting import _quiet_rdp_convergence as quiet_rdp_convergence
from dpnmt.training import ledger_check

# Reported and recomputed ε may differ by this much (relative), plus an absolute
# 1e-3: PLD discretisation (at most 1e-4 of ε per step of the grid) and the
# JSON's float rounding stay far below it; a wrong σ, q, T or bound does not.
RELATIVE_TOLERANCE = 1e-2
ABSOLUTE_TOLERANCE = 1e-3


@dataclasses.dataclass(frozen=True)
class EpsilonCheck:
    """A run's reported ε against the one recomputed from its public record.

    Attributes:
      reported: results.json's dp_sgd_epsilon (inf when not private).
      recomputed: dp_accounting's ε from (σ, q, T, δ, sampling); None when
        the run is not private or claims no finite ε.
      agrees: whether they match within the tolerances (True when nothing to check).
      total_reported: results.json's total_epsilon.
      total_recomputed: recomputed DP-SGD ε plus the vocabulary's and a composed
        pretrained export's ε, as recorded (two stages in one accountant: both
        DP-SGD runs recomputed as one event); None when not recomputed.
      note: one line for the report: what was recomputed, or why it disagrees.
    """

    reported: float
    recomputed: float | None
    agrees: bool
    total_reported: float
    total_recomputed: float | None
    note: str


def _float(value) -> float:
    return math.inf if value is None else float(value)


def recompute_epsilon(privacy: dict) -> float:
    """DP-SGD ε at the planned T from a results.json "privacy" object (dp_accounting only).

    Raises:
      KeyError, ValueError: the record lacks σ, L, N, T or δ, or names an
        unknown sampling.
    """
    return _epsilon([_event(privacy)], float(privacy["dp_sgd_delta"]), privacy.get("bound"))


def _event(privacy: dict):
    """The DP-SGD event a "privacy" record describes (σ, q = L/N, T, its sampling)."""
    sigma = float(privacy["noise_multiplier"])
    lot, size = int(privacy["expected_lot_size"]), int(privacy["dataset_size"])
    steps = int(privacy["steps_planned"])
    gaussian = dp_accounting.GaussianDpEvent(sigma)
    if privacy["sampling"] == "poisson":
        return dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(lot / size, gaussian), steps
        )
    if privacy["sampling"] == "shuffle":
        epochs = max(1, math.ceil(steps / (size // lot)))
        return dp_accounting.SelfComposedDpEvent(gaussian, epochs)
    raise ValueError(f"sampling={privacy['sampling']!r}: expected 'poisson' or 'shuffle'.")


def _epsilon(events, delta: float, bound) -> float:
    """ε of `events` composed, by the accountant `bound` names."""
    event = dp_accounting.ComposedDpEvent(list(events))
    rdp = rdp_privacy_accountant.RdpAccountant()
    with quiet_rdp_convergence():  # Its per-order warnings: noise between the report's tables.
        rdp.compose(event)
    rdp_epsilon = float(rdp.get_epsilon(delta))
    if "RDP" in str(bound or "") or not math.isfinite(rdp_epsilon):
        return rdp_epsilon
    # 1e-4, coarser only at large ε where a fine grid takes minutes (the relative
    # error stays ≤ 1e-5 · ε per step of the grid).
    interval = 10.0 ** math.floor(math.log10(max(1e-4, 1e-5 * rdp_epsilon)))
    pld = pld_privacy_accountant.PLDAccountant(value_discretization_interval=interval)
    pld.compose(event)
    return float(pld.get_epsilon(delta))


def _joint_total(privacy: dict) -> float | None:
    """The total of a two-stage record composed in one accountant (`joint_dp_sgd`), or None.

    Both DP-SGD runs (the pretrained export's record and this run's) as one
    event at the sum of their δ, plus this run's vocabulary ε and what the
    export's total adds beyond its DP-SGD.
    """
    joint, pretrained = privacy.get("joint_dp_sgd"), privacy.get("pretrained") or {}
    record = pretrained.get("record")
    if not joint or "one dp_accounting event" not in str(privacy.get("composition")):
        return None
    delta = float(record["dp_sgd_delta"]) + float(privacy["dp_sgd_delta"])
    accountant = "RDP" if joint.get("accountant") == "rdp" else "PLD"
    epsilon = _epsilon([_event(record), _event(privacy)], delta, accountant)
    other = max(0.0, _float(record["total_epsilon"]) - _float(record["dp_sgd_epsilon"]))
    return epsilon + other + _float((privacy.get("vocabulary") or {}).get("epsilon") or 0.0)


def _ledger_event(event: dict):
    """A ledger's DP-SGD event (`training.ledger`) as a dp_accounting event."""
    gaussian = dp_accounting.GaussianDpEvent(float(event["noise_multiplier"]))
    if event["sampling"] == "poisson":
        sampled = dp_accounting.PoissonSampledDpEvent(float(event["sampling_rate"]), gaussian)
        return dp_accounting.SelfComposedDpEvent(sampled, int(event["steps"]))
    return dp_accounting.SelfComposedDpEvent(gaussian, int(event["epochs"]))


def _ledger_class(events: list[dict]) -> tuple[float, str | None]:
    """ε of one class's events: DP-SGD in one PLD event (or their ε summed), others added."""
    if any(e.get("kind") not in ("dp_sgd", "epsilon_delta") for e in events):
        return math.inf, None
    sgd = [e for e in events if e["kind"] == "dp_sgd"]
    own, problem = [], None
    for e in sgd:
        accountant = "RDP" if e.get("accountant") == "rdp" else "PLD"
        own.append(_epsilon([_ledger_event(e)], float(e["delta"]), accountant))
        if _float(e["epsilon"]) < own[-1] - (RELATIVE_TOLERANCE * own[-1] + ABSOLUTE_TOLERANCE):
            problem = f"a ledger event's ε {e['epsilon']} is below its recomputation {own[-1]:.6g}"
    epsilon = sum(max(_float(e["epsilon"]), o) for e, o in zip(sgd, own, strict=True))
    if len(sgd) > 1:
        delta = sum(float(e["delta"]) for e in sgd)
        epsilon = min(epsilon, _epsilon([_ledger_event(e) for e in sgd], delta, "PLD"))
    other = sum(_float(e["epsilon"]) for e in events if e["kind"] == "epsilon_delta")
    return epsilon + other, problem


def _ledger_total(ledger: dict) -> tuple[float, str | None]:
    """The worst counted class of a report's ledger, recomputed from its stages' events.

    A stage's events touch its own class and, unless it was declared disjoint,
    every earlier stage's; a class counts when its stage, or a later stage
    touching it, trained with DP.
    """
    stages, worst, problem = ledger["stages"], 0.0, None
    for c in range(len(stages)):
        touching = [c] + [
            t for t in range(c + 1, len(stages)) if not stages[t]["declared_disjoint"]
        ]
        if not any(stages[t]["private"] for t in touching):
            continue
        epsilon, wrong = _ledger_class([e for t in touching for e in stages[t]["events"]])
        worst, problem = max(worst, epsilon), problem or wrong
    return worst, problem


def check_run(privacy: dict) -> EpsilonCheck:
    """Compares the run's reported DP-SGD and total ε with their recomputation."""
    reported, total = _float(privacy["dp_sgd_epsilon"]), _float(privacy["total_epsilon"])
    if not privacy["private"]:
        return EpsilonCheck(reported, None, math.isinf(reported), total, None, "not private")
    if math.isinf(reported):
        return EpsilonCheck(reported, None, True, total, None, "claims no guarantee (ε = ∞)")
    recomputed = recompute_epsilon(privacy)
    tolerance = RELATIVE_TOLERANCE * recomputed + ABSOLUTE_TOLERANCE
    vocabulary = privacy.get("vocabulary") or {}
    before = _float(vocabulary.get("epsilon") or 0.0)
    if vocabulary.get("covered_by_guarantee") is False:
        before = math.inf
    pretrained = privacy.get("pretrained") or {}
    problem = None
    if pretrained.get("composed"):
        theirs, problem = _composed_export(pretrained)
        before += theirs
    total_recomputed = recomputed + before
    joint = _joint_total(privacy)
    if joint is not None:  # Two private stages in one accountant (`training.stage_composition`).
        total_recomputed = joint
    if privacy.get("ledger") is not None:  # Every stage of the lineage, by class (`ledger`).
        total_recomputed, problem = _ledger_total(privacy["ledger"])
        problem = problem or ledger_check.report_problem(privacy)  # Its export's record agrees.
    elif disjoint_private(pretrained):  # Declared disjoint data: the larger of the two totals.
        theirs, their_delta, problem = _parallel_export(pretrained)
        total_recomputed = max(total_recomputed, theirs)
        ours_delta = float(privacy["dp_sgd_delta"]) + float(vocabulary.get("delta") or 0.0)
        delta = max(ours_delta, their_delta)
        reported_delta = _float(privacy.get("total_delta"))
        if problem is None and math.isfinite(total_recomputed) and reported_delta != delta:
            problem = f"total δ {privacy.get('total_delta')} is not the max of the two, {delta:.3g}"
    agrees = (
        problem is None
        and abs(reported - recomputed) <= tolerance
        and (total == total_recomputed or abs(total - total_recomputed) <= tolerance)
    )
    note = (
        f"recomputed with dp_accounting: ε {recomputed:.3f} (reported {reported:.3f}), "
        f"total {total_recomputed:.3f} (reported {total:.3f})"
    )
    if not agrees:
        note = "DISAGREES: " + note + (f"; {problem}" if problem else "")
    return EpsilonCheck(reported, recomputed, agrees, total, total_recomputed, note)


def disjoint_private(pretrained: dict) -> bool:
    """A private export declared disjoint and not composed (records before `parallel` too)."""
    record = pretrained.get("record")
    return bool(pretrained.get("parallel")) or bool(
        pretrained.get("declared_disjoint")
        and not pretrained.get("composed")
        and isinstance(record, dict)
        and record.get("private") is True
    )


def _recomputed_record(
    record: dict, total: float, problem: str | None, label: str
) -> tuple[float, str | None]:
    """`total` raised to an embedded record's recomputed total, and its disagreement if first.

    A record without σ, q or T keeps its total as written.
    """
    try:
        inner = check_run(record)
    except (KeyError, ValueError, TypeError):
        return total, problem
    if not inner.agrees and problem is None:
        problem = f"{label}: {inner.note}"
    return max(total, _float(inner.total_recomputed)), problem


def _composed_export(pretrained: dict) -> tuple[float, str | None]:
    """The ε a composed export adds, never below its embedded record, and what is wrong, or None.

    The claim as written is checked against the record it embeds: not below
    that record's total, and the record's own ε recomputed (`check_run`) when
    it holds σ, q, T and δ.
    """
    epsilon, record = _float(pretrained.get("epsilon")), pretrained.get("record")
    if not isinstance(record, dict) or record.get("private") is not True:
        return epsilon, None
    theirs, problem = _float(record.get("total_epsilon")), None
    if epsilon < theirs:
        problem = f"the composed export's ε {epsilon:.6g} is below its record's total {theirs:.6g}"
    theirs, problem = _recomputed_record(record, theirs, problem, "the composed export's record")
    return max(epsilon, theirs), problem


def _parallel_export(pretrained: dict) -> tuple[float, float, str | None]:
    """(ε, δ) a parallel claim's export gives its own people, and why it is wrong, or None.

    The claim's (ε, δ) as written is checked against the export's record it
    embeds (the same results.json): not below that record's total, and the
    record's own ε recomputed (`check_run`) when it holds σ, q, T and δ. The
    larger of each is returned, so a claim understating its record cannot lower the max.
    """
    epsilon, delta = _float(pretrained.get("epsilon")), float(pretrained.get("delta") or 0.0)
    record = pretrained.get("record")
    if not isinstance(record, dict) or record.get("private") is not True:
        return math.inf, delta, "a parallel claim without its export's private record"
    their_total = _float(record.get("total_epsilon"))
    their_delta = _float(record.get("total_delta"))
    problem = None
    if epsilon < their_total or (math.isfinite(epsilon) and delta < their_delta):
        problem = (
            f"the export's claim (ε {epsilon:.6g}, δ {delta:.3g}) is below its own record's "
            f"total (ε {their_total:.6g}, δ {their_delta:.3g})"
        )
    their_total, problem = _recomputed_record(record, their_total, problem, "the export's record")
    return max(epsilon, their_total), max(delta, their_delta), problem


@dataclasses.dataclass(frozen=True)
class Together:
    """Several published runs' guarantee together, for one unit of their privacy.

    Attributes:
      epsilon: ε of all of them published together (∞: no joint bound; `note` says why).
      delta: its δ (∞ with an ∞ ε).
      unit: what one neighbouring change is, from the records ("one training
        example", "one whole group ...").
      events: runs composed in one dp_accounting event.
      added: runs added by basic composition (their whole recorded total).
      note: why there is no bound, or what the bound assumes ("" when nothing).
    """

    epsilon: float
    delta: float
    unit: str
    events: int
    added: int
    note: str


def _in_one_event(privacy: dict, check: EpsilonCheck) -> bool:
    """Whether the run's whole guarantee is its own Poisson DP-SGD, per training example."""
    vocabulary, pretrained = privacy.get("vocabulary") or {}, privacy.get("pretrained") or {}
    record = pretrained.get("record")
    return (
        privacy["sampling"] == "poisson"
        and len((privacy.get("ledger") or {}).get("stages", [])) < 2
        and privacy.get("privacy_unit") is None
        and not privacy.get("joint_dp_sgd")
        and vocabulary.get("covered_by_guarantee") is not False
        and _float(vocabulary.get("epsilon") or 0.0) == 0.0
        and not pretrained.get("composed")
        and not disjoint_private(pretrained)
        and not (isinstance(record, dict) and record.get("private") is True)
        and check.total_recomputed == check.recomputed
        and _float(privacy.get("total_delta")) == float(privacy["dp_sgd_delta"])
    )


def _total_delta(privacy: dict) -> float:
    """A record's total δ, never below the sum of its parts' (rebuilt where never recorded)."""
    vocabulary, pretrained = privacy.get("vocabulary") or {}, privacy.get("pretrained") or {}
    parts = float(privacy.get("dp_sgd_delta") or 0.0) + float(vocabulary.get("delta") or 0.0)
    record = pretrained.get("record")
    if pretrained.get("composed") or disjoint_private(pretrained):
        theirs = _total_delta(record) if isinstance(record, dict) else math.inf
        parts += max(float(pretrained.get("delta") or 0.0), theirs)
    recorded = privacy.get("total_delta")  # Absent from old records: the parts decide.
    return max(0.0 if recorded is None else _float(recorded), parts)


def _whole_total(privacy: dict, check: EpsilonCheck) -> tuple[float, float]:
    """A run's (ε, δ) as a whole, never below any of its recorded or recomputed parts.

    `check_run`'s recomputed total already holds a composed export's ε, or a
    disjoint private export's (the larger of the two totals), never below its
    record's.
    """
    return max(check.total_reported, _float(check.total_recomputed)), _total_delta(privacy)


def _unit(privacy: dict) -> tuple | None:
    """What one neighbouring change is: None (one example), else (unit, number of groups)."""
    unit = privacy.get("privacy_unit")
    return None if unit is None else (unit.get("unit"), unit.get("num_groups"))


def released_together(records: Sequence[dict]) -> Together:
    """The guarantee of several private runs published together (e.g. rows at several ε).

    An upper bound whatever the runs' training data share (tight when they
    share all of it). A run whose whole guarantee is its own Poisson DP-SGD per
    training example goes into one dp_accounting event with the others like it,
    whose ε is read at the largest of their δ (PLD on a fine grid: the composed
    mechanism's ε at any δ is a guarantee, and this δ compares directly with
    each row's own). Any other run (a vocabulary ε, a private export composed
    or declared disjoint, a two-stage record, shuffled lots, groups) adds its
    whole total by basic composition, taking the largest of its recorded and
    recomputed parts. No bound (∞) when a run is not private or has no finite
    total, or when the runs protect different units (one example, one group).

    Args:
      records: results.json "privacy" objects, each recomputable (`check_run`).

    Returns:
      `Together`: ε and δ (∞ with its reason in `note`), the unit, how many
      runs share the event and how many were added whole.

    Raises:
      ValueError: no record, or a record whose ε does not recompute (`check_run`).
    """
    if not records:
        raise ValueError("released_together needs at least one run's privacy record.")
    checks = []
    for privacy in records:
        check = check_run(privacy)
        if not check.agrees:
            raise ValueError(f"a record whose ε does not recompute: {check.note}")
        checks.append(check)
    for privacy, check in zip(records, checks, strict=True):
        if not privacy["private"] or not math.isfinite(_float(check.total_recomputed)):
            return Together(math.inf, math.inf, "–", 0, 0, "a run without a finite guarantee")
    units = {_unit(p) for p in records}
    if len(units) > 1:
        return Together(math.inf, math.inf, "–", 0, 0, "the runs protect different units")
    unit = "one training example" if units == {None} else "one whole group of a run's corpus"
    events, delta, epsilon_rest, delta_rest = [], 0.0, 0.0, 0.0
    for privacy, check in zip(records, checks, strict=True):
        if _in_one_event(privacy, check):
            events.append(_event(privacy))
            delta = max(delta, float(privacy["dp_sgd_delta"]))
            continue
        epsilon, run_delta = _whole_total(privacy, check)
        if not (math.isfinite(epsilon) and math.isfinite(run_delta)):
            return Together(math.inf, math.inf, unit, 0, 0, "a run without a finite (ε, δ)")
        epsilon_rest, delta_rest = epsilon_rest + epsilon, delta_rest + run_delta
    notes = []
    if len({p.get("adjacency") for p in records}) > 1:
        notes.append(
            "the runs' neighbouring datasets differ (an example added or removed, or replaced "
            "by a null example at a fixed N): the bound holds for one example changed in each "
            "run's data under that run's own relation, not for either relation alone"
        )
    kinds = sorted({str(p.get("example") or "one sentence pair") for p in records})
    if len(kinds) > 1:
        notes.append(
            f"the runs' examples differ ({'; '.join(kinds)}): the bound holds for a person "
            "with at most one example in each run's data (more: group privacy)"
        )
    note = "; ".join(notes)
    epsilon = _epsilon(events, delta, None) if events else 0.0
    added = len(records) - len(events)
    return Together(epsilon + epsilon_rest, delta + delta_rest, unit, len(events), added, note)
