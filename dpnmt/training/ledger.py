"""The privacy ledger: every stage of an export's lineage, and the ε of each stage's people.

An export's `dpnmt.json` carries under "ledger" one entry per stage that led
to it, oldest first: the stage's training corpora (public names, and a text
digest for a non-private stage, `data.corpus_record`), whether it trained
with DP, whether its data were declared (and checked) disjoint from every
earlier stage's, and the events that spent privacy on its data: each DP-SGD
run's (σ, q, T, δ, sampling, unit, accountant, its ε as written) and any
other (ε, δ) (a DP vocabulary). A stage trained without DP holds the event
"no_guarantee" and passes its parents' stages on unchanged.

People are grouped by the stage whose data they are in (a stage's "class").
A stage not declared disjoint may share people with every earlier stage, so
its events touch every earlier class as well as its own; a declared one
touches its own only. Each class's ε composes every event that touched it:
the DP-SGD runs in one dp_accounting PLD composition at the sum of their δ
(or the sum of their own ε where that is smaller), plus the other events by
basic composition (`ledger_report.class_totals`). The total is the worst class
(`ledger_report.Composition.epsilon`): parallel composition only between classes that no
common event touched. A non-private stage's own class is public by the
user's choice (outside the report) unless a later DP stage that was not
declared disjoint may hold its people: then they have no guarantee (∞).

Each DP-SGD event is recomputed from its own σ, q, T and δ when read
(`parse_stage`, `stage_of_record`); a written ε (or a record's total) below
that recomputation is refused (`LedgerError`), never used to lower anything.
An export from before the ledger is read as its record's own events, with
the records it embeds (`pretrained.record`) as earlier stages.
"""

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import dp_accounting

from dpnmt import privacy
from dpnmt.core import accounting
from dpnmt.errors import InputError

KEY = "ledger"  # Its key in dpnmt.json and in a report ("privacy"."ledger").
DP_SGD, OTHER, NO_GUARANTEE = "dp_sgd", "epsilon_delta", "no_guarantee"
RECORD_TOTAL = "record total"  # The `what` of an OTHER event: a record's total alone.
_ACCOUNTANTS = {"PLD accountant": "pld", "RDP accountant": "rdp"}
# A written ε may sit this far below its recomputation (JSON rounding, PLD grids), no further.
RELATIVE_TOLERANCE, ABSOLUTE_TOLERANCE = 1e-6, 1e-9


class LedgerError(InputError, ValueError):
    """An export's ledger or privacy record claims less than its own numbers give."""


@dataclasses.dataclass(frozen=True)
class Event:
    """One use of a stage's data: a DP-SGD run, another (ε, δ), or no guarantee.

    Attributes:
      kind: "dp_sgd", "epsilon_delta" or "no_guarantee".
      epsilon: its ε at `delta` as written (recomputed for "dp_sgd"; inf for "no_guarantee").
      delta: its δ.
      what: a few words (e.g. "DP-SGD", "vocabulary").
      sampling: "poisson" or "shuffle" ("dp_sgd" only, as are the fields below).
      noise_multiplier: σ.
      sampling_rate: q = L / N (Poisson); L / N (shuffled, for the record).
      steps: T, planned steps.
      epochs: shuffled lots: epochs composed (each a Gaussian); None for Poisson.
      accountant: "pld" or "rdp": the one its ε was written with.
      unit: "example" or "group".
    """

    kind: str
    epsilon: float
    delta: float
    what: str = ""
    sampling: str | None = None
    noise_multiplier: float | None = None
    sampling_rate: float | None = None
    steps: int | None = None
    epochs: int | None = None
    accountant: str | None = None
    unit: str | None = None

    def dp_event(self) -> dp_accounting.DpEvent:
        """The dp_accounting event of a "dp_sgd" event."""
        if self.sampling == privacy.POISSON:
            return accounting.dp_sgd_event(self.noise_multiplier, self.sampling_rate, self.steps)
        gaussian = dp_accounting.GaussianDpEvent(self.noise_multiplier)
        return dp_accounting.SelfComposedDpEvent(gaussian, self.epochs)

    def recomputed(self) -> float:
        """Its ε from its own σ, q, T (or epochs) and δ (its own accountant)."""
        return accounting.event_epsilon(self.dp_event(), self.delta, self.accountant or "pld")


@dataclasses.dataclass(frozen=True)
class Stage:
    """One training run of the lineage and what it spent on its data.

    Attributes:
      corpora: its training corpora as `corpus_record.training_corpora` records them.
      private: whether it trained with DP (its own class is protected).
      declared_disjoint: its data were declared (and checked) disjoint from every
        earlier stage's (`model.pretrained_data_disjoint=True`).
      events: what spent privacy on its data (and, undeclared, on every earlier stage's).
    """

    corpora: tuple[dict[str, str], ...]
    private: bool
    declared_disjoint: bool
    events: tuple[Event, ...]

    def to_json(self) -> dict[str, Any]:
        """Its JSON object (inf written as "inf" by `write_json`)."""
        return {
            "corpora": [dict(c) for c in self.corpora],
            "private": self.private,
            "declared_disjoint": self.declared_disjoint,
            "events": [
                {k: v for k, v in dataclasses.asdict(e).items() if v is not None}
                for e in self.events
            ],
        }


