"""The repository's shape (issue 28): layers, no import cycle, short modules.

The rules and the checks live in `tests/structure_checks.py`; here each runs
on dpnmt, and on a planted violation to show that it can fail.
"""

import pathlib

import pytest

from tests.structure_checks import (
    ALLOWED_LOCAL_CYCLES,
    CONFIG_DICT_EDGES,
    LAYERS,
    MAX_TRAIN_AND_EVALUATE_LINES,
    REPO,
    apps,
    config_dict_readers,
    core_problems,
    find_cycle,
    function_lines,
    imports,
    layer_of,
    layer_problems,
    local_cycles,
    long_modules,
)


def test_print_the_import_graph():
    """Not a check: `pytest -s` prints each module's layer and imports."""
    top, local = imports(REPO)
    app_modules = apps(REPO)
    for name in sorted(top):
        index = layer_of(name, LAYERS, app_modules)
        layer = LAYERS[index][0] if index is not None else "?"
        extra = f" | in functions: {', '.join(sorted(local[name]))}" if local[name] else ""
        print(f"[{layer}] {name} -> {', '.join(sorted(top[name]))}{extra}")
    assert "dpnmt.core.dp_step" in top


def test_no_import_cycle_among_dpnmt_modules():
    top, local = imports(REPO)
    assert find_cycle(top) is None, f"import cycle: {' -> '.join(find_cycle(top))}"
    unlisted = local_cycles(top, local) - ALLOWED_LOCAL_CYCLES.keys()
    assert not unlisted, f"function-local imports closing a cycle: {sorted(unlisted)}"


def test_no_module_imports_a_higher_layer():
    assert layer_problems(REPO) == []


def test_the_apps_are_found_and_nothing_imports_them():
    found = apps(REPO)
    assert {"dpnmt.train", "dpnmt.decode", "dpnmt.audit", "dpnmt.sweep"} <= found
    assert "dpnmt.release" not in found  # A library the export and translate apps call.
    top, local = imports(REPO)
    importers = {(a, b) for g in (top, local) for a in g for b in g[a] if b in found}
    assert not importers


def test_core_imports_nothing_of_dpnmt_nor_io_nor_torch():
    assert core_problems(REPO) == []


def test_no_module_over_450_lines_outside_benchmarks():
    assert long_modules(REPO) == []


def test_train_and_evaluate_is_at_most_80_lines():
    lines = function_lines(REPO / "dpnmt/training/loop.py", "train_and_evaluate")
    assert lines <= MAX_TRAIN_AND_EVALUATE_LINES


def test_config_check_is_gone():
    assert not (REPO / "dpnmt/config_check.py").exists()
    assert not [p for p in (REPO / "dpnmt").rglob("config_check*.py")]


def test_configdict_is_read_only_by_the_config_package():
    readers = config_dict_readers(REPO)
    for path, lines in sorted(readers.items()):
        print(path, *lines, sep="\n  ")
    assert set(readers) <= set(CONFIG_DICT_EDGES), sorted(set(readers) - set(CONFIG_DICT_EDGES))


# ---------------------------------------------------------------- each check can fail


MAIN = "if __name__ == '__main__':\n    pass\n"


