"""dpnmt.core as a library: no import cycles, no global side effects on import."""

import ast
import logging
import pathlib
import subprocess
import sys

import dp_accounting
from dp_accounting.rdp import rdp_privacy_accountant

from dpnmt import core

CORE = pathlib.Path(core.__file__).parent


def _core_imports(path: pathlib.Path) -> set[str]:
    """The dpnmt.core modules that `path` imports (anywhere in the file)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "dpnmt.core":
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dpnmt.core."):
            found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found.update(
                a.name.split(".")[2] for a in node.names if a.name.startswith("dpnmt.core.")
            )
    return found


def test_core_modules_import_each_other_without_cycles():
    modules = {p.stem for p in CORE.glob("*.py") if p.stem != "__init__"}
    graph = {m: _core_imports(CORE / f"{m}.py") & modules for m in modules}
    assert graph["private_grad"] >= {"clipping", "ghost"}
    assert "ghost" not in graph["clipping"]
    done, active = set(), []

    def visit(module):
        if module in active:
            raise AssertionError(f"import cycle: {' -> '.join(active + [module])}")
        if module in done:
            return
        active.append(module)
        for imported in sorted(graph[module]):
            visit(imported)
        active.pop()
        done.add(module)

    for module in sorted(modules):
        visit(module)


_PROBE = """
import logging
from absl import logging as absl_logging  # noqa: F401 (absl's logger exists before)
names = ("absl", "")
before = [list(logging.getLogger(n).filters) for n in names]
handlers = [list(logging.getLogger(n).handlers) for n in names]
import dpnmt.core
assert [list(logging.getLogger(n).filters) for n in names] == before, "filters changed"
assert [list(logging.getLogger(n).handlers) for n in names] == handlers, "handlers changed"
print("unchanged")
"""


def test_importing_core_changes_no_logging_state():
    """Regression: importing dpnmt.core attached a filter to absl's logger."""
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert "unchanged" in out.stdout


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_rdp_convergence_warnings_are_dropped_only_during_accounting():
    # dp_accounting warns for every order whose series does not converge here.
    event = dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.0))
    absl_logger = logging.getLogger("absl")
    records = _Records()
    absl_logger.addHandler(records)
    try:
        core.compute_epsilon(1.0, 0.1, 1, 1e-5, "rdp")
        assert not [m for m in records.messages if "failed to converge" in m]
        rdp_privacy_accountant.RdpAccountant().compose(event)  # Outside our calls.
        assert [m for m in records.messages if "failed to converge" in m]
    finally:
        absl_logger.removeHandler(records)
    assert not absl_logger.filters
