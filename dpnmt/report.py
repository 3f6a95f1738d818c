r"""Writes a sweep's privacy/utility report: the paper's Table 3 and its plots.

    python -m dpnmt.report --workdir=runs/grid [--out=runs/grid/report]

Reads `<workdir>/sweep.json` (from `python -m dpnmt.sweep`) and each finished
run's results.json; writes `table.md`, `table.csv`, `bleu_vs_epsilon.png`,
`learning_curves.png` and `epsilon_vs_step.png` to `--out`, and prints the
Markdown table. Runs not finished are listed under the table, not averaged.
"""

import os

from absl import app, flags

from dpnmt import cli, plots, summary
from dpnmt.errors import ConfigError

_WORKDIR = flags.DEFINE_string("workdir", None, "The sweep's --workdir.")
_OUT = flags.DEFINE_string("out", None, "Output folder (default: <workdir>/report).")

TABLE_MD, TABLE_CSV = "table.md", "table.csv"
FIGURES = ("bleu_vs_epsilon.png", "learning_curves.png", "epsilon_vs_step.png")


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


def main(argv):
    """Writes the report and prints its table."""
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    out = _OUT.value or os.path.join(_WORKDIR.value, "report")
    markdown = write_report(_WORKDIR.value, out)
    print(markdown)
    print(f"Wrote {TABLE_MD}, {TABLE_CSV} and {', '.join(FIGURES)} to {out}")


if __name__ == "__main__":
    # Here, not at import: importing this module (tests, other apps) must not
    # make these flags required for every absl app in the process.
    flags.mark_flags_as_required(["workdir"])
    cli.run(main)