def number(value: Any) -> float | None:
    """A JSON number as a float ("inf" read as ∞), or None (a bool, NaN, anything else)."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)  # write_json stores inf as "inf".
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def _checked(event: Event, where: str) -> Event:
    """`event` with a DP-SGD ε never below its recomputation (a lower written one: refused)."""
    if event.kind != DP_SGD:
        return event
    again = event.recomputed()
    if event.epsilon < again * (1 - RELATIVE_TOLERANCE) - ABSOLUTE_TOLERANCE:
        raise LedgerError(
            f"{where}: its DP-SGD ε {event.epsilon:.6g} is below {again:.6g}, the ε its own "
            f"σ={event.noise_multiplier:g}, q={event.sampling_rate:g}, T={event.steps}, "
            f"δ={event.delta:g} give (an edited or corrupted dpnmt.json). Export that run "
            "again (python -m dpnmt.export), or start from another model."
        )
    return dataclasses.replace(event, epsilon=max(event.epsilon, again))


def _unguarded(what: str) -> Event:
    return Event(NO_GUARANTEE, math.inf, 0.0, what)


def parse_event(item: Any, where: str) -> Event:
    """One ledger event from JSON, its DP-SGD ε recomputed; anything unreadable: no guarantee."""
    if isinstance(item, Mapping) and item.get("kind") == NO_GUARANTEE:
        return _unguarded(str(item.get("what", "no guarantee")))
    if not isinstance(item, Mapping) or item.get("kind") not in (DP_SGD, OTHER):
        return _unguarded("an event this version cannot read")
    epsilon, delta = number(item.get("epsilon")), number(item.get("delta"))
    if epsilon is None or delta is None or epsilon < 0 or not 0 <= delta < 1:
        return _unguarded("ε or δ out of range")
    if item["kind"] == OTHER:
        return Event(OTHER, epsilon, delta, str(item.get("what", "")))
    sigma, rate = number(item.get("noise_multiplier")), number(item.get("sampling_rate"))
    steps, epochs = item.get("steps"), item.get("epochs")
    sampling = item.get("sampling")
    valid = (
        sigma is not None
        and sigma > 0
        and rate is not None
        and 0 < rate <= 1
        and isinstance(steps, int)
        and steps >= 1
        and 0 < delta < 1
        and item.get("accountant") in ("pld", "rdp")
        and (sampling == privacy.POISSON or (sampling == privacy.SHUFFLE and epochs))
    )
    if not valid or (epochs is not None and not (isinstance(epochs, int) and epochs >= 1)):
        return _unguarded("DP-SGD without a readable σ, q, T, δ")
    event = Event(
        DP_SGD,
        epsilon,
        delta,
        str(item.get("what", "DP-SGD")),
        sampling,
        sigma,
        rate,
        steps,
        epochs if sampling == privacy.SHUFFLE else None,
        item["accountant"],
        str(item.get("unit") or privacy.EXAMPLE),
    )
    return _checked(event, where)


def parse_stages(items: Any, where: str) -> tuple[Stage, ...]:
    """A ledger from JSON (each DP-SGD ε recomputed; `LedgerError` below it)."""
    if not isinstance(items, Sequence) or isinstance(items, str):
        raise LedgerError(f"{where}: its ledger is not a list of stages; export it again.")
    stages = []
    for index, item in enumerate(items):
        item = item if isinstance(item, Mapping) else {}
        corpora = item.get("corpora")
        corpora = (
            [c for c in corpora if isinstance(c, Mapping)] if isinstance(corpora, list) else []
        )
        events = item.get("events") if isinstance(item.get("events"), list) else []
        parsed = tuple(parse_event(e, f"{where}, stage {index}") for e in events)
        private = item.get("private") is True
        stages.append(
            Stage(
                tuple({k: str(v) for k, v in c.items()} for c in corpora),
                private,
                item.get("declared_disjoint") is True,
                parsed if (parsed or private) else (_unguarded("trained without DP"),),
            )
        )
    return tuple(stages)


def _record_accountant(record: Mapping[str, Any]) -> str | None:
    return next((a for k, a in _ACCOUNTANTS.items() if k in str(record.get("bound"))), None)


def dp_sgd_of_record(record: Mapping[str, Any]) -> Event | None:
    """The DP-SGD event a run's "privacy" record states (σ, q = L/N, T, δ), or None.

    None when the record lacks one of them (records written without them:
    then its written total is all that is known).
    """
    sigma, delta = number(record.get("noise_multiplier")), number(record.get("dp_sgd_delta"))
    lot, size = number(record.get("expected_lot_size")), number(record.get("dataset_size"))
    steps, epsilon = record.get("steps_planned"), number(record.get("dp_sgd_epsilon"))
    accountant, sampling = _record_accountant(record), record.get("sampling")
    if None in (sigma, delta, lot, size, epsilon, accountant) or not isinstance(steps, int):
        return None
    if not (sigma > 0 and 0 < lot <= size and steps >= 1 and 0 < delta < 1):
        return None
    epochs = None
    if sampling == privacy.SHUFFLE:
        epochs = max(1, math.ceil(steps / max(1, int(size) // int(lot))))
    elif sampling != privacy.POISSON:
        return None
    unit = (record.get("privacy_unit") or {}).get("unit") or privacy.EXAMPLE
    return Event(
        DP_SGD,
        epsilon,
        delta,
        "DP-SGD",
        sampling,
        sigma,
        lot / size,
        steps,
        epochs,
        accountant,
        unit,
    )


def _totals(record: Mapping[str, Any]) -> tuple[float | None, float | None]:
    delta = record["total_delta"] if "total_delta" in record else record.get("dp_sgd_delta")
    return number(record.get("total_epsilon")), number(delta)


def stage_of_record(
    record: Mapping[str, Any],
    corpora: Sequence[Mapping[str, str]] = (),
    *,
    declared: bool = False,
    vocabulary: tuple[float, float] | None = None,
    where: str = "the export's privacy record",
) -> Stage:
    """A run's own stage from its results.json "privacy" record.

    Args:
      record: the record.
      corpora: its training corpora (`corpus_record.training_corpora`).
      declared: its data were declared disjoint from every earlier stage's.
      vocabulary: the (ε, δ) its vocabulary spent, when known exactly; None:
        the record's total beyond its DP-SGD when it composed no earlier
        export (its vocabulary and nothing else), else its vocabulary as written.
      where: what the refusal names.

    Raises:
      LedgerError: its total is below its own DP-SGD ε recomputed from its σ, q, T, δ.
    """
    corpora = tuple(dict(c) for c in corpora)
    epsilon, delta = _totals(record)
    why = None
    if record.get("private") is not True:
        why = "it was trained without DP"
    elif epsilon is None or epsilon < 0:
        why = f"its record's total_epsilon={record.get('total_epsilon')!r} is not a number >= 0"
    elif delta is None or not 0 <= delta < 1:
        why = f"its record's total_delta={record.get('total_delta')!r} is not a number in [0, 1)"
    elif math.isinf(epsilon):
        why = f"its total ε is ∞: {record.get('composition', 'no guarantee')}"
    if why is not None:
        return Stage(corpora, record.get("private") is True, declared, (_unguarded(why),))
    sgd = dp_sgd_of_record(record)
    if sgd is None:  # Only its total is known: one event of that (ε, δ).
        return Stage(corpora, True, declared, (Event(OTHER, epsilon, delta, RECORD_TOTAL),))
    sgd = _checked(sgd, where)
    if vocabulary is None:
        parent = record.get("pretrained") or {}
        if parent.get("dpnmt_export") and (parent.get("composed") or parent.get("parallel")):
            written = record.get("vocabulary") or {}
            vocabulary = (number(written.get("epsilon")) or 0.0, number(written.get("delta")))
            vocabulary = (vocabulary[0], vocabulary[1] or 0.0)
        else:
            vocabulary = (epsilon - sgd.epsilon, delta - sgd.delta)
    if vocabulary[0] < -(RELATIVE_TOLERANCE * sgd.epsilon + ABSOLUTE_TOLERANCE) or (
        epsilon < sgd.epsilon + vocabulary[0] - RELATIVE_TOLERANCE * epsilon - ABSOLUTE_TOLERANCE
    ):
        raise LedgerError(
            f"{where}: its total_epsilon {epsilon:.6g} is below its own DP-SGD ε {sgd.epsilon:.6g} "
            f"recomputed from its σ={sgd.noise_multiplier:g}, q={sgd.sampling_rate:g}, "
            f"T={sgd.steps}, δ={sgd.delta:g} (an edited or corrupted dpnmt.json): refused, "
            "never used to lower the total. Export that run again (python -m dpnmt.export), "
            "or start from another model."
        )
    events = [sgd]
    if vocabulary[0] > 0 or vocabulary[1] > 0:
        events.append(Event(OTHER, max(0.0, vocabulary[0]), max(0.0, vocabulary[1]), "vocabulary"))
    return Stage(corpora, True, declared, tuple(events))


def lineage_of_record(
    record: Mapping[str, Any] | None, corpora: Sequence[Mapping[str, str]] = ()
) -> tuple[Stage, ...]:
    """The stages of an export written before the ledger: its record and the records it embeds.

    A record's `pretrained` claim holds its starting export's ledger (a claim
    written with one) or that export's own record (older): read the same way.
    An export without a record: one stage with no guarantee.
    """
    if not isinstance(record, Mapping):
        return (Stage(tuple(dict(c) for c in corpora), False, False, (_unguarded("no record"),)),)
    parent = record.get("pretrained")
    earlier: tuple[Stage, ...] = ()
    declared = False
    if isinstance(parent, Mapping) and parent.get("dpnmt_export"):
        declared = parent.get("declared_disjoint") is True
        if parent.get(KEY) is not None:
            earlier = parse_stages(parent[KEY], "its starting export's ledger")
        else:
            earlier = lineage_of_record(parent.get("record"))
    return (*earlier, stage_of_record(record, corpora, declared=declared))
