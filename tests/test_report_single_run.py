"""`dpnmt.report --workdir=<one run>`: the run's table and curves, or one clear line."""

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
    assert {p.name for p in out.iterdir()} == {"table.md", "table.csv", "learning_curves.png"}
    printed = capsys.readouterr().out
    assert "| run" in printed and "eps8" not in printed.split("|")[0]
    assert f"Wrote table.md, table.csv, learning_curves.png to {out}" in printed


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
