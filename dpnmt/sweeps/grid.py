"""An experiment grid: its runs, their folders and configs, and the sweep's manifest.

Pure bookkeeping shared by `dpnmt.sweep` (which runs the grid) and
`dpnmt.report` (which summarises it). A run is one (privacy variant, sampling,
public seed) cell, trained in `<workdir>/<privacy>-<sampling>/seed<k>/`. The
manifest `<workdir>/sweep.json` records the grid and each run's state.
"""

import dataclasses
import json
import os
from collections.abc import Sequence

import ml_collections
from absl import flags
from ml_collections import config_flags

from dpnmt import atomic_file, config_lib
from dpnmt.config import RunConfig
from dpnmt.errors import ConfigError, raise_problems

MANIFEST_FILE = "sweep.json"
# The run's output, in its private/ folder: log lines carry timestamps, which
# would time every few lots (the realised lot sizes), and the command line.
TRAIN_LOG = os.path.join("private", "train.log")
# The tail of a failed attempt's log (may quote private data: never in sweep.json).
ERROR_TAIL = os.path.join("private", "last_error.txt")
# The runs' shared XLA cache, in the sweep folder (compiled shapes may depend on lots).
JAX_CACHE = os.path.join("private", "jax_cache")
PENDING, RUNNING, FINISHED, FAILED = "pending", "running", "finished", "failed"
INTERRUPTED = "interrupted"  # The sweep was stopped while this run trained.
TRAIN_INTERRUPTED_EXIT = 130  # `dpnmt.train`'s exit status after a Ctrl-C (checkpointed).
# Fields a grid cell sets: overriding them would make the run's folder name lie.
GRID_FIELDS = ("seed", "variant", "dp.enabled", "dp.target_epsilon", "dp.sampling")
# ...and dp.noise_multiplier, which would replace the target ε the grid sets.
REFUSED_FIELDS = (*GRID_FIELDS, "dp.noise_multiplier")


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One cell of the grid.

    Attributes:
      privacy: privacy variant name ("eps1", ..., "nonprivate").
      sampling: "poisson" or "shuffle".
      seed: the public `config.seed` (init, dropout); the noise seed is private.
    """

    privacy: str
    sampling: str
    seed: int

    @property
    def cell(self) -> str:
        """The (privacy, sampling) cell that seeds are aggregated over."""
        return f"{self.privacy}-{self.sampling}"

    @property
    def name(self) -> str:
        """The run's folder relative to the sweep's workdir."""
        return f"{self.cell}/seed{self.seed}"

    @property
    def variant(self) -> str:
        """The config file's `:variant` string."""
        return f"{self.privacy},{self.sampling}"


def expand(privacy: Sequence[str], sampling: Sequence[str], num_seeds: int) -> list[RunSpec]:
    """The runs of a grid in the order they are trained (privacy, sampling, seed).

    Args:
      privacy: privacy variant names, e.g. ["eps1", "eps5", "eps1000", "nonprivate"].
      sampling: sampling names, a subset of ["poisson", "shuffle"].
      num_seeds: public seeds 0 .. num_seeds - 1 per cell.

    Returns:
      One `RunSpec` per (privacy, sampling, seed).

    Raises:
      ValueError: an empty or repeated list, an unknown name, num_seeds < 1.
    """
    problems = []  # Every bad flag at once.
    for flag, names, valid in (
        ("--grid", privacy, tuple(config_lib.PRIVACY_VARIANTS)),
        ("--sampling", sampling, config_lib.SAMPLING_VARIANTS),
    ):
        unknown = [n for n in names if n not in valid]
        if not names:
            problems.append(f"{flag} is empty; give some of {list(valid)}.")
        elif unknown:
            problems.append(f"{flag} has unknown names {unknown}; valid: {list(valid)}.")
        elif len(set(names)) != len(names):
            problems.append(f"{flag}={','.join(names)} repeats a name; give each once.")
    if num_seeds < 1:
        problems.append(f"--seeds={num_seeds} must be >= 1.")
    if problems:
        raise ValueError(" ".join(problems))
    return [RunSpec(p, s, k) for p in privacy for s in sampling for k in range(num_seeds)]


def check_overrides(overrides: Sequence[str]) -> list[str]:
    """Checks `--config.a.b=value` strings passed to every run.

    A fixed noise seed is judged per run by `config_lib.check_noise_seed` (the
    trainer's one rule), in `check_configs`.

    Returns:
      Warnings to log (the test-only fixed-seed switch: the runs have no guarantee).

    Raises:
      ValueError: an override not of the form `--config.a.b=value`, or one of a
        field the grid sets (`REFUSED_FIELDS`).
    """
    warnings = []
    for text in overrides:
        if not text.startswith("--config.") or "=" not in text:
            raise ValueError(f"Override {text!r}: write --config.<field>=<value>.")
        field = text[len("--config.") : text.index("=")]
        if field in REFUSED_FIELDS:
            raise ValueError(
                f"Override {text!r} sets {field}, which the grid varies (--grid, --sampling, "
                "--seeds); drop it."
            )
        if field == config_lib.FIXED_SEED_SWITCH:
            warnings.append(
                f"{text}: every run shares one fixed noise seed; its results have no "
                "guarantee (ε = ∞); for tests only."
            )
    return warnings


