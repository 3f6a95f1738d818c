r"""Writes a sweep's privacy/utility report: the paper's Table 3 and its plots.

    python -m dpnmt.report --workdir=runs/grid [--out=runs/grid/report]

Reads `<workdir>/sweep.json` (from `python -m dpnmt.sweep`) and each finished
run's results.json; writes `table.md`, `table.csv`, `bleu_vs_epsilon.png`,
`learning_curves.png` and `epsilon_vs_step.png` to `--out`, and prints the
Markdown table. Runs not finished are listed under the table, not averaged.
"""

import os

from absl import app, flags

from dpnmt import cli
from dpnmt.sweeps import report

_WORKDIR = flags.DEFINE_string("workdir", None, "The sweep's --workdir.")
_OUT = flags.DEFINE_string("out", None, "Output folder (default: <workdir>/report).")


def main(argv):
    """Writes the report and prints its table."""
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    out = _OUT.value or os.path.join(_WORKDIR.value, "report")
    markdown = report.write_report(_WORKDIR.value, out)
    print(markdown)
    print(f"Wrote {report.TABLE_MD}, {report.TABLE_CSV} and {', '.join(report.FIGURES)} to {out}")


if __name__ == "__main__":
    # Here, not at import: importing this module (tests, other apps) must not
    # make these flags required for every absl app in the process.
    flags.mark_flags_as_required(["workdir"])
    cli.run(main)
