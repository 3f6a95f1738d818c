"""What a pretrained starting model adds to a run's ε: a dpnmt export's own privacy record.

A dpnmt export (`dpnmt.release.export_run`) holds its run's privacy report in
its `dpnmt.json`. Fine-tuning it on private data that may overlap its own
training data is a second use of those examples: its total (ε, δ) composes
with this run's (basic composition), unless the user declares the two
datasets disjoint (`model.pretrained_data_disjoint=True`), and the report
says which. Declared disjoint, an export trained with DP (its record private)
composes in parallel: the total (ε, δ) is the larger of its own and this
run's (`parallel_by_export`, `composition_rules.parallel_total`; ∞ without a
finite ε: a private run refuses it). Declared disjoint, an export trained
without DP (a public stage) is not composed: its data are outside the report.
An export without a finite guarantee (a non-private run, a
vocabulary learnt without DP, an export from before dpnmt wrote the record)
would make the total ∞: a private run refuses it unless declared disjoint.
Models that are not dpnmt exports (a hub id, another `save_pretrained`
folder) carry no record: their own training data are outside the report.
"""

import json
import logging
import math
from typing import Any

from dpnmt.config import RunConfig
from dpnmt.errors import ConfigError
from dpnmt.training.privacy_report import PretrainedClaim
from dpnmt.training.run_dir import PRETRAINED_FILE, RunDir

SETTINGS_FILE = "dpnmt.json"  # Written by dpnmt.release.export_run.
PRIVACY_KEY = "privacy"  # Its key holding the exported run's privacy report.
DISJOINT_FIELD = "model.pretrained_data_disjoint"
_DECLARED = f"pretrained on data declared disjoint from this run's ({DISJOINT_FIELD}=True)"
DISJOINT_NOTE = (
    f"{_DECLARED}, and trained without DP (its record is not private): its training data "
    "have no guarantee here; its ε is not composed; its own record is kept here"
)
NO_RECORD_NOTE = (
    f"{_DECLARED}: it records no privacy guarantee, so its training data have none here; "
    "its ε is not composed"
)
PARALLEL_NOTE = (
    f"{_DECLARED}, and trained with DP on its own (private) data: parallel composition, the "
    "total is the larger of its (ε, δ) and this run's; its own record is kept here"
)

_OVERLAPPING = (
    f"{DISJOINT_FIELD}=True refused: the export's recorded training corpora include this run's"
)
_UNBOUNDED = (
    "a dpnmt export without a finite privacy guarantee (or record) on its own training data, "
    f"which may overlap this run's: composed, the total ε is ∞ ({DISJOINT_FIELD} not set)"
)


def shared_unit(run: RunConfig) -> str:
    """What disjoint training data must share none of: the run's privacy unit.

    With `dp.unit="group"` the neighbour is one whole group, so the declaration
    holds only if no group (user, document) has pairs in both datasets:
    disjoint sentence pairs of one user are not enough.
    """
    if run.dp.unit == "group":
        return "group (user or document: no group has pairs in both)"
    return "example"


class RecordUnreadable(OSError):
    """Whether the starting model is a dpnmt export cannot be known (its dpnmt.json unreadable)."""


def read_export_record(name_or_path: str) -> tuple[bool, dict[str, Any] | None]:
    """(whether `name_or_path` is a dpnmt export, its privacy record or None).

    As `read_export_settings`, the record alone.
    """
    is_export, settings = read_export_settings(name_or_path)
    record = (settings or {}).get(PRIVACY_KEY)
    return is_export, record if isinstance(record, dict) else None


def read_export_settings(name_or_path: str) -> tuple[bool, dict[str, Any] | None]:
    """(whether `name_or_path` is a dpnmt export, its whole dpnmt.json or None).

    `name_or_path` is found as the model is loaded: a local folder, else a hub
    id through the local cache or the hub (`models.pretrained.find_file`). A
    model with `dpnmt.json` is a dpnmt export; its record is None when the file
    holds none (exported before dpnmt wrote it) or cannot be parsed.

    Raises:
      RecordUnreadable: whether the model has a `dpnmt.json` cannot be known (a
        hub id neither cached nor reachable); never read as "not an export".
    """
    from dpnmt.models.pretrained import find_file  # noqa: PLC0415 - flax only when needed.

    try:
        path = find_file(name_or_path, SETTINGS_FILE)
    except OSError as error:
        raise RecordUnreadable(str(error)) from error
    except ValueError:  # Neither a folder nor a hub id: no model loads from it (named there).
        return False, None
    if path is None:
        return False, None
    try:
        with open(path, encoding="utf-8") as f:
            settings = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return True, None
    return True, settings if isinstance(settings, dict) else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None  # JSON true/false: not a number, though float() takes it.
    try:
        return float(value)  # write_json stores inf as "inf".
    except (TypeError, ValueError):
        return None