def check_configs(configs: dict[RunSpec, RunConfig]) -> None:
    """Applies the trainer's fixed-seed and model-files rules to every run before any starts.

    Raises:
      ValueError: a private run with a fixed `noise_seed` and no test-only switch.
      ConfigError: a pretrained model whose files cannot be had here
        (`training.preflight.model_files_problems`), before the sweep writes its folder.
    """
    for spec, config in configs.items():
        try:
            config_lib.check_noise_seed(config)
        except ValueError as error:
            raise ValueError(f"Run {spec.name}: {error}") from None
    if any(run.model.name_or_path is not None for run in configs.values()):
        # Here: jax loads with it, and only a pretrained model needs it.
        from dpnmt.training.preflight import model_files_problems  # noqa: PLC0415

        problems = {p: None for run in configs.values() for p in model_files_problems(run)}
        raise_problems(list(problems))


def published_overrides(overrides: Sequence[str]) -> list[str]:
    """`overrides` as recorded in the published sweep.json: a noise seed's value removed."""
    return [
        "--config.noise_seed=<private>" if text.startswith("--config.noise_seed=") else text
        for text in overrides
    ]


def train_flags(config_path: str, spec: RunSpec, run_dir: str, overrides: Sequence[str]):
    """The `python -m dpnmt.train` flags of one run (the seed last, so it wins)."""
    return [
        f"--config={config_path}:{spec.variant}",
        f"--workdir={run_dir}",
        *overrides,
        f"--config.seed={spec.seed}",
    ]


def resolve_config(config_path: str, spec: RunSpec, overrides: Sequence[str]) -> RunConfig:
    """The config `dpnmt.train` builds for this run, parsed exactly as its flags are.

    The ConfigDict the flags build is this edge's alone: the run gets it as a
    `RunConfig` (unchecked; each run's trainer checks it before anything is written).

    Raises:
      ValueError: the config file or an override does not parse (absl's message).
    """
    base = _parse(config_path, spec, [])
    for text in overrides:
        node, field = base, text[len("--config.") : text.index("=")]
        for part in field.split("."):
            if not isinstance(node, ml_collections.ConfigDict) or part not in node:
                raise ValueError(f"Override {text!r}: {config_path} has no field {field!r}.")
            node = node[part]
    return RunConfig.of(_parse(config_path, spec, overrides))


def _parse(config_path: str, spec: RunSpec, overrides: Sequence[str]):
    argv = ["dpnmt.train", *train_flags(config_path, spec, "unused", overrides)]
    argv = [a for a in argv if not a.startswith("--workdir=")]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file(
        "config", None, "", flag_values=values, lock_config=True, sys_argv=argv
    )
    try:
        values(argv)
        return values.config
    except (flags.Error, ValueError, AttributeError, KeyError, OSError) as error:
        raise ValueError(
            f"--config={config_path}:{spec.variant} with overrides {list(overrides)} does "
            f"not parse: {error}"
        ) from error


def read_json(path: str) -> dict | None:
    """The JSON object in `path`, or None if it is missing or unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def is_finished(run_dir: str, config: RunConfig) -> bool:
    """True if `run_dir` holds a finished run of exactly `config`.

    Finished means its results.json says so and its config.json is this config
    (a folder trained with other settings is not this run).
    """
    results = read_json(os.path.join(run_dir, "results.json"))
    if not results or results.get("finished") is not True:
        return False
    published = config_lib.published_config(config)  # config.json holds no noise seed.
    return read_json(os.path.join(run_dir, "config.json")) == published


def write_manifest(workdir: str, manifest: dict) -> None:
    """Writes `sweep.json` atomically (a killed sweep never leaves half a file)."""
    text = json.dumps(manifest, indent=2, sort_keys=True)
    atomic_file.write_atomic(os.path.join(workdir, MANIFEST_FILE), text)


def read_manifest(workdir: str) -> dict:
    """The sweep manifest of `workdir`.

    Raises:
      ConfigError: no sweep.json there (naming the folder); a ValueError.
    """
    manifest = read_json(os.path.join(workdir, MANIFEST_FILE))
    if manifest is None:
        raise ConfigError(
            f"{workdir} has no readable {MANIFEST_FILE}; give the --workdir of a "
            "`python -m dpnmt.sweep` run."
        )
    return manifest
