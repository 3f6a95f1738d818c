"""A sweep's privacy/utility report: the paper's Table 3 (Markdown, CSV) and its plots."""

import os

from dpnmt.errors import ConfigError
from dpnmt.sweeps import plots, summary

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