def _epsilon_delta(record: dict[str, Any]) -> tuple[Any, Any]:
    """The record's total ε and δ as written (δ: DP-SGD's when it has no total)."""
    delta = record["total_delta"] if "total_delta" in record else record.get("dp_sgd_delta")
    return record.get("total_epsilon"), delta


def _left_out(record: dict[str, Any]) -> tuple[float, float]:
    """(ε, δ) of the record's own starting export when its total leaves them out.

    An export trained from an earlier dpnmt export declared disjoint from its
    data did not compose that export's ε; a later run whose data may overlap
    either stage's must (0 -> 1 (disjoint) -> 2: stage 0's ε counts for 2).
    (inf, 0) when that export gave no finite ε; (0, 0) when there is none.
    """
    parent = record.get("pretrained")
    if not isinstance(parent, dict) or not parent.get("dpnmt_export"):
        return 0.0, 0.0
    if parent.get("composed") or parent.get("parallel"):  # Already in the record's total.
        return 0.0, 0.0
    epsilon, delta = _number(parent.get("epsilon")), _number(parent.get("delta"))
    if epsilon is None or math.isnan(epsilon) or epsilon < 0:
        return math.inf, 0.0
    return epsilon, delta if delta is not None and 0 <= delta < 1 else 1.0


def _own_defect(record: dict[str, Any]) -> str | None:
    """Why `record`'s own total gives no finite (ε, δ), its starting export aside; or None."""
    if record.get("private") is not True:
        return "it was trained without DP"
    epsilon_text, delta_text = _epsilon_delta(record)
    epsilon, delta = _number(epsilon_text), _number(delta_text)
    # A corrupted record must not lower the total: only ε >= 0 and 0 <= δ < 1 count.
    if epsilon is None or math.isnan(epsilon) or epsilon < 0:
        return f"its record's total_epsilon={epsilon_text!r} is not a number >= 0"
    if delta is None or math.isnan(delta) or not 0 <= delta < 1:
        return f"its record's total_delta={delta_text!r} is not a number in [0, 1)"
    if math.isinf(epsilon):
        return f"its total ε is ∞: {record.get('composition', 'no guarantee')}"
    return None


def _defect(record: dict[str, Any]) -> str | None:
    """Why `record` gives no finite (ε, δ) (a few words), or None when it gives one."""
    why = _own_defect(record)
    if why is not None:
        return why
    delta = float(_number(_epsilon_delta(record)[1]))
    parent_epsilon, parent_delta = _left_out(record)
    if math.isinf(parent_epsilon) or delta + parent_delta >= 1:
        return (
            "it started from a model declared disjoint from its data that has no finite "
            "privacy guarantee of its own, and this run's data may overlap that model's"
        )
    return None


def claimed_by_export(record: dict[str, Any]) -> tuple[float, float | None]:
    """(ε, δ) an export claims on its own training data; (inf, None) without a finite guarantee.

    No finite guarantee: a non-private run, ε = ∞, or a record out of range
    (ε < 0 or NaN, δ missing, NaN or outside [0, 1)). A record whose own starting
    export was declared disjoint adds that export's (ε, δ) (`_left_out`).
    """
    if _defect(record) is not None:
        return math.inf, None
    epsilon, delta = _epsilon_delta(record)
    parent_epsilon, parent_delta = _left_out(record)
    return float(epsilon) + parent_epsilon, float(delta) + parent_delta


def parallel_by_export(record: dict[str, Any]) -> tuple[float, float | None]:
    """(ε, δ) a private export gives the people in its own training data; (inf, None): none.

    What parallel composition takes the max of (`composition_rules.parallel_total`):
    the record's own total, and, when that export itself started from an
    earlier private export declared disjoint without taking the max (a record
    from before parallel composition), that one's too. An earlier export
    trained without DP (a public stage) stays outside, as it was there.
    """
    if _own_defect(record) is not None:
        return math.inf, None
    epsilon, delta = (float(_number(v)) for v in _epsilon_delta(record))
    parent = record.get("pretrained")
    if (
        isinstance(parent, dict)
        and parent.get("dpnmt_export")
        and not parent.get("composed")
        and not parent.get("parallel")
        and (parent.get("record") or {}).get("private") is True
    ):
        parent_epsilon, parent_delta = _number(parent.get("epsilon")), _number(parent.get("delta"))
        if parent_epsilon is None or math.isnan(parent_epsilon) or parent_epsilon < 0:
            return math.inf, None
        if parent_delta is None or not 0 <= parent_delta < 1:
            return math.inf, None
        epsilon, delta = max(epsilon, parent_epsilon), max(delta, parent_delta)
    return epsilon, delta


def _adjacency(record: dict[str, Any] | None) -> str | None:
    value = (record or {}).get("adjacency")
    return value if isinstance(value, str) else None


