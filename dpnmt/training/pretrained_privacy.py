"""What a pretrained starting model adds to a run's ε: a dpnmt export's own privacy record.

A dpnmt export (`dpnmt.release.export_run`) holds its run's privacy report in
its `dpnmt.json`. Fine-tuning it on private data that may overlap its own
training data is a second use of those examples: its total (ε, δ) composes
with this run's (basic composition), unless the user declares the two
datasets disjoint (`model.pretrained_data_disjoint=True`), and the report
says which. An export without a finite guarantee (a non-private run, a
vocabulary learnt without DP, an export from before dpnmt wrote the record)
would make the total ∞: a private run refuses it unless declared disjoint.
Models that are not dpnmt exports (a hub id, another `save_pretrained`
folder) carry no record: their own training data are outside the report.
"""

import json
import math
import os
from typing import Any

import ml_collections

from dpnmt.errors import ConfigError
from dpnmt.training.privacy_report import PretrainedClaim

SETTINGS_FILE = "dpnmt.json"  # Written by dpnmt.release.export_run.
PRIVACY_KEY = "privacy"  # Its key holding the exported run's privacy report.
DISJOINT_FIELD = "model.pretrained_data_disjoint"
DISJOINT_NOTE = (
    f"pretrained on data declared disjoint from this run's ({DISJOINT_FIELD}=True): its ε is "
    "not composed; its own record is kept here"
)

_UNBOUNDED = (
    "a dpnmt export without a finite privacy guarantee (or record) on its own training data, "
    f"which may overlap this run's: composed, the total ε is ∞ ({DISJOINT_FIELD} not set)"
)


def read_export_record(name_or_path: str) -> tuple[bool, dict[str, Any] | None]:
    """(whether `name_or_path` is a local dpnmt export, its privacy record or None).

    A folder with `dpnmt.json` is a dpnmt export; its record is None when the
    file holds none (exported before dpnmt wrote it) or cannot be read.
    """
    path = os.path.join(os.path.expanduser(name_or_path), SETTINGS_FILE)
    if not os.path.isfile(path):
        return False, None
    try:
        with open(path, encoding="utf-8") as f:
            settings = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return True, None
    record = settings.get(PRIVACY_KEY) if isinstance(settings, dict) else None
    return True, record if isinstance(record, dict) else None


def _number(value: Any) -> float | None:
    try:
        return float(value)  # write_json stores inf as "inf".
    except (TypeError, ValueError):
        return None


def claimed_by_export(record: dict[str, Any]) -> tuple[float, float | None]:
    """(ε, δ) an export claims on its own training data; ε = inf without a guarantee."""
    epsilon = _number(record.get("total_epsilon"))
    delta = _number(record.get("total_delta"))
    if delta is None:
        delta = _number(record.get("dp_sgd_delta"))
    if record.get("private") is not True or epsilon is None or math.isnan(epsilon):
        epsilon = math.inf
    return epsilon, delta


def _decide(config: ml_collections.ConfigDict) -> tuple[PretrainedClaim | None, str | None]:
    """(the claim, the one-line problem a private run is refused with, or None).

    With a problem, the claim composes ε = ∞ (what the run could claim).
    """
    name = config.model.name_or_path
    declared = bool(config.model.get("pretrained_data_disjoint", False))
    if name is None:
        if declared:
            return None, (
                f"{DISJOINT_FIELD}=True declares a pretrained model's training data disjoint "
                "from this run's, but model.name_or_path is unset; drop the declaration."
            )
        return None, None
    is_export, record = read_export_record(name)
    if not is_export:
        note = (
            f"not a dpnmt export (no {SETTINGS_FILE} privacy record): its own training data "
            "are outside this report"
        )
        return PretrainedClaim(False, False, declared, None, None, note), None
    epsilon, delta = (math.inf, None) if record is None else claimed_by_export(record)
    if declared:
        return PretrainedClaim(True, False, True, epsilon, delta, DISJOINT_NOTE, record), None
    if not config.dp.enabled:
        note = "non-private run (ε = ∞): the export's ε is not composed"
        return PretrainedClaim(True, False, False, epsilon, delta, note, record), None
    fix = (
        f"If its training data share no example with this run's (e.g. public text), set "
        f"{DISJOINT_FIELD}=True (the report then says so)"
    )
    if record is None:
        problem = (
            f"model.name_or_path={name!r} is a dpnmt export without a privacy record in its "
            f"{SETTINGS_FILE} (exported before dpnmt wrote one): its ε cannot be composed with "
            f"this run's. Export its run again (python -m dpnmt.export), or: {fix}."
        )
        return PretrainedClaim(True, True, False, math.inf, None, _UNBOUNDED, None), problem
    if math.isinf(epsilon):
        why = (
            "it was trained without DP"
            if record.get("private") is not True
            else f"its total ε is ∞: {record.get('composition', 'no guarantee')}"
        )
        problem = (
            f"model.name_or_path={name!r} has no privacy guarantee on its own training data "
            f"({why}), and they may include this run's examples: the composed ε would be ∞. "
            f"{fix}; else start from another model."
        )
        return PretrainedClaim(True, True, False, math.inf, delta, _UNBOUNDED, record), problem
    note = (
        "the export's own total (ε, δ) composed with this run's: its training data may overlap "
        f"this run's (set {DISJOINT_FIELD}=True if they share no example)"
    )
    return PretrainedClaim(True, True, False, epsilon, delta, note, record), None


def pretrained_problems(config: ml_collections.ConfigDict) -> list[str]:
    """The problem of the starting model's privacy record, as a list of at most one line."""
    problem = _decide(config)[1]
    return [problem] if problem else []


def pretrained_claim(
    config: ml_collections.ConfigDict, *, refuse: bool = True
) -> PretrainedClaim | None:
    """What the starting model adds to the run's ε (None: trained from scratch).

    Args:
      config: the run's config (`model.name_or_path`, `model.pretrained_data_disjoint`).
      refuse: raise on a problem; False (re-reporting a trained run: decode,
        export) gives the claim that composes ε = ∞, its note the problem.

    Raises:
      ConfigError: `refuse` and the config would be refused (`pretrained_problems`).
    """
    claim, problem = _decide(config)
    if problem and refuse:
        raise ConfigError(problem)
    return claim
