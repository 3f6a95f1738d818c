r"""Writes a privacy/utility report: a sweep's Table 3 and plots, or one table of run folders.

    python -m dpnmt.report --workdir=runs/grid [--out=runs/grid/report]
    python -m dpnmt.report --runs='docs/results/a,docs/results/b/*' --out=docs/results/table
    python -m dpnmt.report --groups --runs=docs/results/groups_bsd/pair,... --out=OUT
    python -m dpnmt.report --tuning --runs='docs/results/standin/*/*/seed0' --out=OUT

`--workdir`: a sweep's folder: reads `<workdir>/sweep.json` (from `python -m dpnmt.sweep`) and
each finished run's results.json; writes `table.md`, `table.csv`,
`bleu_vs_epsilon.png`, `learning_curves.png` and `epsilon_vs_step.png` to
`--out`, and prints the Markdown table. Runs not finished are listed under the
table, not averaged. A single run's folder (results.json, no sweep.json) gets the
`--runs` report of that one folder, in `<workdir>/report` by default.

`--runs`: run folders or globs (comma-separated), each a finished run's
published folder (results.json; metrics.jsonl, noise_to_signal.json and
decode_test/ when present). Writes to `--out` one row per run in `table.md`
and `table.csv` (with `--decodings=TAG`, a row "<run> [TAG]" under each run
that has a test re-decoding `decode_test_TAG/`, e.g. with an n-gram ban;
with `--starts=FOLDER`, first a row per starting model decoded zero-shot,
`dpnmt.decode --zero_shot --split=test --workdir=FOLDER`: the baseline, its ε
total the model's own on this corpus),
with noise to signal, validation BLEU extrapolated from the measured curves
(labelled as such) and sample test translations under the table in `table.md`,
and `learning_curves.png` (validation loss and BLEU by epoch). Every private
run's ε is recomputed with dp_accounting from its results.json; a run whose ε
disagrees is refused before anything is written.

`--groups` (with `--runs`): instead, the per-pair vs per-group table of
finished runs (`dpnmt.sweeps.groups_table`: unit, N, L, k, σ, steps, ε per
pair and per group, vocabulary, test BLEU) in `--out`/table.md.

`--tuning` (with `--runs`): instead, a hyper-parameter grid's table
(`dpnmt.sweeps.tuning_table`: learning rate, C, L, epochs, σ, ε, final
validation loss and BLEU, test BLEU) with each ε's winner marked by the rule
there (best validation BLEU, ties within 0.5 to the lower validation loss),
in `--out`/table.md.
"""

import os

from absl import app, flags

from dpnmt import cli
from dpnmt.errors import ConfigError

_WORKDIR = flags.DEFINE_string("workdir", None, "A sweep's --workdir, or one run's.")
_RUNS = flags.DEFINE_list("runs", None, "Run folders or globs (instead of --workdir).")
_OUT = flags.DEFINE_string("out", None, "Output folder (default: <workdir>/report).")
_GROUPS = flags.DEFINE_bool("groups", False, "--runs: the per-pair vs per-group table.")
_TUNING = flags.DEFINE_bool("tuning", False, "--runs: a grid's table, its winners marked.")
_SAMPLES = flags.DEFINE_integer("samples", 3, "--runs: test translations shown per run.")
_DECODINGS = flags.DEFINE_list(
    "decodings", [], "--runs: tags of test re-decodings (decode_test_<tag>/): a row each."
)
_STARTS = flags.DEFINE_list(
    "starts", [], "--runs: zero-shot decode workdirs of starting models (baseline rows first)."
)
_EXTRAPOLATE_TO = flags.DEFINE_float(
    "extrapolate_to", None, "--runs: epoch to extrapolate to (default: twice each run's last)."
)


def main(argv):
    """Writes the report and prints its table."""
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if (_WORKDIR.value is None) == (_RUNS.value is None):
        raise ConfigError("Give exactly one of --workdir (a sweep or run) or --runs (run folders).")
    if _GROUPS.value and _TUNING.value:
        raise ConfigError("Give at most one of --groups and --tuning.")
    for name, given in (("groups", _GROUPS.value), ("tuning", _TUNING.value)):
        if given and _RUNS.value is None:
            raise ConfigError(f"--{name} needs --runs: the run folders of the table.")
    for name, given in (("decodings", _DECODINGS.value), ("starts", _STARTS.value)):
        if given and (_RUNS.value is None or _GROUPS.value or _TUNING.value):
            raise ConfigError(f"--{name} belongs to the runs table: give it with --runs only.")
    from dpnmt.sweeps import report  # noqa: PLC0415 - heavy (plots, accounting): not for --help.

    if _RUNS.value is not None:
        if _OUT.value is None:
            raise ConfigError("--runs needs --out: the folder to write the table to.")
        if _GROUPS.value or _TUNING.value:
            write = report.write_groups_report if _GROUPS.value else report.write_tuning_report
            print(write(_RUNS.value, _OUT.value))
            print(f"Wrote {report.TABLE_MD} to {_OUT.value}")
            return
        markdown = report.write_runs_report(
            _RUNS.value,
            _OUT.value,
            samples=_SAMPLES.value,
            extrapolate_to=_EXTRAPOLATE_TO.value,
            decodings=_DECODINGS.value,
            starts=_STARTS.value,
        )
        print(markdown)
        written = (report.TABLE_MD, report.TABLE_CSV, *report.RUNS_FIGURES)
        print(f"Wrote {', '.join(written)} to {_OUT.value}")
        return
    out = _OUT.value or os.path.join(_WORKDIR.value, "report")
    markdown, written = report.write_workdir_report(_WORKDIR.value, out)
    print(markdown)
    print(f"Wrote {', '.join(written)} to {out}")
    if report.RUN_CURVES in written:  # One run: every logged step, live as it trains too.
        print(f"Every scalar by step, live: tensorboard --logdir {_WORKDIR.value}")


if __name__ == "__main__":
    cli.run(main)
