"""`dpnmt.report --workdir=<one run>`: the run's table and curves, or one clear line."""

import json
import pathlib
import shutil

import pytest
from absl import flags
from absl.testing import flagsaver

from dpnmt import report as report_app
from dpnmt.errors import ConfigError
from dpnmt.sweeps import report

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "results"
PRIVATE_RUN = RESULTS / "multi30k" / "eps8-poisson" / "seed0"


def test_a_single_private_run_gets_its_table_and_curves(tmp_path, capsys):
    workdir = tmp_path / "run"
    shutil.copytree(PRIVATE_RUN, workdir)
    with flagsaver.flagsaver():
        flags.FLAGS(["report", f"--workdir={workdir}"])
        report_app.main(["report"])
    out = workdir / "report"
    names = {"table.md", "table.csv", "learning_curves.png", "run_curves.png"}
    assert {p.name for p in out.iterdir()} == names
    printed = capsys.readouterr().out
    assert "| run" in printed and "eps8" not in printed.split("|")[0]
    assert f"Wrote table.md, table.csv, learning_curves.png, run_curves.png to {out}" in printed


@pytest.mark.parametrize("make", [False, True])
def test_a_folder_with_no_run_or_sweep_is_one_line(tmp_path, make):
    folder = tmp_path / "nothing"
    if make:
        folder.mkdir()
    with pytest.raises(ConfigError, match="no such folder" if not make else "no sweep.json"):
        report.write_workdir_report(str(folder), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_the_recomputed_epsilon_logs_no_rdp_convergence_warnings():
    """`dpnmt.report` printed dp_accounting's per-order warnings between its tables."""
    import logging

    import dp_accounting

    from dpnmt.sweeps import epsilon_check

    class Records(logging.Handler):
        messages: list = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    # This event's small orders do not converge (dp_accounting's own test of the warning).
    event = dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.0))
    records, absl_logger = Records(), logging.getLogger("absl")
    absl_logger.addHandler(records)
    try:
        epsilon = epsilon_check._epsilon([event], 1e-5, "RDP")
    finally:
        absl_logger.removeHandler(records)
    assert epsilon > 0 and not [m for m in records.messages if "failed to converge" in m]


FIRST_RUN = RESULTS / "first_run"  # Non-private: metrics.jsonl has its training loss.


def test_a_single_run_plots_train_loss_validation_and_epsilon_by_step(tmp_path, capsys):
    """Issue 61: the single-run report had one dot a panel (validation at the end only)."""
    import json

    from dpnmt.sweeps import runs_table

    workdir = tmp_path / "run"
    shutil.copytree(FIRST_RUN, workdir)
    with flagsaver.flagsaver():
        flags.FLAGS(["report", f"--workdir={workdir}"])
        report_app.main(["report"])
    assert (workdir / "report" / report.RUN_CURVES).is_file()
    assert f"tensorboard --logdir {workdir}" in capsys.readouterr().out
    (run,), _ = runs_table.load_runs([str(workdir)])
    series = report.step_series(run)
    records = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    losses = [(r["step"], r["train/loss"]) for r in records if "train/loss" in r]
    assert len(losses) == 46 and series["train loss"] == losses  # Every logged step.
    assert series["ε spent (DP-SGD)"] == []  # Non-private: ε ∞ is not plotted.


def test_a_private_runs_curves_never_show_a_training_loss(tmp_path):
    """A private run publishes no training loss (it is computed on private pairs, unnoised)."""
    from dpnmt.sweeps import runs_table

    workdir = tmp_path / "run"
    shutil.copytree(PRIVATE_RUN, workdir)
    lines = [{"step": s, "privacy/epsilon_spent": s / 10, "train/loss": 5.0} for s in (10, 20)]
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (run,), _ = runs_table.load_runs([str(workdir)])
    series = report.step_series(run)
    assert series["train loss"] == [] and series["ε spent (DP-SGD)"] == [(10, 1.0), (20, 2.0)]
