"""Privacy/utility reports: a sweep's Table 3 and plots, or one table of published run folders."""

import json
import math
import os
from collections.abc import Sequence

from dpnmt.errors import ConfigError
from dpnmt.sweeps import grid, groups_table, plots, runs_details, runs_table, summary, tuning_table

TABLE_MD, TABLE_CSV = "table.md", "table.csv"
FIGURES = ("bleu_vs_epsilon.png", "learning_curves.png", "epsilon_vs_step.png")
RUNS_FIGURES = ("learning_curves.png",)
RUN_CURVES = "run_curves.png"  # One run's report: its curves by step.
# metrics.jsonl's scalars `step_series` plots, by their names in the figure.
_STEP_SERIES = {
    "train/loss": "train loss",
    "privacy/epsilon_spent": "ε spent (DP-SGD)",
    "privacy/total_epsilon_spent": "ε spent (total)",
}
STARTS = (runs_table.NO_PRIVATE_DATA, runs_table.ZERO_SHOT)  # The sampling labels of start rows.


def write_workdir_report(workdir: str, out: str) -> tuple[str, tuple[str, ...]]:
    """A sweep's report (`write_report`), or one run's (`write_runs_report`) for a run folder.

    Args:
      workdir: a sweep's folder (sweep.json) or one run's (results.json, no sweep.json).
      out: output folder.

    Returns:
      (the Markdown table, the names of the files written to `out`).

    Raises:
      ConfigError: `workdir` is neither, or holds no finished run.
    """
    if os.path.isfile(os.path.join(workdir, grid.MANIFEST_FILE)):
        return write_report(workdir, out), (TABLE_MD, TABLE_CSV, *FIGURES)
    if os.path.isfile(os.path.join(workdir, runs_table.RESULTS)):
        markdown = write_runs_report([workdir], out)
        (run,), _ = runs_table.load_runs([workdir])
        path = os.path.join(out, RUN_CURVES)
        plots.run_curves(step_series(run), runs_table.validation_curve(run), path)
        return markdown, (TABLE_MD, TABLE_CSV, *RUNS_FIGURES, RUN_CURVES)
    what = "no such folder" if not os.path.isdir(workdir) else "no sweep.json and no results.json"
    raise ConfigError(
        f"--workdir={workdir}: {what}; give a sweep's folder (python -m dpnmt.sweep) or a "
        "finished run's (python -m dpnmt.train), or several runs with --runs."
    )


def step_series(run: runs_table.PublishedRun) -> dict[str, list[tuple[int, float]]]:
    """A run's scalars by step from its metrics.jsonl: training loss, ε spent (finite only).

    A private run's training loss is never read (computed on private pairs,
    unnoised: it is not published, `training.metrics`). A step logged twice (a
    resumed session) keeps its last record.
    """
    keys = dict(_STEP_SERIES)
    if run.privacy.get("private"):
        del keys["train/loss"]
    by_step: dict[int, dict] = {}
    path = os.path.join(run.folder, runs_table.METRICS)
    if os.path.isfile(path):
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                by_step.setdefault(int(record["step"]), {}).update(record)
    return {
        name: [
            (step, float(r[key]))
            for step, r in sorted(by_step.items())
            if key in keys and key in r and math.isfinite(float(r[key]))
        ]
        for key, name in _STEP_SERIES.items()
    }


def write_report(workdir: str, out: str) -> str:
    """Writes the tables and figures of the sweep in `workdir` to `out`.

    Returns:
      The Markdown table.

    Raises:
      ValueError: no sweep manifest, or no finished run to report.
    """
    runs, not_finished = summary.load_runs(workdir)
    if not runs:
        raise ConfigError(
            f"{workdir} has no finished run yet ({len(not_finished)} not finished); "
            "run or resume `python -m dpnmt.sweep` first."
        )
    rows = summary.cell_rows(runs)
    os.makedirs(out, exist_ok=True)
    markdown = summary.to_markdown(rows, not_finished)
    with open(os.path.join(out, TABLE_MD), "w") as f:
        f.write(markdown)
    with open(os.path.join(out, TABLE_CSV), "w") as f:
        f.write(summary.to_csv(rows))
    plots.bleu_vs_epsilon(rows, os.path.join(out, FIGURES[0]))
    plots.learning_curves(runs, os.path.join(out, FIGURES[1]))
    plots.epsilon_vs_step(runs, os.path.join(out, FIGURES[2]))
    return markdown