def _package(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    """Writes `files` ({"dpnmt/a.py": source}) under `root`, packages included."""
    for relative, source in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(root).parents:
            if str(parent) != ".":
                (root / parent / "__init__.py").touch()
        path.write_text(source)
    return root


def test_planted_cycle_is_found(tmp_path):
    root = _package(
        tmp_path,
        {
            "dpnmt/a.py": "from dpnmt import b\n",
            "dpnmt/b.py": "from . import c\n",
            "dpnmt/c.py": "import dpnmt.a\n",
        },
    )
    top, _ = imports(root)
    assert find_cycle(top) == ["dpnmt.a", "dpnmt.b", "dpnmt.c", "dpnmt.a"]


def test_planted_function_local_cycle_is_found(tmp_path):
    root = _package(
        tmp_path,
        {
            "dpnmt/a.py": "import dpnmt.b\n",
            "dpnmt/b.py": "def f():\n    from dpnmt.a import thing\n",
        },
    )
    top, local = imports(root)
    assert find_cycle(top) is None
    assert local_cycles(top, local) == {("dpnmt.b", "dpnmt.a")}


def test_planted_upward_imports_are_found(tmp_path):
    root = _package(
        tmp_path,
        {
            "dpnmt/core/step.py": "def f():\n    from dpnmt.training import loop\n",
            "dpnmt/training/loop.py": "from dpnmt.core import step\n",
            "dpnmt/train.py": "from dpnmt.training import loop\n" + MAIN,
            "dpnmt/data/reader.py": "from dpnmt import train\n",
        },
    )
    problems = layer_problems(root)
    assert problems == [
        "dpnmt.data.reader (libraries) imports dpnmt.train (apps)",
        "dpnmt.core.step (core) imports (in a function) dpnmt.training.loop (training)",
    ]
    assert layer_problems(_package(tmp_path / "stray", {"dpnmt/stray.py": ""})) == [
        "dpnmt.stray: in no layer; add it to LAYERS"
    ]


def test_planted_core_problems_are_found(tmp_path):
    root = _package(
        tmp_path,
        {
            "dpnmt/core/noise.py": "import jax\nimport os\nimport torch\n"
            "from dpnmt.core import clip\nfrom dpnmt import models\nopen('x')\n",
            "dpnmt/core/clip.py": "import math\n",
            # flax: optional, in ghost alone, and only where its absence is caught.
            "dpnmt/core/ghost.py": "try:\n    import flax.linen as nn\nexcept ImportError:\n"
            "    nn = None\nimport flax\n",
            "dpnmt/core/other.py": "try:\n    import flax\nexcept ImportError:\n    pass\n",
        },
    )
    assert core_problems(root) == [
        "dpnmt.core.ghost:5: imports flax",
        "dpnmt.core.noise:2: imports os",
        "dpnmt.core.noise:3: imports torch",
        "dpnmt.core.noise:5: imports dpnmt",
        "dpnmt.core.noise:6: open() (core does no I/O)",
        "dpnmt.core.other:2: imports flax",
    ]


def test_planted_long_module_and_long_function_are_found(tmp_path):
    body = "def train_and_evaluate():\n" + "    x = 1\n" * 80
    root = _package(
        tmp_path,
        {"dpnmt/training/loop.py": body, "benchmarks/big.py": "x = 1\n" * 500},
    )
    assert function_lines(root / "dpnmt/training/loop.py", "train_and_evaluate") == 81
    assert long_modules(root, limit=80) == ["dpnmt/training/loop.py: 81 lines"]


def test_planted_configdict_reads_are_found(tmp_path):
    app = "from ml_collections import config_flags\n" + MAIN
    root = _package(
        tmp_path,
        {
            "dpnmt/config/run.py": "import ml_collections\nx = config.data.corpus\n",
            "dpnmt/train.py": app,
            "dpnmt/data/reader.py": '"""Set config.data.corpus."""\nx = run.data.corpus\n',
            "dpnmt/data/checks.py": "import ml_collections\ndef f(cfg):\n    return cfg.dp.x\n",
        },
    )
    assert config_dict_readers(root) == {
        "dpnmt/data/checks.py": ["1: import ml_collections", "3: cfg.dp.x"]
    }


@pytest.mark.parametrize("pattern_module", ["dpnmt.evaluation.decode", "dpnmt.evaluation.metrics"])
def test_the_most_specific_pattern_names_the_layer(pattern_module):
    names = [name for name, _ in LAYERS]
    expected = "run clients" if pattern_module.endswith("decode") else "scoring"
    assert names[layer_of(pattern_module, LAYERS, set())] == expected
