r"""Runs an experiment grid, one `python -m dpnmt.train` process per run.

    python -m dpnmt.sweep --config=configs/tiny.py \
        --grid=eps1,eps5,eps1000,nonprivate --sampling=poisson,shuffle --seeds=3 \
        --workdir=runs/grid [--config.data.max_train_examples=2000 ...]

Runs go to `<workdir>/<privacy>-<sampling>/seed<k>/` in order. Rerunning the
command skips finished runs and resumes an interrupted one from its checkpoint
(the trainer resumes itself). A failed run is recorded, with the tail of its
log, and the sweep goes on; it exits non-zero if any run failed. Extra
`--config.<field>=<value>` flags are passed to every run. Each run draws its
own secret noise seed from the OS (kept in its `private/` folder); the seed in
the folder name is the public `config.seed`. `python -m dpnmt.report` makes
the tables and plots.
"""

import signal
import sys

from absl import app, flags

from dpnmt import cli
from dpnmt.config import RunConfig, check_override_flags
from dpnmt.sweeps import grid, runner

_CONFIG = flags.DEFINE_string("config", None, "Config file, without a :variant (the grid sets it).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Sweep folder; rerun the command to resume.")
_GRID = flags.DEFINE_list("grid", None, "Privacy variants, e.g. eps1,eps5,eps1000,nonprivate.")
_SAMPLING = flags.DEFINE_list("sampling", ["poisson", "shuffle"], "Lot sampling methods.")
_SEEDS = flags.DEFINE_integer("seeds", 1, "Public seeds per cell: config.seed = 0 .. seeds-1.")
_MAX_RUNS = flags.DEFINE_integer(
    "max_runs", None, "Start at most this many runs, then stop (rerun to continue)."
)
_JAX_CACHE = flags.DEFINE_bool(
    "jax_cache",
    True,
    "Share compiled XLA programs between runs via <workdir>/jax_cache (unless "
    "JAX_COMPILATION_CACHE_DIR is set); they hold shapes and σ, no data.",
)


def _parse_flags(argv: list[str]) -> list[str]:
    """Parses the sweep's own flags; `--config.<field>=...` kept for the runs."""
    overrides = [a for a in argv[1:] if a.startswith("--config.")]
    rest = [a for a in argv if not a.startswith("--config.")]
    parsed = cli.parse_flags(rest)
    problems = check_override_flags(overrides, RunConfig.fields())
    try:  # The grid's own flags too: every typo at once.
        grid.expand(_GRID.value or [], _SAMPLING.value or [], _SEEDS.value)
    except ValueError as error:
        problems.append(str(error))
    if problems:
        cli.fail("\n".join(problems))
    return [*parsed, *overrides]


def main(argv):
    """Expands the grid, runs it, prints the summary; exit 1 if a run failed."""
    overrides = [a for a in argv[1:] if a.startswith("--config.")]
    if len(argv) > 1 + len(overrides):
        raise app.UsageError(f"Unexpected arguments: {argv[1 + len(overrides) :]}")
    cli.setup_logging()
    cli.untimed_logging()  # Its lines time each run's attempt: private runs' too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # Stops the running child too.
    try:
        specs = grid.expand(_GRID.value, _SAMPLING.value, _SEEDS.value)
        manifest = runner.run_sweep(
            _CONFIG.value,
            _WORKDIR.value,
            specs,
            overrides,
            max_runs=_MAX_RUNS.value,
            jax_cache=_JAX_CACHE.value,
        )
    except ValueError as error:
        sys.exit(f"dpnmt.sweep: {error}")
    text, failed = runner.status_lines(manifest, specs, _WORKDIR.value)
    print(f"Sweep {_WORKDIR.value} ({len(specs)} runs):\n{text}", flush=True)
    pending = [s for s in specs if manifest["runs"][s.name]["state"] == grid.PENDING]
    if pending:
        print(f"Stopped after --max_runs={_MAX_RUNS.value}; rerun to continue.", flush=True)
    if failed:
        sys.exit("Some runs failed (their logs: <run>/private/train.log; tails in sweep.json).")


if __name__ == "__main__":
    # Here, not at import: importing this module (tests, other apps) must not
    # make these flags required for every absl app in the process.
    flags.mark_flags_as_required(["config", "workdir", "grid"])
    cli.run(main, flags_parser=_parse_flags)
