"""dpnmt.core as a library: no import cycles, no global side effects on import."""

import ast
import logging
import pathlib
import subprocess
import sys

import dp_accounting
from dp_accounting.rdp import rdp_privacy_accountant

from dpnmt import core
from dpnmt.core import epsilon_memo

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


def test_rdp_convergence_warnings_are_dropped_only_during_accounting(monkeypatch):
    # dp_accounting warns for every order whose series does not converge here.
    # An empty memo: an ε an earlier test computed would be looked up, not computed.
    monkeypatch.setattr(epsilon_memo, "_EPSILONS", {})
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


_WITHOUT_FLAX = """
import importlib.abc, sys

class NoFlax(importlib.abc.MetaPathFinder):  # as if flax were not installed
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "flax":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NoFlax())
import jax, jax.numpy as jnp
from dpnmt import core
assert not [m for m in sys.modules if m.split(".")[0] == "flax"]

def loss_fn(params, example):
    return jnp.sum(jnp.tanh(example["x"] @ params["w"]))

params = {"w": jnp.ones((3, 2))}
data = {"x": jax.random.normal(jax.random.key(0), (8, 3))}
mask = jnp.ones(8)
grad_sum, _, _ = core.private_grad_sum(loss_fn, params, data, mask, l2_clip=0.5, clipping="vmap")
grads = jax.vmap(jax.grad(loss_fn), in_axes=(None, 0))(params, data)
expected, _ = core.clip_and_sum(grads, l2_clip=0.5, mask=mask, params=params)
assert jnp.allclose(grad_sum["w"], expected["w"]), (grad_sum, expected)
lot = core.poisson_lot(jax.random.key(1), 8, 0.5, microbatch_size=4, max_microbatches=4)
step = dict(l2_clip=0.5, noise_multiplier=1.0, expected_lot_size=4.0)
grad = core.private_lot_gradient(loss_fn, params, data, lot, jax.random.key(2),
                                 clipping="vmap", **step)
assert bool(jnp.all(jnp.isfinite(grad["w"])))
# The default, clipping="auto", runs vmap without flax (issue 64 item 2): no error, no warning.
import warnings
with warnings.catch_warnings():
    warnings.simplefilter("error")
    auto = core.private_grad_sum(loss_fn, params, data, mask, l2_clip=0.5)
    assert auto.clipping == "vmap" and jnp.allclose(auto.grad_sum["w"], grad_sum["w"])
    auto_grad = jax.jit(lambda p: core.private_lot_gradient(
        loss_fn, p, data, lot, jax.random.key(2), **step))(params)
    assert jnp.array_equal(auto_grad["w"], grad["w"])
for call in (
    lambda: core.private_grad_sum(loss_fn, params, data, mask, l2_clip=0.5, clipping="ghost"),
    lambda: jax.jit(lambda p: core.private_lot_gradient(
        loss_fn, p, data, lot, jax.random.key(2), clipping="ghost", **step))(params),
):
    try:
        call()
    except ImportError as error:
        print("ImportError:", error)
    else:
        raise AssertionError("ghost clipping ran without flax")
"""


def test_core_imports_and_clips_without_flax_and_ghost_names_the_extra():
    """flax is the optional `ghost` extra: without it, vmap (and "auto", the default) works
    and ghost says what to install."""
    out = subprocess.run(
        [sys.executable, "-c", _WITHOUT_FLAX], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    errors = [line for line in out.stdout.splitlines() if line.startswith("ImportError:")]
    assert len(errors) == 2, out.stdout
    for line in errors:
        assert 'pip install "dpnmt[ghost]"' in line and 'clipping="vmap"' in line, line
