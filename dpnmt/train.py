r"""Trains a DP seq2seq translation model.

    python -m dpnmt.train --config=configs/tiny.py:eps8 --workdir=runs/tiny
    python -m dpnmt.train --workdir=runs/tiny    # resumes: the run's own config.json

Ctrl-C or SIGTERM (what SLURM, Kubernetes and systemd send) finishes the lot
in progress, commits a checkpoint of the state after it, prints the command
that resumes it (this interpreter, and the $DPNMT_DATA_DIR it read, so that it
works when pasted) and exits with status 128 + the signal: 130 for Ctrl-C, 143
for SIGTERM (a second signal stops at once; the lot is then redone on resume;
before the first lot, one signal stops at once). A kill -9 keeps every
committed checkpoint (rerun to resume); a full disk or an unwritable folder
ends in one line naming the path (exit status 2). A second process on the same
--workdir is refused in one line naming the first. A finished run ends with a
few lines for a person: ε, test scores, where the files are; run again, it
says it has already finished and repeats them (nothing compiled, decoded or
rewritten).

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

import logging
import os
import shlex
import signal
import sys

from absl import app, flags
from ml_collections import config_flags

from dpnmt import cli
from dpnmt.errors import ConfigError

INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, as a shell reports Ctrl-C; SIGTERM: 143.
# dpnmt.data.corpora.common.DATA_DIR_ENV (importing it loads `datasets`: not before the flags).
DATA_DIR_ENV = "DPNMT_DATA_DIR"
# `--config=<this>:<workdir>` reads a run's config.json (`--workdir` alone resumes).
_WORKDIR_CONFIG = os.path.join(
    os.path.dirname(os.path.abspath(cli.__file__)), "config", "from_workdir.py"
)

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Experiment config file, e.g. configs/tiny.py:eps8,shuffle; to resume, --workdir alone "
    "reads the run's config.json.",
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
    """Runs `loop.train_and_evaluate` with the flags' config and workdir; Ctrl-C: exit 130."""
    cli.untimed_logging()  # A private run's log is published: no line may time a few lots.
    signal.signal(signal.SIGTERM, _terminated)  # As Ctrl-C: one line, not a silent death.
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if _CONFIG.value is None:  # No config.json to resume from either (`_parse_flags`).
        raise ConfigError(
            f"--config is required for a new run: --workdir={_WORKDIR.value} holds no config.json "
            "(e.g. --config=configs/tiny.py:eps8; --workdir alone resumes a run's own folder)."
        )
    try:
        results = _train()
    except KeyboardInterrupt as stop:
        _interrupted(stop)
    from dpnmt import distributed  # noqa: PLC0415
    from dpnmt.training import summary  # noqa: PLC0415

    if results.get("finished") and distributed.is_primary():
        for line in summary.end_of_run_lines(results, _WORKDIR.value):
            logging.info("%s", line)


def _train() -> dict:
    """Checks the config, starts JAX (and the other processes), trains; the results."""
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
    finished = _finished_results(_WORKDIR.value, run)
    if finished is not None:
        return finished
    return loop.train_and_evaluate(run, _WORKDIR.value, stop_after_steps=_STOP_AFTER.value)


def _terminated(signum, frame) -> None:
    """SIGTERM before the lots (the loop's `StopRequest` handles it during them)."""
    from dpnmt.training import interruption  # noqa: PLC0415

    raise interruption.Stopped(signum)


def _finished_results(workdir: str, run) -> dict | None:
    """results.json of a run that has finished (said in one line), else None.

    Only when the workdir is bound to this config (`api.finished_results`): training
    again would compile, re-decode and rewrite the same results.
    """
    from dpnmt import api  # noqa: PLC0415

    results = api.finished_results(workdir, run)
    if results is None:
        return None
    logging.info(
        "%s has already finished (its results.json): nothing to train, decode or write; "
        "a new run needs another --workdir.",
        workdir,
    )
    return results


def resume_command(argv: list[str], executable: str, data_dir: str | None) -> str:
    """The command that was run, as a shell line that resumes it when pasted.

    Args:
        argv: `sys.argv` (its first item, the program, is replaced by `-m dpnmt.train`).
        executable: The interpreter (`sys.executable`: the venv's, not a bare `python`).
        data_dir: $DPNMT_DATA_DIR as read (None: unset), put first as an absolute path.
    """
    words = [executable, "-m", "dpnmt.train", *argv[1:]]
    prefix = "" if not data_dir else f"{DATA_DIR_ENV}={shlex.quote(os.path.abspath(data_dir))} "
    return prefix + shlex.join(words)


def _resume_command() -> str:
    return resume_command(sys.argv, sys.executable, os.environ.get(DATA_DIR_ENV))


def _interrupted(stop: KeyboardInterrupt) -> None:
    """One line saying where the run stopped and how to resume it; exit status 128 + signal."""
    from dpnmt import distributed  # noqa: PLC0415
    from dpnmt.training import interruption  # noqa: PLC0415
    from dpnmt.training.run_dir import RunDir  # noqa: PLC0415

    status = 128 + getattr(stop, "signum", signal.SIGINT)  # 130: Ctrl-C, 143: SIGTERM.
    if isinstance(stop, interruption.TrainingInterrupted):
        line = (
            f"Interrupted at lot {stop.step} of {stop.num_steps}; the same command resumes from "
            f"lot {stop.step} (checkpoint saved): {_resume_command()}"
        )
        if not distributed.is_primary():  # Initialised: process 0 alone says it.
            sys.exit(status)
    else:  # Before the lots began, or a second Ctrl-C: the lot in progress is not saved.
        step = RunDir(_WORKDIR.value).committed_step()
        start = "the start" if step is None else f"lot {step} (its last checkpoint)"
        line = (
            f"Interrupted; nothing after the last checkpoint is kept: the same command resumes "
            f"from {start}: {_resume_command()}"
        )
    print(f"{cli.program_name()}: {line}", file=sys.stderr, flush=True)
    sys.exit(status)


def _parse_flags(argv):
    """`cli.parse_flags`; without `--config`, a workdir's config.json is the config (resume)."""
    workdir = cli.given(argv[1:], "workdir")
    if not argv[1:]:  # No flags at all: an example, not absl's "must have a value".
        cli.fail(
            "--workdir is required, e.g. python -m dpnmt.train --config=configs/first_run.py "
            "--workdir=runs/multi30k (a new run; configs/ holds the others), or "
            "--workdir=runs/multi30k alone (resumes it). --help lists every flag."
        )
    if cli.given(argv[1:], "config") is None and workdir:
        if os.path.isfile(os.path.join(workdir, "config.json")):
            argv = [argv[0], f"--config={_WORKDIR_CONFIG}:{workdir}", *argv[1:]]
    return cli.parse_flags(argv)


if __name__ == "__main__":
    # Here, not at import: importing this module (tests, other apps) must not
    # make these flags required for every absl app in the process.
    flags.mark_flags_as_required(["workdir"])
    cli.run(main, flags_parser=_parse_flags)
