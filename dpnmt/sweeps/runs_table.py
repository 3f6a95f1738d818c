"""One table from several published run folders (config.json, results.json, metrics.jsonl).

Unlike `summary` (one sweep's grid, read through its sweep.json), this reads
any finished run folders, e.g. the committed `docs/results/*`: one row per
run, its ε recomputed with dp_accounting (`epsilon_check`) and a row whose
reported ε disagrees refused by `load_runs`.
"""

import dataclasses
import glob
import json
import math
import os
from collections.abc import Sequence

from dpnmt import decode_folders, public_names
from dpnmt.errors import ConfigError
from dpnmt.sweeps import epsilon_check, summary
from dpnmt.sweeps.summary import as_float
from dpnmt.training.privacy_report import PretrainedClaim

RESULTS, METRICS = "results.json", "metrics.jsonl"
NO_PRIVATE_DATA = "no private data"  # The sampling column of a zero-shot start's row.
ZERO_SHOT = "zero-shot (its start's ε)"  # ... of a start trained on this corpus's data.

# (CSV name, Markdown header).
COLUMNS = (
    ("run", "run"),
    ("sampling", "sampling"),
    ("bleu", "test BLEU"),
    ("chrf", "chrF"),
    ("bertscore_f1", "BERTScore F1"),
    ("epsilon", "ε DP-SGD"),
    ("epsilon_total", "ε total"),
    ("sigma", "σ"),
    ("lot_size", "L"),
    ("steps", "steps"),
    ("epochs", "epochs"),
    ("seconds_per_epoch", "s / epoch"),
    ("epsilon_recomputed", "ε recomputed"),
)


@dataclasses.dataclass(frozen=True)
class PublishedRun:
    """A finished run folder: its name in the table, folder, results.json and ε check."""

    name: str
    folder: str
    results: dict
    check: epsilon_check.EpsilonCheck

    @property
    def privacy(self) -> dict:
        """results.json's "privacy" object."""
        return self.results["privacy"]

    @property
    def steps_per_epoch(self) -> float:
        """N / L: expected lots per epoch (Poisson) or lots per epoch (shuffle)."""
        return self.privacy["dataset_size"] / self.privacy["expected_lot_size"]

    def sampling_label(self) -> str:
        """'poisson', 'shuffle', or 'non-private (<sampling>)'."""
        if not self.privacy["private"]:
            return f"non-private ({self.privacy['sampling']})"
        return self.privacy["sampling"]


def expand(patterns: list[str]) -> list[str]:
    """Run folders from folder names or globs, in the order given (globs sorted)."""
    folders = []
    for pattern in patterns:
        matched = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        folders += [m.rstrip("/") for m in matched if os.path.isdir(m)]
        if not matched or not any(os.path.isdir(m) for m in matched):
            raise ConfigError(f"--runs: {pattern!r} names no folder; give run folders or a glob.")
    return list(dict.fromkeys(folders))


def _names(folders: list[str]) -> list[str]:
    """Each folder's path below the folders' common parent."""
    common = os.path.commonpath([os.path.abspath(f) for f in folders]) if folders else ""
    if len(folders) == 1:
        common = os.path.dirname(common)
    return [os.path.relpath(os.path.abspath(f), common) for f in folders]


def load_runs(folders: list[str]) -> tuple[list[PublishedRun], list[str]]:
    """The finished runs among `folders` and the names of the others.

    Raises:
      ConfigError: a folder without results.json, or a private run whose
        reported ε disagrees with its recomputation (the report is refused).
    """
    runs, not_finished = [], []
    for name, folder in zip(_names(folders), folders, strict=True):
        path = os.path.join(folder, RESULTS)
        if not os.path.isfile(path):
            raise ConfigError(f"{folder} has no {RESULTS}: give finished run folders in --runs.")
        with open(path) as f:
            results = json.load(f)
        if not results.get("finished"):
            not_finished.append(name)
            continue
        check = epsilon_check.check_run(results["privacy"])
        if not check.agrees:
            raise ConfigError(
                f"{path}: the reported ε does not recompute ({check.note}); the run's "
                "privacy record is wrong or edited: fix or drop the run before reporting it."
            )
        runs.append(PublishedRun(name, folder, results, check))
    return runs, not_finished


