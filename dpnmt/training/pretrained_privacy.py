"""What a pretrained starting model adds to a run's ε: a dpnmt export's privacy ledger.

A dpnmt export (`dpnmt.release.export_run`) holds its run's privacy report
and its whole lineage's ledger (`training.ledger`) in its `dpnmt.json`.
Fine-tuning it on private data that may overlap any stage's data composes
this run's events with every stage's people (`ledger_report`), unless the
user declares this run's data disjoint from every stage of the lineage
(`model.pretrained_data_disjoint=True`, checked against each stage's
recorded corpora): then this run's people are a group of their own and the
total is the worst group (parallel composition). A lineage with no finite
guarantee for someone this run may touch (a non-private stage, ε = ∞, an
export from before dpnmt wrote the record) is refused in a private run; a
record or ledger claiming less than its own σ, q, T, δ give is refused.
Models that are not dpnmt exports (a hub id, another `save_pretrained`
folder) carry no record: their own training data are outside the report.
"""

import json
import logging
import math
from typing import Any

from dpnmt.config import RunConfig
from dpnmt.errors import ConfigError
from dpnmt.training import ledger, ledger_check, ledger_report
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


def _adjacency(record: dict[str, Any] | None) -> str | None:
    value = (record or {}).get("adjacency")
    return value if isinstance(value, str) else None


def _stages(settings: dict[str, Any] | None) -> tuple[ledger.Stage, ...]:
    """The export's checked ledger (`ledger_check.of_export`); `LedgerError` else."""
    from dpnmt.data import corpus_record  # noqa: PLC0415 - datasets only when needed.

    return ledger_check.of_export(settings, corpus_record.KEY)


def _lineage_overlap(stages, run: RunConfig, name: str, same) -> list[str]:
    """The first stage of the lineage whose recorded corpora are this run's (`same`'s check).

    A private stage that records no corpora (an earlier stage of an export from
    before the ledger, rebuilt from the record it embeds) cannot be checked:
    refused, never passed as disjoint.
    """
    from dpnmt.data import corpus_record  # noqa: PLC0415 - datasets only when needed.

    for index, stage in enumerate(stages):
        if stage.private and not stage.corpora:
            return [
                f"{_declared_where(name)} and from every stage of its lineage, but stage "
                f"{index} of {len(stages)} trained with DP and its corpora are not recorded "
                "(an export from before dpnmt recorded them), so disjointness cannot be "
                f"checked: drop {DISJOINT_FIELD} (its ε is then composed with this run's)."
            ]
        names = [c.get("corpus") for c in stage.corpora]
        where = (
            f"{_declared_where(name)} and from every stage of its lineage (its dpnmt.json's "
            f"ledger: stage {index} of {len(stages)} trained on {names})"
        )
        problems = same({corpus_record.KEY: list(stage.corpora)}, where)
        if problems:
            return problems
    return []