def _decide(run: RunConfig) -> tuple[PretrainedClaim | None, str | None]:
    """(the claim, the one-line problem a private run is refused with, or None).

    With a problem, the claim composes ε = ∞ (what the run could claim).
    """
    name = run.model.name_or_path
    declared = bool(run.model.pretrained_data_disjoint)
    if name is None:
        if declared:
            return None, (
                f"{DISJOINT_FIELD}=True declares a pretrained model's training data disjoint "
                "from this run's, but model.name_or_path is unset; drop the declaration."
            )
        return None, None
    try:
        is_export, settings = read_export_settings(name)
    except RecordUnreadable as error:
        return _unreadable(name, declared, run.dp.enabled, error, shared_unit(run))
    if not is_export:
        from dpnmt.models import export_record  # noqa: PLC0415 - flax only when needed.

        lost = export_record.missing_record_problem(name, "model.name_or_path")
        if lost is not None:  # Any run: its ε would be dropped, never composed.
            return PretrainedClaim(True, True, declared, math.inf, None, _UNBOUNDED), lost
        note = (
            f"not a dpnmt export (no {SETTINGS_FILE} privacy record): its own training data "
            "are outside this report"
        )
        return PretrainedClaim(False, False, declared, None, None, note), None
    record = (settings or {}).get(PRIVACY_KEY)
    record = record if isinstance(record, dict) else None
    epsilon, delta = (math.inf, None) if record is None else claimed_by_export(record)

    def claim(
        composed: bool, epsilon: float, delta: float | None, note: str, parallel: bool = False
    ) -> PretrainedClaim:
        return PretrainedClaim(
            True, composed, declared, epsilon, delta, note, record, _adjacency(record), parallel
        )

    if declared and run.dp.enabled:
        from dpnmt.data import corpus_record  # noqa: PLC0415 - datasets only when needed.

        where = _declared_where(name)
        overlap = corpus_record.same_corpus_problems(settings, run.data, where)
        if overlap:
            return claim(True, epsilon, delta, _OVERLAPPING), overlap[0]
    if declared and record is not None and record.get("private") is True:
        epsilon, delta = parallel_by_export(record)
        parallel = claim(False, epsilon, delta, PARALLEL_NOTE, parallel=True)
        if run.dp.enabled and math.isinf(epsilon):
            why = _own_defect(record) or "its own starting export's ε is not finite"
            problem = (
                f"model.name_or_path={name!r} is a dpnmt export trained with DP on its own "
                f"(private) data but with no finite guarantee on them ({why}): "
                f"declared disjoint ({DISJOINT_FIELD}=True), the total is the larger of its ε "
                "and this run's (parallel composition), ∞. Start from another model, or train "
                "and export that stage again with a finite ε."
            )
            return parallel, problem
        return parallel, None
    if declared:
        note = NO_RECORD_NOTE if record is None else DISJOINT_NOTE
        return claim(False, epsilon, delta, note), None
    if not run.dp.enabled:
        note = "non-private run (ε = ∞): the export's ε is not composed"
        return claim(False, epsilon, delta, note), None
    fix = (
        f"If its training data share no {shared_unit(run)} with this run's (e.g. public text), set "
        f"{DISJOINT_FIELD}=True (the report then says so)"
    )
    if record is None:
        problem = (
            f"model.name_or_path={name!r} is a dpnmt export without a privacy record in its "
            f"{SETTINGS_FILE} (exported before dpnmt wrote one): its ε cannot be composed with "
            f"this run's. Export its run again (python -m dpnmt.export), or: {fix}."
        )
        return claim(True, math.inf, None, _UNBOUNDED), problem
    why = _defect(record)
    if why is not None:
        problem = (
            f"model.name_or_path={name!r} has no privacy guarantee on its own training data "
            f"({why}), and they may include this run's examples: the composed ε would be ∞. "
            f"{fix}; else start from another model."
        )
        return claim(True, math.inf, None, _UNBOUNDED), problem
    note = (
        "the export's own total (ε, δ) composed with this run's: its training data may overlap "
        f"this run's (set {DISJOINT_FIELD}=True if they share no {shared_unit(run)})"
    )
    return claim(True, epsilon, delta, note), None


def _declared_where(name: str) -> str:
    return (
        f"{DISJOINT_FIELD}=True declares model.name_or_path={name!r}'s training data disjoint "
        "from this run's"
    )


