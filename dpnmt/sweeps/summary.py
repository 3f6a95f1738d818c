"""Aggregates a sweep's finished runs into the paper's Table 3 (mean (std) over seeds).

Pure functions over the runs' `results.json`: `load_runs` reads them,
`cell_rows` aggregates one row per (privacy, sampling) cell, `to_markdown` and
`to_csv` format the rows.
"""

import csv
import dataclasses
import io
import math
import os

import numpy as np

from dpnmt import config_lib
from dpnmt.sweeps import grid
from dpnmt.training.privacy_report import PrivacyReport

# Table columns: (CSV name, Markdown header). Means and stds are over public seeds.
COLUMNS = (
    ("privacy", "privacy"),
    ("sampling", "sampling"),
    ("n", "n"),
    ("bleu_mean", "test BLEU"),
    ("bleu_std", None),
    ("chrf_mean", "chrF"),
    ("chrf_std", None),
    ("bertscore_f1_mean", "BERTScore F1"),
    ("bertscore_f1_std", None),
    ("epsilon", "ε DP-SGD"),
    ("epsilon_bound", "bound of ε"),
    ("epsilon_total", "ε total (+ vocabulary)"),
    ("sigma", "σ"),
    ("steps", "steps"),
    ("seconds_per_epoch_mean", "s / epoch"),
    ("seconds_per_epoch_std", None),
    ("bleu_signature", None),  # sacreBLEU's; in the notes under the Markdown table.
)


@dataclasses.dataclass(frozen=True)
class Run:
    """A finished run: its grid cell, its results.json and its privacy report."""

    spec: grid.RunSpec
    results: dict
    privacy: PrivacyReport  # results.json's "privacy" object, parsed once.


def load_runs(workdir: str) -> tuple[list[Run], dict[str, str]]:
    """The finished runs of a sweep in grid order (ε variant, sampling, seed), and the rest.

    Returns:
      (finished runs, {run name: state} for runs not finished).
    """
    manifest = grid.read_manifest(workdir)
    finished, others = [], {}
    for name, record in manifest["runs"].items():
        spec = grid.RunSpec(record["privacy"], record["sampling"], record["seed"])
        results = grid.read_json(os.path.join(workdir, name, "results.json"))
        if record.get("state") == grid.FINISHED and results and results.get("finished"):
            finished.append(Run(spec, results, PrivacyReport.from_json(results["privacy"])))
        else:
            others[name] = record.get("state", grid.PENDING)
    return sorted(finished, key=lambda run: _order(run.spec)), others


def _order(spec: grid.RunSpec) -> tuple[int, int, int]:
    """Grid order: ε variant (config_lib's order), then sampling, then seed."""
    privacy_order = list(config_lib.PRIVACY_VARIANTS)
    sampling = config_lib.SAMPLING_VARIANTS.index(spec.sampling)
    return privacy_order.index(spec.privacy), sampling, spec.seed


def as_float(value) -> float:
    """A results.json number as float ("inf" strings included; None is NaN)."""
    return math.nan if value is None else float(value)


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1); std is NaN for fewer than 2 values."""
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        return math.nan, math.nan
    std = float(np.std(array, ddof=1)) if array.size > 1 else math.nan
    return float(np.mean(array)), std


def bound_label(report: PrivacyReport) -> str:
    """Which bound the run's ε is: Poisson (amplified), shuffled (none), or no DP."""
    if not report.private:
        return "no DP"
    if report.sampling == "poisson":
        return "Poisson, amplified"
    return "shuffled, no amplification"