def _unbounded_why(lineage: ledger_report.Composition) -> str:
    """Why an export's lineage gives someone no finite ε, in a few words (its last stage first)."""
    unbounded = [k for k in lineage.classes if k.unguarded]
    if not unbounded:
        return ledger_report.worst_class(lineage)
    last = unbounded[-1]
    if last.stage == len(lineage.stages) - 1:
        return last.unguarded
    names = ", ".join(last.corpora) or "corpora not recorded"
    return f"its lineage's stage {last.stage} ({names}): ε ∞, {last.unguarded}"


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
    from dpnmt.models import export_record  # noqa: PLC0415 - flax only when needed.

    lost = export_record.problem(name, "model.name_or_path")
    if lost is not None:  # Record lost or files changed: its ε would be dropped or wrong.
        return PretrainedClaim(True, True, declared, math.inf, None, _UNBOUNDED), lost
    if not is_export:
        note = (
            f"not a dpnmt export (no {SETTINGS_FILE} privacy record): its own training data "
            "are outside this report"
        )
        return PretrainedClaim(False, False, declared, None, None, note), None
    record = (settings or {}).get(PRIVACY_KEY)
    record = record if isinstance(record, dict) else None

    def claim(composed, epsilon, delta, note, parallel=False, stages=None) -> PretrainedClaim:
        return PretrainedClaim(
            True,
            composed,
            declared,
            epsilon,
            delta,
            note,
            record,
            _adjacency(record),
            parallel,
            stages,
        )

    try:
        stages = _stages(settings)
    except ledger.LedgerError as error:
        problem = f"model.name_or_path={name!r}: {error}"
        return claim(True, math.inf, None, _UNBOUNDED), problem if run.dp.enabled else None
    if declared:  # Private or not: the ledger records the declaration for every later run.
        from dpnmt.data import corpus_record  # noqa: PLC0415 - datasets only when needed.

        def same(recorded, where):
            return corpus_record.same_corpus_problems(recorded, run.data, where)

        overlap = _lineage_overlap(stages, run, name, same)
        if overlap:
            return claim(True, math.inf, None, _OVERLAPPING, stages=stages), overlap[0]
    lineage = ledger_report.class_totals(stages)
    if declared:  # This run's people are a class of their own: the lineage's classes stay.
        epsilon, delta = lineage.epsilon, lineage.delta
        if not any(k.counted for k in lineage.classes):
            note = NO_RECORD_NOTE if record is None else DISJOINT_NOTE
            return claim(False, epsilon, delta, note, stages=stages), None
        parallel = claim(False, epsilon, delta, PARALLEL_NOTE, True, stages)
        if run.dp.enabled and math.isinf(epsilon):
            problem = (
                f"model.name_or_path={name!r} is a dpnmt export with no finite guarantee on the "
                f"data of its lineage ({_unbounded_why(lineage)}): declared disjoint "
                f"({DISJOINT_FIELD}=True), the total is the worst of its stages and this run "
                "(parallel composition), ∞. Start from another model, or train and export the "
                "stage without DP again declared disjoint, or with DP."
            )
            return parallel, problem
        return parallel, None
    # Not declared: this run's people may be in any stage's data, each class composes this run.
    epsilon = max((k.epsilon for k in lineage.classes), default=0.0)
    delta = max((k.delta for k in lineage.classes), default=0.0)
    if not run.dp.enabled:
        note = "non-private run (ε = ∞): the export's ε is not composed"
        return claim(False, epsilon, delta, note, stages=stages), None
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
        return claim(True, math.inf, None, _UNBOUNDED, stages=stages), problem
    if math.isinf(epsilon):
        problem = (
            f"model.name_or_path={name!r} has no privacy guarantee on its own training data "
            f"({_unbounded_why(lineage)}), and they may include this run's examples: the "
            f"composed ε would be ∞. {fix}; else start from another model."
        )
        return claim(True, math.inf, None, _UNBOUNDED, stages=stages), problem
    note = (
        "the export's lineage composed with this run's (ledger): its training data may overlap "
        f"this run's (set {DISJOINT_FIELD}=True if they share no {shared_unit(run)})"
    )
    return claim(True, epsilon, delta, note, stages=stages), None


def _declared_where(name: str) -> str:
    return (
        f"{DISJOINT_FIELD}=True declares model.name_or_path={name!r}'s training data disjoint "
        "from this run's"
    )


def declared_text_problems(run: RunConfig, corpus) -> list[str]:
    """A disjoint declaration refused from the corpus text (`corpus_record.same_text_problems`).

    Any run declaring its starting dpnmt export disjoint, private or not (the
    export's ledger records the declaration, and a later run's ε relies on it;
    a private stage recording no corpora: refused, `_lineage_overlap`; other
    models: the declaration stays the user's word). `training.preflight.check_run`
    asks it before anything is written.

    Args:
      run: the run's config.
      corpus: its corpus as trained on (`training.pieces.load_corpus`).
    """
    name = run.model.name_or_path
    if name is None or not run.model.pretrained_data_disjoint:
        return []
    try:
        is_export, settings = read_export_settings(name)
    except RecordUnreadable:
        return []  # Declared: accepted without a record (`_unreadable`).
    if not is_export:
        return []
    from dpnmt.data import corpus_record  # noqa: PLC0415 - datasets only when needed.

    try:
        stages = _stages(settings)
    except ledger.LedgerError:
        return []  # Refused by `pretrained_problems`.

    def same(recorded, where):
        return corpus_record.same_text_problems(recorded, run.data, corpus, where)

    return _lineage_overlap(stages, run, name, same)


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