def row(run: PublishedRun) -> dict:
    """The run's row keyed by the CSV names of `COLUMNS` (NaN: not scored or not published)."""
    test, privacy = run.results["test"], run.privacy
    return {
        "run": run.name,
        "sampling": run.sampling_label(),
        "bleu": as_float(test.get("bleu")),
        "chrf": as_float(test.get("chrf")),
        "bertscore_f1": as_float(test.get("bertscore", {}).get("f1")),
        "epsilon": as_float(privacy["dp_sgd_epsilon"]),
        "epsilon_total": as_float(privacy["total_epsilon"]),
        "sigma": as_float(privacy["noise_multiplier"]),
        "lot_size": privacy["expected_lot_size"],
        "steps": run.results["steps_done"],
        "epochs": run.results["steps_done"] / run.steps_per_epoch,
        "seconds_per_epoch": as_float(run.results.get("seconds_per_epoch")),
        "epsilon_recomputed": math.nan if run.check.recomputed is None else run.check.recomputed,
    }


# A re-decoding's privacy record must be its run's: the same model, so the same ε.
SAME_PLAN = ("noise_multiplier", "dataset_size", "expected_lot_size", "steps_planned")
SAME_PLAN += ("dp_sgd_epsilon", "total_epsilon", "sampling")


def decoding_rows(runs: list[PublishedRun], tags: Sequence[str]) -> list[dict]:
    """Each run's row, followed by a row per tagged re-decoding of its test split.

    A tag's row ("<run> [<tag>]") takes its test scores from
    `<run>/decode_test_<tag>/results.json` (`dpnmt.decode --split=test --tag=<tag>`,
    e.g. another `--no_repeat_ngram_size`) and the rest from the run: the same
    model, so the same ε. A run without that folder has no such row.

    Raises:
      ConfigError: a tagged decoding that is not a whole test decode of the
        run's final parameters (its split, `steps_done`, sentence count or
        privacy plan differs), a malformed tag, or a tag no run has.
    """
    bad = [t for t in tags if not decode_folders.is_tag(t)]
    if bad:
        raise ConfigError(f"--decodings: {bad} are not tags (letters, digits, '-' and '_').")
    rows, found = [], set()
    for run in runs:
        rows.append(row(run))
        for tag in tags:
            path = os.path.join(run.folder, decode_folders.folder("test", tag), RESULTS)
            if not os.path.isfile(path):
                continue
            with open(path) as f:
                decoded = json.load(f)
            steps = run.results.get("steps_done")
            sentences = run.results["test"].get("num_sentences")
            plan = {k: run.privacy.get(k) for k in SAME_PLAN}
            if (
                decoded.get("split") != "test"
                or decoded.get("steps_done") != steps
                or decoded.get("scores", {}).get("num_sentences") != sentences
                or {k: decoded.get("privacy", {}).get(k) for k in SAME_PLAN} != plan
            ):
                raise ConfigError(
                    f"{path}: not a whole test decode of this run's final parameters (split "
                    f"{decoded.get('split')!r}, steps {decoded.get('steps_done')} of {steps}, "
                    f"{decoded.get('scores', {}).get('num_sentences')} sentences of {sentences}, "
                    f"or another run's plan); rerun dpnmt.decode --split=test --tag={tag}."
                )
            found.add(tag)
            redecoded = dataclasses.replace(
                run, name=f"{run.name} [{tag}]", results={**run.results, "test": decoded["scores"]}
            )
            rows.append(row(redecoded))
    if set(tags) - found:
        missing = sorted(set(tags) - found)
        raise ConfigError(f"--decodings: no run has decode_test_<tag>/ for {missing}.")
    return rows


def start_epsilon(record: dict, path: str = "") -> float:
    """ε a zero-shot decode's model carries on the table's corpus, from its recorded claim.

    The claim (`PretrainedClaim`, decided by `dpnmt.decode --zero_shot` as a
    DP run on this corpus would: `evaluation.decode.zero_shot_claim`) is read
    as such a run composes it: ∞ when it had a problem (a refused declaration,
    an unreadable record); its total ε when composed, or in parallel (declared
    disjoint, DP-trained: the larger ε, its own); 0 when declared disjoint and
    trained without DP, or when it is no dpnmt export (its data are outside
    the report, as in the DP rows).

    Raises:
      ConfigError: the record has no claim or a malformed one.
    """
    problems = record.get("pretrained_problems")
    if not isinstance(problems, list):
        raise ConfigError(
            f"{path}: 'pretrained_problems' must be a list (the decode's record of its "
            "model's claim); decode it again with dpnmt.decode --zero_shot."
        )
    if problems:
        return math.inf
    try:
        claim = PretrainedClaim.from_json(record["pretrained"])
    except (KeyError, TypeError, ValueError) as error:
        raise ConfigError(
            f"{path}: the decoded model's privacy claim is missing or malformed ({error!r}); "
            "decode it again with dpnmt.decode --zero_shot."
        ) from error
    if (
        not claim.composed
        and not claim.parallel
        and (not claim.dpnmt_export or claim.declared_disjoint)
    ):
        return 0.0  # Outside the report, as in the DP rows.
    epsilon = claim.epsilon
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not epsilon >= 0:
        return math.inf  # None, NaN, negative, not a number: no guarantee.
    return float(epsilon)


