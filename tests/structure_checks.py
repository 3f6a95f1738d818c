"""Static checks of the repository's shape (issue 28), used by tests/test_structure_layers.py.

Every module of `dpnmt/` is read with `ast` (nothing is imported). Each check
is a function of a source root, so the tests also run it on a planted
violation (a small package under `tmp_path`) to show that it can fail.
"""

import ast
import fnmatch
import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]

# The layers, low to high. A module imports only modules of its own layer or a
# lower one: following the configuration from an app to the DP step goes down
# and never climbs back. Patterns are dotted module names (`fnmatch`); the most
# specific one names a module's layer (no `*` first, then the longest), so
# `dpnmt.evaluation.decode` is a client of a trained run although the rest of
# `dpnmt.evaluation` scores a model below training. Apps (modules ending in
# `if __name__ == "__main__":`) are the top layer wherever they live.
LAYERS = (
    # The pure DP-SGD library: imports no other part of dpnmt (checked below).
    ("core", ("dpnmt.core", "dpnmt.core.*")),
    # Leaves every layer may use: the package, error collection, atomic writes, the cache folder.
    (
        "base",
        (
            "dpnmt",
            "dpnmt.errors",
            "dpnmt.atomic_file",
            "dpnmt.cache_dir",
            "dpnmt.fault_points",
            "dpnmt.manifest",
        ),
    ),
    # The ConfigDict edge (`config_lib` builds it) and the typed sections.
    ("config", ("dpnmt.config", "dpnmt.config.*", "dpnmt.config_lib")),
    # One job each, given a section or plain values: corpora and tokenizers,
    # models, the torch bridge, the privacy plan, multi-process helpers, and
    # published names (`public_corpus` parses `data.corpus`: data's peer).
    (
        "libraries",
        (
            "dpnmt.data",
            "dpnmt.data.*",
            "dpnmt.models",
            "dpnmt.models.*",
            "dpnmt.bridge",
            "dpnmt.bridge.*",
            "dpnmt.privacy",
            "dpnmt.planning",
            "dpnmt.sigma_hints",
            "dpnmt.distributed",
            "dpnmt.public_names",
            "dpnmt.decode_folders",
        ),
    ),
    # Scoring a model (used by training's validation) and the audit's pure parts.
    (
        "scoring",
        (
            "dpnmt.evaluation",
            "dpnmt.evaluation.*",
            "dpnmt.auditing.canaries",
            "dpnmt.auditing.options",
            "dpnmt.auditing.statistics",
        ),
    ),
    # Builds a run, owns its workdir, runs the loop.
    ("training", ("dpnmt.training", "dpnmt.training.*")),
    # Clients of `training`: decode, audit, sweep, report or release a run.
    (
        "run clients",
        (
            "dpnmt.evaluation.decode",
            "dpnmt.evaluation.noise_to_signal",
            "dpnmt.auditing",
            "dpnmt.auditing.run",
            "dpnmt.auditing.scoring",
            "dpnmt.auditing.memorization",
            "dpnmt.sweeps",
            "dpnmt.sweeps.*",
            "dpnmt.release",
            "dpnmt.model_card",
            "dpnmt.api",
        ),
    ),
    # The apps' shared flag parsing and one-line errors; the decoding flags two apps share.
    ("cli", ("dpnmt.cli", "dpnmt.decoding_flags")),
    # absl apps: parse flags, call one library function (found, not listed).
    ("apps", ()),
)

# (importer, imported) pairs that climb a layer, each with its reason. Empty:
# a new entry needs a reason the lead accepts.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}

# Function-local imports that close an import cycle, each with its reason.
ALLOWED_LOCAL_CYCLES: dict[tuple[str, str], str] = {}

# What dpnmt.core may import besides itself: `install_requires` and the
# standard library less its file, network and process modules.
CORE_THIRD_PARTY = {"jax", "jaxlib", "optax", "chex", "dp_accounting", "numpy", "scipy"}
# Optional extras of the core, each imported by the modules named only, and only inside
# a `try:` that catches ImportError, so that `import dpnmt.core` works without it.
CORE_OPTIONAL = {
    "flax": ("dpnmt.core.ghost", "dpnmt.core.ghost_nnx", "dpnmt.core.private_grad_nnx")
}
CORE_FORBIDDEN_STDLIB = {
    "os",
    "io",
    "pathlib",
    "shutil",
    "tempfile",
    "glob",
    "json",
    "pickle",
    "csv",
    "sqlite3",
    "subprocess",
    "socket",
    "urllib",
    "http",
}

