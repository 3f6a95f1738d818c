"""This run's stage of the privacy ledger, and the total a run from a dpnmt export reports.

`privacy_report.privacy_report` asks `composition` when the starting export
brought a ledger (`PretrainedClaim.ledger`): the export's stages plus this
run's (its DP-SGD and vocabulary events; declared disjoint or not), each
stage's people composed over every event that touched them
(`class_totals`), the worst class the run's total.
"""

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import dp_accounting

from dpnmt import privacy
from dpnmt.core import accounting
from dpnmt.training import composition_rules as rules
from dpnmt.training import ledger
from dpnmt.training.ledger import Event, Stage

NOTE = (
    "per-corpus privacy ledger over {stages} stage(s) (the starting export's lineage and this "
    "run): the people of each stage's data get every event that touched those data composed "
    "(DP-SGD runs in one dp_accounting PLD event at the sum of their δ, other ε and δ added); "
    "stages declared disjoint compose in parallel; the total is the worst: {worst}"
)


def own_stage(
    plan: privacy.PrivacyPlan, vocabulary: tuple[float, float] | None, *, declared: bool
) -> ledger.Stage:
    """This run's stage: its DP-SGD at the planned T and its vocabulary's (ε, δ).

    Args:
      plan: the run's privacy plan.
      vocabulary: the (ε, δ) its vocabulary spent (`privacy_report.vocabulary_epsilon`);
        None when private data shaped it without DP (no guarantee).
      declared: `model.pretrained_data_disjoint` (its data in no earlier stage's).
    """
    why = None
    if not plan.private:
        why = "it was trained without DP"
    elif not plan.seed_is_secret:
        why = "its noise seed was fixed (tests only)"
    elif vocabulary is None:
        why = "its vocabulary was learnt from private data without DP"
    if why is not None:
        unguarded = ledger.Event(ledger.NO_GUARANTEE, math.inf, 0.0, why)
        return ledger.Stage((), plan.private, declared, (unguarded,))
    epochs = plan.epochs_started(plan.num_steps) if plan.sampling == privacy.SHUFFLE else None
    events = [
        ledger.Event(
            ledger.DP_SGD,
            plan.epsilon_after(plan.num_steps),
            plan.delta,
            "DP-SGD",
            plan.sampling,
            plan.noise_multiplier,
            plan.sampling_rate,
            plan.num_steps,
            epochs,
            plan.accountant,
            plan.unit,
        )
    ]
    if vocabulary[0] or vocabulary[1]:
        events.append(ledger.Event(ledger.OTHER, *vocabulary, "vocabulary"))
    return ledger.Stage((), True, declared, tuple(events))


def composition(
    plan: privacy.PrivacyPlan, vocabulary: tuple[float, float] | None, pretrained
) -> "Composition":
    """The export's stages and this run's, each stage's people's (ε, δ), the worst.

    Args:
      plan: the run's privacy plan.
      vocabulary: as `own_stage`'s.
      pretrained: the starting export's `PretrainedClaim`, with its ledger.
    """
    stage = own_stage(plan, vocabulary, declared=pretrained.declared_disjoint)
    return class_totals((*pretrained.ledger, stage))


def describe(
    total: "Composition", pretrained, ours: tuple[float, float], run_adjacency: str, example
) -> str:
    """The report's "composition" line for a ledger total.

    Declared disjoint, the total is the larger of the lineage's worst class and
    this run's own (ε, δ) (`ours`: DP-SGD and vocabulary), said as parallel
    composition; a lineage with no protected class (public stages) adds nothing.
    """
    ledger_line = NOTE.format(stages=len(total.stages), worst=worst_class(total))
    if pretrained.parallel:
        theirs = pretrained.epsilon if pretrained.epsilon is not None else math.inf
        line = rules.PARALLEL_COMPOSITION.format(theirs, pretrained.delta or 0.0, *ours)
        return f"{line}; {ledger_line}" + rules.parallel_units_note(pretrained.record, example)
    if not pretrained.composed:
        line = "basic composition (ε and δ add) of DP-SGD and the vocabulary"
        if (pretrained.record or {}).get("private") is not True:
            line += rules.unguarded_export_note(pretrained.record)
        return line
    line = f"the pretrained export's lineage and this run composed: {ledger_line}"
    others = sorted(_worst_relations(total, pretrained.adjacency))
    if [r for r in others if r != run_adjacency]:
        line += rules.mixed_adjacency_note(" and ".join(others), run_adjacency)
    return line + rules.units_note(pretrained.record, example)


def _worst_relations(total: "Composition", parent: str | None) -> set[str]:
    """The neighbouring relations of the lineage's events that touched the worst class.

    Its stage's and later ones' (not this run's): a DP-SGD event's from its
    sampling and unit; a record's bare total has the relation its record
    states (`parent`: the starting export's), for an earlier stage none.
    """
    counted = [k for k in total.classes if k.counted]
    if not counted:
        return set()
    worst, last = max(counted, key=lambda k: k.epsilon).stage, len(total.stages) - 1
    relations = set()
    for t in _touching(total.stages, worst):
        for e in total.stages[t].events if t < last else ():
            if e.kind == ledger.DP_SGD:
                relations.add(rules.relation(e.sampling, e.unit))
            elif e.what == ledger.RECORD_TOTAL:
                stated = parent if t == last - 1 else None
                relations.add(stated or "a relation its record does not state")
    return relations