def cell_rows(runs: list[Run]) -> list[dict]:
    """One row per (privacy, sampling) cell, in the order of `runs`.

    Args:
      runs: finished runs (`load_runs`).

    Returns:
      Rows keyed by the CSV names of `COLUMNS`: n seeds, mean and sample std of
      test BLEU, chrF, BERTScore F1 (NaN if not scored) and seconds per epoch;
      the sacreBLEU signature(s) of the cell's runs ("; "-joined); the mean
      DP-SGD ε each run reports as its guarantee (∞ when not private), its bound,
      the total ε with the vocabulary, σ and the steps done.
    """
    cells: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        cells.setdefault((run.spec.privacy, run.spec.sampling), []).append(run)
    rows = []
    for (privacy, sampling), members in cells.items():
        reports = [m.privacy for m in members]
        tests = [m.results["test"] for m in members]
        bertscores = [t["bertscore"]["f1"] for t in tests if "bertscore" in t]
        bleu = mean_std([t["bleu"] for t in tests])
        chrf = mean_std([as_float(t.get("chrf")) for t in tests])
        signatures = sorted({str(t.get("bleu_signature", "?")) for t in tests})
        f1 = mean_std(bertscores) if len(bertscores) == len(tests) else (math.nan, math.nan)
        # None (a session of fewer than 50 lots publishes no timing) counts as NaN.
        seconds = mean_std([as_float(m.results["seconds_per_epoch"]) for m in members])
        rows.append(
            {
                "privacy": privacy,
                "sampling": sampling,
                "n": len(members),
                "bleu_mean": bleu[0],
                "bleu_std": bleu[1],
                "chrf_mean": chrf[0],
                "chrf_std": chrf[1],
                "bertscore_f1_mean": f1[0],
                "bertscore_f1_std": f1[1],
                "epsilon": float(np.mean([r.dp_sgd_epsilon for r in reports])),
                "epsilon_bound": bound_label(reports[0]),
                "epsilon_total": float(np.mean([r.total_epsilon for r in reports])),
                "sigma": float(np.mean([r.noise_multiplier for r in reports])),
                "steps": float(np.mean([r.steps_done for r in reports])),
                "seconds_per_epoch_mean": seconds[0],
                "seconds_per_epoch_std": seconds[1],
                "bleu_signature": "; ".join(signatures),
            }
        )
    return rows


def _number(value: float, digits: int) -> str:
    if math.isnan(value):
        return "–"
    if math.isinf(value):
        return "∞"
    return f"{value:.{digits}f}" if abs(value) < 1e4 else f"{value:.3g}"


def _mean_std_text(mean: float, std: float, digits: int) -> str:
    if math.isnan(mean):
        return "–"
    return f"{_number(mean, digits)} ({_number(std, digits)})"


def to_markdown(rows: list[dict], not_finished: dict[str, str]) -> str:
    """The table as Markdown, with notes on what the figures are."""
    headers = [header for _, header in COLUMNS if header]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        cells = [
            row["privacy"],
            row["sampling"],
            str(row["n"]),
            _mean_std_text(row["bleu_mean"], row["bleu_std"], 2),
            _mean_std_text(row["chrf_mean"], row["chrf_std"], 1),
            _mean_std_text(row["bertscore_f1_mean"], row["bertscore_f1_std"], 3),
            _number(row["epsilon"], 2),
            row["epsilon_bound"],
            _number(row["epsilon_total"], 2),
            _number(row["sigma"], 3),
            _number(row["steps"], 0),
            _mean_std_text(row["seconds_per_epoch_mean"], row["seconds_per_epoch_std"], 1),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    notes = [
        "",
        "Mean (std) over n public seeds (config.seed); std is the sample standard "
        "deviation (n − 1), '–' when n = 1 or the metric was not computed. BLEU, chrF "
        "and BERTScore F1 on the test split (BLEU and chrF by sacreBLEU, detokenised). "
        "ε DP-SGD is the guarantee each run reports at "
        "its δ: Poisson runs the amplified Poisson bound, shuffled runs the bound "
        "without amplification by sampling. ε total adds the vocabulary's ε (basic "
        "composition; ∞ if the vocabulary is not covered). s / epoch: training time of "
        "the run's last session, per epoch.",
    ]
    signatures = sorted({sig for row in rows for sig in row["bleu_signature"].split("; ")})
    if signatures:
        notes.append(f"\nsacreBLEU signature: {', '.join(f'`{sig}`' for sig in signatures)}.")
    if not_finished:
        listed = ", ".join(f"{name} ({state})" for name, state in sorted(not_finished.items()))
        notes.append(f"\nNot in the table (not finished): {listed}.")
    return "\n".join(lines + notes) + "\n"


def to_csv(rows: list[dict], columns=None) -> str:
    """The rows as CSV at full precision (nan, inf as Python writes them).

    `columns`: `(name, title)` pairs giving the fields in order (default: this table's).
    """
    out = io.StringIO()
    names = [name for name, _ in (COLUMNS if columns is None else columns)]
    writer = csv.DictWriter(out, fieldnames=names, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
