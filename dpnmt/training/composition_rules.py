"""How a run's ε composes with a pretrained export's, in words and in the parallel rule.

`adjacency` names the neighbouring datasets a plan's ε is for; the notes say
what a composed total protects (`privacy_report.privacy_report` writes them
into results.json's "composition"); `parallel_total` is the rule for an
export declared disjoint whose record is private: each (ε, δ) the max.
"""

import math
from collections.abc import Mapping
from typing import Any, Protocol

from dpnmt import privacy

WHOLE_GROUP = "add/remove one whole group"  # How a group-unit adjacency begins.
ONE_PAIR = "one sentence pair"


class ExportTotal(Protocol):
    """An export's own total as a `privacy_report.PretrainedClaim` holds it."""

    epsilon: float | None  # inf or None: no finite guarantee.
    delta: float | None


def adjacency(plan: privacy.PrivacyPlan) -> str:
    """Which neighbouring datasets ε is stated for (see `dpnmt.core.accounting`)."""
    if not plan.private:
        return "none (no guarantee)"
    return relation(plan.sampling, plan.unit)


def relation(sampling: str | None, unit: str | None) -> str:
    """`adjacency` of a private DP-SGD run with this sampling and unit (a ledger event's too)."""
    if sampling == privacy.POISSON and unit == privacy.GROUP:
        return (
            f"{WHOLE_GROUP} of training examples (Poisson-sampled Gaussian over "
            "groups; a sampled group adds at most group_cap of its examples)"
        )
    if sampling == privacy.POISSON:
        return "add/remove one training example (Poisson-sampled Gaussian)"
    return (
        "replace one training example by a null example that contributes zero (the "
        "dataset size N is unchanged; each epoch is one Gaussian mechanism on it)"
    )


def mixed_adjacency_note(export: str | None, run: str) -> str:
    """The composition's note when the export's ε is for other neighbouring datasets than the run's.

    Each ε holds for its own relation; their sum holds for one example changed
    in both datasets, each time under that ε's relation (README "Which ε is
    reported"), and for neither relation alone. Under a group relation (an
    export trained with dp.unit="group") "changed" means its whole group
    removed: one example's own removal is only part of that neighbour.
    """
    note = (
        "; the two ε are for different neighbouring datasets: the export's for "
        f"{export or 'a relation its record does not state'}, this run's for {run}. The total "
        "bounds one example changed in both, each under its own relation (e.g. removed from "
        "one dataset and replaced by a null example in the other), not either relation alone"
    )
    for who, relation in (("the export's", export), ("this run's", run)):
        if relation is not None and relation.startswith(WHOLE_GROUP):
            note += (
                f"; under {who} group relation it holds only if the example's whole group "
                f"(user or document) is removed from {who} training data, not the example alone"
            )
    return note


JOINT_NOTE = (
    "the pretrained export's DP-SGD and this run's composed as one dp_accounting event "
    "({} accountant; joint_dp_sgd: ε at the sum of their DP-SGD δ), plus, by basic composition, "
    "the ε and δ of both vocabularies: below the sum of the two totals (the export's data "
    "may overlap this run's)"
)


def units_note(record: Mapping[str, Any] | None, example: str | None) -> str:
    """Who the composed total protects: one example of each stage (their units may differ)."""
    theirs = (record or {}).get("example") or f"{ONE_PAIR} (its record names no other unit)"
    ours = example or ONE_PAIR
    return (
        f". Units: the export's ε is per {theirs}; this run's per {ours}. The total bounds one "
        "person with at most one example in each stage's data (e.g. one text in pre-training "
        "and one pair here); a person with more is covered only by group privacy"
    )


def parallel_units_note(record: Mapping[str, Any] | None, example: str | None) -> str:
    """Who a parallel total protects: one example of the one stage a person is in."""
    theirs = (record or {}).get("example") or f"{ONE_PAIR} (its record names no other unit)"
    return (
        f". Units: the export's ε is per {theirs}; this run's per {example or ONE_PAIR}. It "
        "holds for a person with data in only one stage's training set, at most one example "
        "there (more: group privacy)"
    )


def parallel_total(pretrained: ExportTotal, epsilon: float, delta: float) -> tuple[float, float]:
    """(ε, δ) of this run's total (`epsilon`, `delta`) and a disjoint export's: each the max.

    Parallel composition over disjoint data: a person's data are in one
    stage's training set only, so they get that stage's (ε, δ); the other
    stage is post-processing for them (stage 2 only reads stage 1's output).
    An export without a finite ε gives ∞.
    """
    theirs = math.inf if pretrained.epsilon is None else float(pretrained.epsilon)
    their_delta = 0.0 if pretrained.delta is None else float(pretrained.delta)
    return max(epsilon, theirs), max(delta, their_delta)


PARALLEL_COMPOSITION = (
    "parallel composition over disjoint data (declared: model.pretrained_data_disjoint=True): "
    "max of the pretrained export's own total (ε = {:.6g}, δ = {:.3g}) and this run's "
    "(basic composition of DP-SGD and the vocabulary: ε = {:.6g}, δ = {:.3g}); each person's "
    "data are in one stage's training set only"
)


def unguarded_export_note(record: Mapping[str, Any] | None) -> str:
    """The composition's note for an export declared disjoint whose record is not private.

    Its ε is not composed (not parallel either): the people in its training
    data get no guarantee from this run's report, which the user accepted by
    declaring them public or disjoint.
    """
    how = "was trained without DP" if record is not None else "records no privacy guarantee"
    return (
        f"; the starting export {how}: its training data have no guarantee here (declared "
        "public/disjoint by model.pretrained_data_disjoint)"
    )