def run_corpora(runs: list[PublishedRun]) -> set[tuple[str, str]]:
    """The (public name of data.corpus, data.pair) of each run, from its config.json.

    Public names (`public_names.public_corpus`), as a zero-shot decode records
    them; a run without config.json is skipped.
    """
    corpora = set()
    for run in runs:
        path = os.path.join(run.folder, "config.json")
        if os.path.isfile(path):
            with open(path) as f:
                data = json.load(f).get("data", {})
            corpora.add((public_names.public_corpus(data.get("corpus")), data.get("pair")))
    return corpora


def start_rows(
    folders: Sequence[str],
    tags: Sequence[str],
    sentences: int | None,
    corpora: set[tuple[str, str]] | None = None,
) -> list[dict]:
    """Rows for starting models decoded without training, the baseline a DP row must beat.

    Each folder is a `dpnmt.decode --zero_shot --split=test --workdir=<folder>`
    output: a row "<folder name> (zero-shot)" from `decode_test/`, then one
    "... [<tag>]" per tag that has `decode_test_<tag>/`. Nothing is trained
    here: ε DP-SGD is 0, and ε total is the model's own on this corpus
    (`start_epsilon`); σ, L, steps and time do not apply.

    Args:
      folders: zero-shot decode workdirs.
      tags: re-decoding tags (`decode_test_<tag>/`; absent ones are skipped).
      sentences: the table's test sentence count, or None to skip that check.
      corpora: the runs' (data.corpus, data.pair) (`run_corpora`): a start
        decoded on none of them is refused (its ε is stated for its own); None
        skips the check. Names only: a `files:` name resolves through
        $DPNMT_DATA_DIR and corpus options are not compared, and a table that
        mixes corpora needs the start to match one of them, not each.

    Raises:
      ConfigError: a folder without `decode_test/results.json`, or a decode
        that is not a whole zero-shot decode of the test split.
    """
    rows = []
    for name, folder in zip(_names(list(folders)), folders, strict=True):
        if not os.path.isfile(os.path.join(folder, decode_folders.folder("test"), RESULTS)):
            raise ConfigError(
                f"--starts: {folder} has no {decode_folders.folder('test')}/{RESULTS}: run "
                f"dpnmt.decode --zero_shot --split=test --workdir={folder} first."
            )
        for tag in (None, *tags):
            path = os.path.join(folder, decode_folders.folder("test", tag), RESULTS)
            if not os.path.isfile(path):
                continue
            with open(path) as f:
                decoded = json.load(f)
            scores, record = decoded.get("scores", {}), decoded.get("privacy", {})
            if (
                decoded.get("split") != "test"
                or decoded.get("steps_done") != 0
                or {k: record.get(k) for k in ("private", "note")}
                != {"private": False, "note": decode_folders.ZERO_SHOT_NOTE}
                or (sentences is not None and scores.get("num_sentences") != sentences)
            ):
                raise ConfigError(
                    f"{path}: not a whole zero-shot decode of the test split ({sentences} "
                    "sentences); give --starts what dpnmt.decode --zero_shot --split=test wrote."
                )
            if "pretrained_problems" not in record or "corpus" not in record:
                raise ConfigError(
                    f"{path}: no record of the decoded model's own privacy or corpus (a zero-shot "
                    "decode from before dpnmt wrote them): decode it again with dpnmt.decode."
                )
            corpus = (record.get("corpus"), record.get("pair"))
            if corpora is not None and corpus not in corpora:
                raise ConfigError(
                    f"{path}: decoded on corpus {corpus}, none of the runs' {sorted(corpora)}: "
                    "its ε is stated for that corpus; decode it with a run's config."
                )
            nan, epsilon = math.nan, start_epsilon(record, path)
            rows.append(
                {
                    "run": f"{name} (zero-shot)" + (f" [{tag}]" if tag else ""),
                    "sampling": NO_PRIVATE_DATA if epsilon == 0 else ZERO_SHOT,
                    "bleu": as_float(scores.get("bleu")),
                    "chrf": as_float(scores.get("chrf")),
                    "bertscore_f1": as_float(scores.get("bertscore", {}).get("f1")),
                    "epsilon": 0.0,
                    "epsilon_total": epsilon,
                    **dict.fromkeys(("sigma", "lot_size", "seconds_per_epoch"), nan),
                    **dict.fromkeys(("steps", "epochs"), 0),
                    "epsilon_recomputed": nan,
                }
            )
    return rows