MAX_MODULE_LINES = 450
MAX_TRAIN_AND_EVALUATE_LINES = 80

# ConfigDict reads by key (`config.data.corpus`) and ml_collections imports are
# the business of dpnmt/config/ and dpnmt/config_lib.py; apps may import
# `ml_collections.config_flags` for `--config`. After parsing, the rest reads
# typed sections (`run.data.corpus`).
CONFIG_KEY_READ = re.compile(r"\b(config|cfg)\.(data|train|dp|model|eval|tokenizer)\.[a-z_]+")
CONFIG_OWNERS = ("dpnmt/config/", "dpnmt/config_lib.py")
# The edges besides those: where a ConfigDict is still in hand by design.
CONFIG_DICT_EDGES = {
    "dpnmt/training/preflight.py": "read_config: the apps' --config becomes a RunConfig, once",
    "dpnmt/sweeps/grid.py": "builds each grid cell's ConfigDict from flags, then RunConfig.of",
}


# ---------------------------------------------------------------- the parsing


def modules(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """Every module of the `dpnmt` package under `root`, by dotted name."""
    out = {}
    for path in sorted((root / "dpnmt").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imported_names(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement may load (module, or module.name)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:  # Relative: from the module's package, `level - 1` up.
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        origin = ".".join(base + ([node.module] if node.module else []))
    else:
        origin = node.module or ""
    return [origin] + [f"{origin}.{alias.name}" for alias in node.names]


def _resolve(name: str, known: dict) -> str | None:
    """The longest prefix of `name` that is a known module (`a.b.func` -> `a.b`)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(root: pathlib.Path) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module-level imports, function-local imports) among dpnmt modules.

    An import inside a function (or lambda) runs only when called; one anywhere
    else (module body, class body, `if`, `try`) runs on import. `from a import
    b` counts `a.b` when it is a module, else `a`.
    """
    known = modules(root)
    top = {name: set() for name in known}
    local = {name: set() for name in known}

    def visit(node, module, is_package, in_function):
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            )
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                names = _imported_names(child, module, is_package)
                if isinstance(child, ast.ImportFrom):
                    # `from a import b`: `a.b` if it is a module, else `a` itself.
                    origin, *members = names
                    names = [m if m in known else origin for m in members]
                for name in names:
                    target = _resolve(name, known)
                    if target is not None and target != module:
                        (local if inside else top)[module].add(target)
            visit(child, module, is_package, inside)

    for name, path in known.items():
        visit(ast.parse(path.read_text()), name, path.name == "__init__.py", False)
    for name in known:
        local[name] -= top[name]
    return top, local


def apps(root: pathlib.Path) -> set[str]:
    """Modules that end in `if __name__ == "__main__":` (absl apps)."""
    found = set()
    for name, path in modules(root).items():
        for node in ast.parse(path.read_text()).body:
            test = getattr(node, "test", None)
            if (
                isinstance(node, ast.If)
                and isinstance(test, ast.Compare)
                and isinstance(test.left, ast.Name)
                and test.left.id == "__name__"
            ):
                found.add(name)
    return found


def layer_of(module: str, layers, app_modules: set[str]) -> int | None:
    if module in app_modules:
        return len(layers) - 1
    matches = [
        (("*" not in pattern), len(pattern), index)
        for index, (_, patterns) in enumerate(layers)
        for pattern in patterns
        if fnmatch.fnmatchcase(module, pattern)
    ]
    return max(matches)[2] if matches else None


# ---------------------------------------------------------------- the checks


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (a -> ... -> a), or None."""
    done, path = set(), []

    def visit(node):
        if node in path:
            return path[path.index(node) :] + [node]
        if node in done:
            return None
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            cycle = visit(nxt)
            if cycle:
                return cycle
        path.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        cycle = visit(node)
        if cycle:
            return cycle
    return None


def _reaches(graph, start, goal) -> bool:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node == goal:
            return True
        if node not in seen:
            seen.add(node)
            todo.extend(graph.get(node, ()))
    return False


def local_cycles(top, local) -> set[tuple[str, str]]:
    """Function-local imports a -> b where b leads back to a (any imports)."""
    both = {name: top[name] | local[name] for name in top}
    return {(a, b) for a in local for b in local[a] if _reaches(both, b, a)}


def layer_problems(root: pathlib.Path, layers=LAYERS) -> list[str]:
    """A line for each module without a layer and each import that climbs one."""
    top, local = imports(root)
    app_modules = apps(root)
    layer = {name: layer_of(name, layers, app_modules) for name in top}
    problems = [
        f"{name}: in no layer; add it to LAYERS" for name, index in layer.items() if index is None
    ]
    for kind, graph in (("imports", top), ("imports (in a function)", local)):
        for importer, imported in sorted((a, b) for a in graph for b in graph[a]):
            low, high = layer[importer], layer[imported]
            if low is None or high is None or (importer, imported) in ALLOWED_UPWARD:
                continue
            if high > low or (imported in app_modules):
                problems.append(
                    f"{importer} ({layers[low][0]}) {kind} {imported} ({layers[high][0]})"
                )
    return problems


def core_problems(root: pathlib.Path) -> list[str]:
    """dpnmt.core's imports outside itself, its stdlib and install_requires; `open(`."""
    allowed = (set(sys.stdlib_module_names) - CORE_FORBIDDEN_STDLIB) | CORE_THIRD_PARTY
    problems = []
    for name, path in modules(root).items():
        if not (name == "dpnmt.core" or name.startswith("dpnmt.core.")):
            continue
        tree = ast.parse(path.read_text())
        guarded = {
            id(node)
            for trial in ast.walk(tree)
            if isinstance(trial, ast.Try)
            and any(_catches_import_error(handler.type) for handler in trial.handlers)
            for statement in trial.body
            for node in ast.walk(statement)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                targets = [] if node.level else [node.module or ""]
            else:
                is_open = isinstance(node, ast.Call) and getattr(node.func, "id", "") == "open"
                targets = []
                if is_open:
                    problems.append(f"{name}:{node.lineno}: open() (core does no I/O)")
            for target in targets:
                in_core = target == "dpnmt.core" or target.startswith("dpnmt.core.")
                top = target.split(".")[0]
                if in_core or top in allowed:
                    continue
                if name in CORE_OPTIONAL.get(top, ()) and id(node) in guarded:
                    continue
                problems.append(f"{name}:{node.lineno}: imports {target}")
    return problems


def _catches_import_error(handler_type: ast.expr | None) -> bool:
    names = handler_type.elts if isinstance(handler_type, ast.Tuple) else [handler_type]
    return any(
        isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError") for n in names
    )


def long_modules(root: pathlib.Path, limit: int = MAX_MODULE_LINES) -> list[str]:
    """Python files under `root` over `limit` lines, outside benchmarks/."""
    out = []
    for top in ("dpnmt", "tests", "examples", "configs"):
        for path in sorted((root / top).rglob("*.py")):
            lines = len(path.read_text().splitlines())
            if lines > limit:
                out.append(f"{path.relative_to(root)}: {lines} lines")
    return out


def function_lines(path: pathlib.Path, name: str) -> int:
    """Lines of the top-level function `name` of `path`, `def` to its last line."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node.end_lineno - node.lineno + 1
    raise AssertionError(f"{path} has no function {name}")


def config_dict_readers(root: pathlib.Path) -> dict[str, list[str]]:
    """Files (relative) outside the config owners reading a ConfigDict: what they do.

    Counts code only (strings and comments are not read): attribute chains
    matching CONFIG_KEY_READ, and ml_collections imports (an app's
    `from ml_collections import config_flags` excepted).
    """
    app_modules = apps(root)
    out = {}
    for name, path in modules(root).items():
        relative = path.relative_to(root).as_posix()
        if relative.startswith(CONFIG_OWNERS):
            continue
        found = []
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and CONFIG_KEY_READ.fullmatch(ast.unparse(node)):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("ml_collections")]
                found += [f"{node.lineno}: import {name}" for name in names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "ml_collections"
            ):
                flags_only = [a.name for a in node.names] == ["config_flags"]
                if not (name in app_modules and flags_only):
                    found.append(f"{node.lineno}: from {node.module} import ...")
        if found:
            out[relative] = found
    return out
