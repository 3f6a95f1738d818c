r"""Trains a DP seq2seq translation model.

    python -m dpnmt.train --config=configs/tiny.py:eps8 --workdir=runs/tiny

The logic lives in `dpnmt.training.loop` (a library that is easy to test); this app
only parses flags. Override any config field: `--config.train.num_epochs=3`.
The whole config is checked before anything is written (`dpnmt.training.preflight`);
a bad input prints one line naming the field and the fix (exit status 2).

Several processes (hosts) train one run together on JAX's distributed runtime:
start every process with the same config and a shared --workdir, plus
--coordinator_address=HOST:PORT --num_processes=N --process_id=I (or the
DPNMT_* environment variables; under SLURM, `srun` sets everything). See
`dpnmt.distributed`.

Compiled programs are cached across runs (`--config.train.compilation_cache`:
auto, off or a folder; `dpnmt.training.compilation_cache`), and
`--config.train.profile=True` writes where the run's wall time went
(`dpnmt.training.profile`).
"""

from absl import app, flags
from ml_collections import config_flags

from dpnmt import cli

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Experiment config file, e.g. configs/tiny.py:eps8,shuffle.",
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output folder; rerun to resume.")
_STOP_AFTER = flags.DEFINE_integer(
    "stop_after_steps", None, "End this session after this step (checkpointed); rerun resumes."
)
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "Multi-process: HOST:PORT of process 0's coordinator."
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Multi-process: process count.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "Multi-process: this process's rank.")
_INIT_TIMEOUT = flags.DEFINE_integer(
    "initialization_timeout_s", 300, "Multi-process: seconds to wait for all processes to join."
)
_HEARTBEAT_TIMEOUT = flags.DEFINE_integer(
    "heartbeat_timeout_s",
    100,
    "Multi-process: a process silent this long is declared dead and the others stop "
    "with an error (instead of hanging).",
)


def main(argv):
    """Runs `loop.train_and_evaluate` with the flags' config and workdir."""
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    # Here, not at the top: --help and flag errors answer before JAX and torch load.
    from dpnmt import distributed  # noqa: PLC0415
    from dpnmt.training import compilation_cache, loop, preflight  # noqa: PLC0415

    # The one ConfigDict read: typed sections below.
    run = preflight.read_config(_CONFIG.value, _WORKDIR.value)
    # Before anything compiles: a repeated or resumed run loads its programs.
    compilation_cache.enable(run.train.compilation_cache)
    launch = distributed.resolve_launch(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    distributed.initialize(
        launch,
        initialization_timeout_s=_INIT_TIMEOUT.value,
        heartbeat_timeout_s=_HEARTBEAT_TIMEOUT.value,
    )
    # Process 0 alone logs progress and ε; the others report only problems.
    cli.setup_logging(primary=distributed.is_primary())
    loop.train_and_evaluate(run, _WORKDIR.value, stop_after_steps=_STOP_AFTER.value)


if __name__ == "__main__":
    # Here, not at import: importing this module (tests, other apps) must not
    # make these flags required for every absl app in the process.
    flags.mark_flags_as_required(["config", "workdir"])
    cli.run(main)
