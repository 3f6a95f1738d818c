"""`pip install dpnmt` alone gives a working dpnmt.core: no flax, torch or NMT stack.

A wheel is built from a copy of this checkout and installed into a fresh
virtual environment, its dependencies from the package registry (pinned by
requirements.lock used as a constraints file, so pip's cache serves what CI
already downloaded). There, no distribution of an extra is installed,
dpnmt.core imports and runs a DP step with clipping="vmap", and ghost
clipping (asked for by name) raises one ImportError naming the `ghost` extra. Then
the `ghost` extra is installed from the same wheel: a Flax DP step with ghost
clipping runs and examples/dp_classifier.py trains. Skips only when an install
failed because pip could not connect to the registry (its connection errors,
then no distribution found); any other failure fails the test.
"""

import configparser
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# What dpnmt.core imports (tests/structure_checks.py: CORE_THIRD_PARTY), as distributions.
CORE_REQUIREMENTS = {"jax", "jaxlib", "optax", "chex", "dp-accounting", "numpy", "scipy"}
# Distributions that only an extra may bring (flax and what it pulls; the NMT stack).
EXTRAS_ONLY = (
    "flax",
    "orbax-checkpoint",
    "tensorstore",
    "rich",
    "uvloop",
    "torch",
    "opacus",
    "transformers",
    "datasets",
    "sacrebleu",
    "bert-score",
    "matplotlib",
)

CORE_ONLY = textwrap.dedent(
    f"""
    import importlib.metadata as metadata, json, re, sys
    def name(dist):
        return re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
    installed = sorted(name(d) for d in metadata.distributions())
    extras = sorted(set(installed) & set({EXTRAS_ONLY!r}))
    assert not extras, f"pip install dpnmt pulled {{extras}}"
    requires = metadata.requires("dpnmt")
    flax = [r for r in requires if r.startswith("flax")]
    assert flax and all('extra == "ghost"' in r or 'extra == "nmt"' in r for r in flax), flax
    print("installed:", " ".join(installed))

    import jax, jax.numpy as jnp
    import dpnmt
    from dpnmt import core
    assert not [m for m in sys.modules if m.split(".")[0] in ("flax", "torch")]
    assert dpnmt.__file__.startswith(sys.prefix), dpnmt.__file__  # the installed copy

    def loss_fn(p, ex):  # a two-layer MLP in plain JAX, ONE example
        logits = jnp.tanh(ex["x"] @ p["w1"]) @ p["w2"]
        return -jax.nn.log_softmax(logits)[ex["y"]]
    params = {{"w1": 0.3 * jnp.ones((3, 8)), "w2": 0.3 * jnp.ones((8, 2))}}
    data = {{"x": jax.random.normal(jax.random.key(1), (50, 3)), "y": jnp.arange(50) % 2}}
    lot = core.poisson_lot(jax.random.key(2), 50, 0.2, microbatch_size=8, max_microbatches=4)
    def step(clipping):
        return jax.jit(lambda p, lot: core.private_lot_gradient(
            loss_fn, p, data, lot, jax.random.key(3), l2_clip=1.0, noise_multiplier=1.0,
            expected_lot_size=10.0, clipping=clipping))(params, lot)
    grad = step("vmap")
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grad))
    try:
        step("ghost")
    except ImportError as error:
        assert 'pip install "dpnmt[ghost]"' in str(error), error
    else:
        raise AssertionError("ghost clipping ran without flax")
    print("eps", core.compute_epsilon(1.0, 0.2, 10, 1e-5))
    """
)

GHOST_STEP = textwrap.dedent(
    """
    import flax.linen as nn, jax, jax.numpy as jnp, optax
    from dpnmt import core
    model = nn.Dense(2)
    params = model.init(jax.random.key(0), jnp.zeros((1, 3)))["params"]
    def loss_fn(p, ex):
        return optax.softmax_cross_entropy_with_integer_labels(
            model.apply({"params": p}, ex["x"]), ex["y"])
    data = {"x": jax.random.normal(jax.random.key(1), (50, 3)), "y": jnp.arange(50) % 2}
    lot = core.poisson_lot(jax.random.key(2), 50, 0.2, microbatch_size=8, max_microbatches=4)
    grad = jax.jit(lambda p, lot: core.private_lot_gradient(
        loss_fn, p, data, lot, jax.random.key(3),
        l2_clip=1.0, noise_multiplier=1.0, expected_lot_size=10.0))(params, lot)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grad))
    print("ghost step ok")
    """
)