def _touching(stages: Sequence[Stage], c: int) -> list[int]:
    """Stage `c` and every later stage not declared disjoint: those whose events touch class c."""
    return [c, *(t for t in range(c + 1, len(stages)) if not stages[t].declared_disjoint)]


@dataclasses.dataclass(frozen=True)
class ClassTotal:
    """The (ε, δ) of the people in one stage's data.

    Attributes:
      stage: the stage's index in the ledger (0: the oldest).
      corpora: its corpora's public names.
      counted: whether the total counts it (a public class is not, unless a later
        undeclared DP stage may hold its people).
      epsilon: ε of every event that touched the class, composed.
      delta: its δ.
      events: how many events touched it.
      unguarded: why an event gave it no guarantee ("" when none did).
    """

    stage: int
    corpora: tuple[str, ...]
    counted: bool
    epsilon: float
    delta: float
    events: int
    unguarded: str = ""


@dataclasses.dataclass(frozen=True)
class Composition:
    """A ledger's per-class totals and its worst class: what the report publishes.

    Attributes:
      stages: the ledger, oldest first (this run's last).
      classes: one total per stage's class.
      epsilon: the worst counted class's ε (0 when none is counted).
      delta: the largest counted class's δ.
    """

    stages: tuple[Stage, ...]
    classes: tuple[ClassTotal, ...]
    epsilon: float
    delta: float

    def to_json(self) -> dict[str, Any]:
        """The report's "ledger" object."""
        return {
            "stages": [s.to_json() for s in self.stages],
            "classes": [dataclasses.asdict(c) for c in self.classes],
            "epsilon": self.epsilon,
            "delta": self.delta,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Composition":
        """Reads `to_json`'s object back (stages re-checked; totals as written)."""
        classes = []
        for item in data["classes"]:
            values = dict(item)
            values["corpora"] = tuple(values["corpora"])
            values["epsilon"], values["delta"] = float(values["epsilon"]), float(values["delta"])
            classes.append(ClassTotal(**values))
        return cls(
            ledger.parse_stages(data["stages"], "the report's ledger"),
            tuple(classes),
            float(data["epsilon"]),
            float(data["delta"]),
        )


def events_epsilon(events: Sequence[Event]) -> tuple[float, float]:
    """(ε, δ) of events on one person's data: DP-SGD in one PLD, the rest added.

    Several DP-SGD events compose as one dp_accounting event at the sum of
    their δ (PLD; the sum of their own ε when smaller: both are valid), one
    keeps its own ε; other events add their (ε, δ). Any "no_guarantee": ∞.
    """
    if any(e.kind == ledger.NO_GUARANTEE for e in events):
        return math.inf, 0.0
    sgd = [e for e in events if e.kind == ledger.DP_SGD]
    other_epsilon = sum(e.epsilon for e in events if e.kind == ledger.OTHER)
    delta = sum(e.delta for e in events)
    epsilon = sum(e.epsilon for e in sgd)  # One event: its own ε, as its report states it.
    if len(sgd) > 1:
        joint = dp_accounting.ComposedDpEvent([e.dp_event() for e in sgd])
        epsilon = min(epsilon, accounting.event_epsilon(joint, sum(e.delta for e in sgd), "pld"))
    return epsilon + other_epsilon, delta


def class_totals(stages: Sequence[Stage]) -> Composition:
    """Each stage's class (ε, δ) and the worst counted one (module docstring)."""
    classes = []
    for c, stage in enumerate(stages):
        touching = _touching(stages, c)
        events = [e for t in touching for e in stages[t].events]
        epsilon, delta = events_epsilon(events)
        counted = stage.private or any(stages[t].private for t in touching[1:])
        names = tuple(str(x.get("corpus", "?")) for x in stage.corpora)
        why = next(
            (
                e.what if t == c else f"stage {t} ({e.what}) may hold them"
                for t in touching
                for e in stages[t].events
                if e.kind == ledger.NO_GUARANTEE
            ),
            "",
        )
        classes.append(ClassTotal(c, names, counted, epsilon, delta, len(events), why))
    counted = [k for k in classes if k.counted]
    return Composition(
        tuple(stages),
        tuple(classes),
        max((k.epsilon for k in counted), default=0.0),
        max((k.delta for k in counted), default=0.0),
    )


def worst_class(composition: Composition) -> str:
    """One line naming the class that sets the total (for a refusal or a note)."""
    counted = [k for k in composition.classes if k.counted]
    if not counted:
        return "no stage trained with DP"
    worst = max(counted, key=lambda k: k.epsilon)
    names = ", ".join(worst.corpora) or "corpora not recorded"
    if worst.unguarded:
        return f"stage {worst.stage}'s data ({names}): ε ∞ ({worst.unguarded})"
    return (
        f"stage {worst.stage}'s data ({names}): ε {worst.epsilon:.6g} over {worst.events} "
        "event(s) that touched them"
    )