def write_runs_report(
    patterns: list[str],
    out: str,
    *,
    samples: int = 3,
    extrapolate_to: float | None = None,
    decodings: Sequence[str] = (),
    starts: Sequence[str] = (),
) -> str:
    """Writes one table of the finished run folders matched by `patterns` to `out`.

    Every private run's ε is recomputed with dp_accounting first; a run that
    disagrees is refused before anything is written.

    Args:
      patterns: run folders or globs (each folder holds results.json).
      out: output folder: table.md (table, noise to signal, the rows released
        together, extrapolation, sample translations), table.csv,
        learning_curves.png.
      samples: test translations shown per run.
      extrapolate_to: epoch to extrapolate validation BLEU to (default twice
        each run's last epoch).
      decodings: tags of re-decodings of the test split: a row "<run> [<tag>]"
        under each run that has `decode_test_<tag>/` (`runs_table.decoding_rows`).
      starts: zero-shot decode workdirs of the starting models: rows first, ε
        total each model's own on this corpus (`runs_table.start_rows`, with
        their `decode_test_<tag>/` where present).

    Returns:
      The Markdown written to table.md.
    """
    runs, not_finished = runs_table.load_runs(runs_table.expand(patterns))
    if not runs:
        raise ConfigError(f"--runs matched no finished run ({len(not_finished)} not finished).")
    rows = runs_table.table_rows(runs, decodings, runs_table.expand(starts) if starts else [])
    markdown = "\n".join(
        [
            runs_table.to_markdown(rows, not_finished),
            runs_details.noise_to_signal(runs),
            runs_details.released_together(runs, [r for r in rows if r["sampling"] in STARTS]),
            runs_details.extrapolation(runs, extrapolate_to),
            runs_details.samples(runs, samples),
        ]
    )
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, TABLE_MD), "w", encoding="utf-8") as f:
        f.write(markdown)
    with open(os.path.join(out, TABLE_CSV), "w") as f:
        f.write(runs_table.to_csv(rows))
    curves = {run.name: runs_table.validation_curve(run) for run in runs}
    plots.curves_by_epoch(curves, os.path.join(out, RUNS_FIGURES[0]))
    return markdown


def _write_table(patterns: list[str], out: str, flag: str, table) -> str:
    """Writes `table.to_markdown` of the finished runs `patterns` name to `out`/table.md.

    Every private run's ε is recomputed with dp_accounting first; a run that
    disagrees or is not finished (or that `table.row` refuses) stops it before
    anything is written.

    Returns:
      The Markdown written.
    """
    runs, not_finished = runs_table.load_runs(runs_table.expand(patterns))
    if not runs or not_finished:
        raise ConfigError(
            f"--{flag} needs finished runs only: {len(runs)} finished, not finished: "
            f"{', '.join(not_finished) or 'none'}; finish or drop them."
        )
    markdown = table.to_markdown([table.row(run) for run in runs])
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, TABLE_MD), "w", encoding="utf-8") as f:
        f.write(markdown)
    return markdown


def write_tuning_report(patterns: list[str], out: str) -> str:
    """A grid's tuning table (`tuning_table`, each ε's winner marked) in `out`/table.md."""
    return _write_table(patterns, out, "tuning", tuning_table)


def write_groups_report(patterns: list[str], out: str) -> str:
    """The per-pair vs per-group table (`groups_table`) of the run folders in `out`/table.md."""
    return _write_table(patterns, out, "groups", groups_table)