def declared_text_problems(run: RunConfig, corpus) -> list[str]:
    """A disjoint declaration refused from the corpus text (`corpus_record.same_text_problems`).

    Only a private run declaring its starting dpnmt export disjoint, whose
    dpnmt.json records its training corpora (older exports and other models:
    the declaration stays the user's word). `training.preflight.check_run`
    asks it before anything is written.

    Args:
      run: the run's config.
      corpus: its corpus as trained on (`training.pieces.load_corpus`).
    """
    name = run.model.name_or_path
    if name is None or not run.dp.enabled:
        return []
    if not run.model.pretrained_data_disjoint:
        return []
    try:
        is_export, settings = read_export_settings(name)
    except RecordUnreadable:
        return []  # Declared: accepted without a record (`_unreadable`).
    if not is_export:
        return []
    from dpnmt.data import corpus_record  # noqa: PLC0415 - datasets only when needed.

    return corpus_record.same_text_problems(settings, run.data, corpus, _declared_where(name))


def _unreadable(
    name: str, declared: bool, private: bool, error: Exception, unit: str
) -> tuple[PretrainedClaim, str | None]:
    """The claim (and a private run's problem) when the model's dpnmt.json cannot be read.

    Unknown is never "not an export": an export trained on private data would
    then go uncounted. Its note is published: no error text (it may hold paths).
    """
    unknown = f"its {SETTINGS_FILE} could not be read (hub unreachable, not cached)"
    if declared:
        note = f"{_DECLARED}: its ε is not composed; {unknown}, so no record is kept"
        return PretrainedClaim(False, False, True, None, None, note), None
    if not private:
        note = f"non-private run (ε = ∞); whether it is a dpnmt export is unknown: {unknown}"
        return PretrainedClaim(False, False, False, None, None, note), None
    problem = (
        f"model.name_or_path={name!r}: cannot read the model's {SETTINGS_FILE} to know whether "
        "it was trained on private data (a dpnmt export's own ε composes with this run's). "
        "Make it reachable: fetch it once online (huggingface_hub.hf_hub_download(repo, "
        f"'{SETTINGS_FILE}') also records its absence in the Hugging Face cache), or use the "
        f"model's local folder. Only if its training data share no {unit} with this run's, "
        f"set {DISJOINT_FIELD}=True instead (the published report then says so). {error}"
    )
    note = f"{unknown}: the model may be a dpnmt export with no finite ε on overlapping data"
    return PretrainedClaim(False, True, False, math.inf, None, note), problem


def pretrained_problems(run: RunConfig) -> list[str]:
    """The problem of the starting model's privacy record, as a list of at most one line."""
    problem = _decide(run)[1]
    return [problem] if problem else []


def pretrained_claim(run: RunConfig, *, refuse: bool = True) -> PretrainedClaim | None:
    """What the starting model adds to the run's ε (None: trained from scratch).

    Args:
      run: the run's config (`model.name_or_path`, `model.pretrained_data_disjoint`).
      refuse: raise on a problem; False (re-reporting a trained run: decode,
        export) gives the claim that composes ε = ∞, its note the problem.

    Raises:
      ConfigError: `refuse` and the config would be refused (`pretrained_problems`).
    """
    claim, problem = _decide(run)
    if problem and refuse:
        raise ConfigError(problem)
    return claim


def claim_at_start(run: RunConfig, run_dir: RunDir, *, resuming: bool) -> PretrainedClaim | None:
    """The claim a session trains under: the one recorded when the run started, when resuming.

    A fresh run (no checkpoint) reads the starting model's record now
    (`pretrained_claim`, refusing as `training.preflight` does); the caller records
    it (`RunDir.write_pretrained`). A resumed run keeps the recorded claim: the
    base model's folder or hub repo may have changed since. A resumed run from
    before the record was written reads it now, and says so.
    """
    if run.model.name_or_path is not None and resuming:
        recorded = run_dir.read_pretrained()
        if recorded is not None:
            return PretrainedClaim.from_json(recorded)
        _warn_unrecorded(run_dir.path, run)
    return pretrained_claim(run)


def recorded_claim(run: RunConfig, workdir: str) -> PretrainedClaim | None:
    """The claim a trained run recorded when it started (decode, a checkpoint-only export).

    Never the base model's record read again: replaced since, it would change
    the published ε (even lower it). A workdir from before the record was
    written falls back to reading it now (`pretrained_claim(refuse=False)`),
    with a warning.
    """
    if run.model.name_or_path is None:
        return None
    recorded = RunDir(workdir).read_pretrained()
    if recorded is not None:
        return PretrainedClaim.from_json(recorded)
    _warn_unrecorded(workdir, run)
    return pretrained_claim(run, refuse=False)


def _warn_unrecorded(workdir: str, run: RunConfig) -> None:
    logging.warning(
        "%s has no %s (a run from before dpnmt recorded the starting model's privacy claim): "
        "reading model.name_or_path=%r's %s now. If that model changed since the run started, "
        "the reported ε is not the one the run trained under.",
        workdir,
        PRETRAINED_FILE,
        run.model.name_or_path,
        SETTINGS_FILE,
    )