def _requirement_names(lines: str) -> set[str]:
    names = (re.match(r"[A-Za-z0-9_.\-]+", line.strip()) for line in lines.splitlines())
    return {re.sub(r"[-_.]+", "-", m.group(0)).lower() for m in names if m}


def test_install_requires_is_what_the_core_imports_and_flax_is_an_extra():
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    assert _requirement_names(setup["options"]["install_requires"]) == CORE_REQUIREMENTS
    extras = setup["options.extras_require"]
    assert "flax" in _requirement_names(extras["ghost"])
    assert "flax" in _requirement_names(extras["nmt"])


def _run(cmd, **kwargs):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, **kwargs)


def _copy_project(dest: pathlib.Path) -> pathlib.Path:
    """The files `pip install .` reads, copied so the build leaves the checkout clean."""
    dest.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, dest / name)
    shutil.copytree(ROOT / "dpnmt", dest / "dpnmt", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


# What pip prints when it cannot reach the registry at all (urllib3 / pip messages).
_NETWORK_ERRORS = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name "
    r"resolution|Name or service not known|Network is unreachable|ConnectTimeoutError|"
    r"ReadTimeoutError|ProxyError|Max retries exceeded"
)


def _pip(python: str, *args: str) -> subprocess.CompletedProcess:
    """`pip <args>` constrained by the lock; skips if the registry is unreachable."""
    # --no-compile: no byte-code for modules never imported (CI time); imports write their own.
    no_compile = ["--no-compile"] if args[0] == "install" else []
    done = _run(
        [python, "-m", "pip", *args, "-q", *no_compile, "--disable-pip-version-check"]
        + ["-c", str(ROOT / "requirements.lock")],
        timeout=900,
    )
    if done.returncode != 0:
        if _NETWORK_ERRORS.search(done.stderr) and "No matching distribution" in done.stderr:
            pytest.skip(f"the package registry is unreachable:\n{done.stderr[-2000:]}")
        pytest.fail(f"pip {' '.join(args)} failed:\n{done.stderr[-4000:]}")
    return done


@pytest.mark.slow
def test_core_wheel_alone_installs_no_extra_steps_with_vmap_and_ghost_needs_the_extra(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    project, dist = _copy_project(tmp_path / "project"), tmp_path / "dist"
    _pip(python, "wheel", "--no-deps", "-w", str(dist), str(project))
    (wheel,) = dist.glob("dpnmt-*.whl")
    _pip(python, "install", str(wheel))

    core_only = _run([python, "-c", CORE_ONLY], cwd=tmp_path, timeout=300)
    assert core_only.returncode == 0, core_only.stderr[-4000:]
    print(core_only.stdout.splitlines()[0])  # what `pip install dpnmt` installed (pytest -s)
    assert float(core_only.stdout.split()[-1]) > 0

    _pip(python, "install", f"{wheel}[ghost]")
    ghost = _run([python, "-c", GHOST_STEP], cwd=tmp_path, timeout=300)
    assert ghost.returncode == 0, ghost.stderr[-4000:]
    example = _run(
        [python, str(ROOT / "examples" / "dp_classifier.py"), "--steps", "200"],
        cwd=tmp_path,
        timeout=300,
    )
    assert example.returncode == 0, example.stderr[-4000:]
    match = re.search(r"ε=([\d.]+) .* accuracy=([\d.]+)", example.stdout)
    assert match, example.stdout
    assert 0 < float(match.group(1)) <= 3.0 + 1e-3
    assert float(match.group(2)) > 0.6  # 4 classes: chance is 0.25