def table_rows(
    runs: list[PublishedRun], decodings: Sequence[str], starts: Sequence[str]
) -> list[dict]:
    """The runs table's rows: the starts' (`start_rows`), then the runs' (`decoding_rows`).

    Args:
      runs: the finished runs (`load_runs`; at least one).
      decodings: re-decoding tags, for the runs and the starts alike.
      starts: zero-shot decode folders (checked against the runs' test sentence
        count and corpora).
    """
    rows = []
    if starts:
        sentences = runs[0].results["test"].get("num_sentences")
        rows = start_rows(starts, decodings, sentences, run_corpora(runs))
    return rows + decoding_rows(runs, decodings)


def markdown_rows(
    rows: list[dict], columns: Sequence[tuple[str, str]], digits: dict[str, int]
) -> list[str]:
    """A Markdown table's lines: header, rule, one line a row (numbers to `digits`)."""
    lines = ["| " + " | ".join(h for _, h in columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(_text(r[k], digits.get(k, 0)) for k, _ in columns) + " |")
    return lines


def _text(value, digits: int) -> str:
    if isinstance(value, str):
        return value
    if math.isnan(value):
        return "–"
    return "∞" if math.isinf(value) else f"{value:.{digits}f}"


DIGITS = {"bleu": 2, "chrf": 1, "bertscore_f1": 3, "epsilon": 2, "epsilon_total": 2}
DIGITS |= {"sigma": 3, "lot_size": 0, "steps": 0, "epochs": 1, "seconds_per_epoch": 0}
DIGITS |= {"epsilon_recomputed": 2}


def to_markdown(rows: list[dict], not_finished: list[str]) -> str:
    """The table as Markdown, with notes on what each column is."""
    lines = markdown_rows(rows, COLUMNS, DIGITS)
    lines += [
        "",
        "Test split scores (BLEU, chrF: sacreBLEU, detokenised; BERTScore F1, '–' when "
        "not scored). ε DP-SGD: each run's guarantee at its δ and planned steps (Poisson: "
        "amplified by sampling; shuffle: composition over epochs, no amplification); ε total "
        "adds the vocabulary's and a composed pretrained model's ε (a DP-trained model on "
        "data declared disjoint: the larger of its total and the run's). ε recomputed: the same "
        "DP-SGD ε recomputed with dp_accounting from σ, q = L/N, steps, δ and the sampling "
        "in the run's results.json (a run that disagrees is refused). epochs = steps · L / N; "
        "s / epoch: the run's last session.",
    ]
    if any(r["sampling"] in (NO_PRIVATE_DATA, ZERO_SHOT) for r in rows):
        lines[-1] += (
            " A '(zero-shot)' row is a start decoded without training on this corpus "
            "(`--starts`): ε total is its own ε on this corpus's data, as a DP run from it "
            "would compose it (0: trained without DP on data declared disjoint, checked, or "
            "no dpnmt export; ∞: a refused declaration or an unreadable record); the "
            "baseline the DP rows must beat."
        )
    if not_finished:
        lines.append(f"\nNot in the table (not finished): {', '.join(not_finished)}.")
    return "\n".join(lines) + "\n"


def to_csv(rows: list[dict]) -> str:
    """The rows as CSV at full precision."""
    return summary.to_csv(rows, COLUMNS)


def private_validation(run: PublishedRun) -> bool:
    """Whether a private run's validation pairs came from its private train split."""
    return bool(run.privacy["private"] and run.results.get("validation_is_private"))


def validation_curve(run: PublishedRun) -> list[dict]:
    """Validation points by step: metrics.jsonl's `validation/*` if published, else the history.

    Each point: {"step", "epoch", and "loss" / "bleu" when evaluated}. A step
    logged twice (a resumed session redoing lots) keeps its last record.
    Training loss is never read: a private run never publishes it. Empty for
    a private run whose validation pairs were carved from its private train
    split (`validation_is_private`): that curve is outside the guarantee.
    """
    if private_validation(run):
        return []
    by_step: dict[int, dict] = {}
    metrics = os.path.join(run.folder, METRICS)
    if os.path.isfile(metrics):
        with open(metrics) as f:
            for line in f:
                record = json.loads(line)
                values = {
                    k.split("/", 1)[1]: v
                    for k, v in record.items()
                    if k in ("validation/loss", "validation/bleu")
                }
                if values:
                    by_step[int(record["step"])] = values
    if not by_step:
        for point in run.results["history"]:
            by_step[int(point["step"])] = {k: point[k] for k in ("loss", "bleu") if k in point}
        final = run.results["validation"]
        by_step[int(run.results["steps_done"])] = {k: final[k] for k in ("loss", "bleu")}
    return [
        {"step": step, "epoch": step / run.steps_per_epoch, **values}
        for step, values in sorted(by_step.items())
    ]
