"""An export's ledger, read back only where its own privacy record gives the same stages.

An export's dpnmt.json holds its run's privacy record ("privacy") and the
ledger written from it ("ledger", `release.export_settings`). The ledger is
what a later run composes, so an edited one would lower that run's ε: drop a
stage, rename its corpus, replace its events, mark it declared disjoint.
`of_export` rebuilds the stages from the record exactly as the export wrote
them (`stages_of_record`) and refuses a ledger that differs, or whose worst
class is below the total its record reports. `dpnmt.report --runs` asks the
same of a run's report (`report_problem`): its starting export's stages
against the record it embeds. Both copies can still be rewritten together
with every number they hold: the check binds the ledger to the record, it
does not authenticate the record.
"""

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from dpnmt.training import ledger, ledger_report
from dpnmt.training.ledger import LedgerError, Stage

CONTRADICTS = "contradicts its privacy record"  # In every refusal, for the tests and the report.
_FIX = "Export that run again (python -m dpnmt.export), or start from another model."


def stages_of_record(
    record: Mapping[str, Any], corpora: Sequence[Mapping[str, str]]
) -> tuple[Stage, ...]:
    """The ledger an export of a run with this "privacy" record and corpora holds.

    The record's own ledger (a run from a dpnmt export), its last stage given
    the run's corpora; else the record's lineage (`ledger.lineage_of_record`).

    Raises:
      LedgerError: the record claims less than its own σ, q, T, δ give.
    """
    if record.get(ledger.KEY) is not None:
        *earlier, own = ledger.parse_stages(record[ledger.KEY]["stages"], "its record's ledger")
        return (*earlier, dataclasses.replace(own, corpora=tuple(dict(c) for c in corpora)))
    return ledger.lineage_of_record(record, corpora)


def _problem(
    written: Sequence[Stage],
    record: Mapping[str, Any],
    corpora: Sequence[Mapping[str, str]] | None,
) -> str | None:
    """Why `written` is not the ledger `record` gives (None: it is).

    `corpora` None: the written last stage's (a report holds no export's corpora).
    """
    if corpora is None:
        corpora = written[-1].corpora if written else ()
    derived = stages_of_record(record, corpora)
    if [s.to_json() for s in derived] != [s.to_json() for s in written]:
        return (
            f"its ledger ({len(written)} stage(s)) {CONTRADICTS} ({len(derived)} stage(s) "
            "rebuilt from it: a stage's corpora, flag or events differ)"
        )
    total = ledger.number(record.get("total_epsilon"))
    if record.get(ledger.KEY) is None or record.get("private") is not True or total is None:
        return None  # An older record: the stages above are its own numbers.
    worst = ledger_report.class_totals(written).epsilon
    if math.isfinite(total) and worst < total * (1 - ledger.RELATIVE_TOLERANCE) - (
        ledger.ABSOLUTE_TOLERANCE
    ):
        return (
            f"its ledger's worst class ε {worst:.6g} is below the total {total:.6g} it "
            f"reported: the ledger {CONTRADICTS}"
        )
    return None


def of_export(settings: Mapping[str, Any] | None, corpora_key: str) -> tuple[Stage, ...]:
    """An export's ledger: its "ledger" checked against its record, else its record's lineage.

    Args:
      settings: its whole dpnmt.json.
      corpora_key: dpnmt.json's key of its training corpora (`corpus_record.KEY`).

    Raises:
      LedgerError: its ledger differs from the one its record gives, claims less
        than the record's total, or has no record to be checked against; or the
        record claims less than its own σ, q, T, δ give.
    """
    settings = settings or {}
    corpora = settings.get(corpora_key)
    corpora = [c for c in corpora if isinstance(c, Mapping)] if isinstance(corpora, list) else []
    record = settings.get("privacy")
    record = record if isinstance(record, Mapping) else None
    if settings.get(ledger.KEY) is None:  # Written before the ledger: its record's lineage.
        return ledger.lineage_of_record(record, corpora)
    if record is None:
        raise LedgerError(
            f"the export's ledger has no privacy record to be checked against. {_FIX}"
        )
    stages = ledger.parse_stages(settings[ledger.KEY], "the export's ledger")
    problem = _problem(stages, record, corpora)
    if problem is not None:
        raise LedgerError(f"the export's dpnmt.json: {problem} (an edited dpnmt.json). {_FIX}")
    return stages


def report_problem(privacy: Mapping[str, Any]) -> str | None:
    """Why a run's report composed a starting export's ledger its embedded record denies.

    Args:
      privacy: a run's results.json "privacy" object with a "ledger".

    Returns:
      None when its earlier stages are the claim's and the ones the export's
      record (its `pretrained.record`) gives, and its own stage is declared as
      the claim says; or when it embeds no record to compare.
    """
    pretrained = privacy.get("pretrained")
    record = pretrained.get("record") if isinstance(pretrained, Mapping) else None
    if not isinstance(record, Mapping):
        return None
    try:
        *written, own = ledger.parse_stages(privacy[ledger.KEY]["stages"], "the report's ledger")
        claimed = ledger.parse_stages(pretrained.get(ledger.KEY) or [], "the claim's ledger")
        if [s.to_json() for s in claimed] != [s.to_json() for s in written] or (
            own.declared_disjoint != (pretrained.get("declared_disjoint") is True)
        ):
            return "the report's ledger is not its pretrained claim's (an edited results.json)"
        problem = _problem(written, record, None)
    except (LedgerError, KeyError, TypeError, ValueError) as error:
        return f"its ledger is unreadable: {error}"
    return None if problem is None else f"the starting export's {problem}"
