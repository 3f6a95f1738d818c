"""Multi-process training on JAX's distributed runtime: launch, roles, sharing secrets.

One training run may span several processes (hosts), each driving its local
devices, joined by `jax.distributed` into one global mesh. Privacy semantics
do not change: every process draws the SAME Poisson lot (from one secret seed),
feeds only its rows of each micro-batch, XLA all-reduces the clipped-gradient
sum inside the jitted step, and the noise is drawn once on that replicated sum
from a replicated key.

The workdir must be a filesystem shared by all processes (checkpoints are
written collectively by orbax; process 0 alone writes everything else).
"""

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping
from typing import TypeVar

import jax
import numpy as np
from jax.experimental import multihost_utils

Result = TypeVar("Result")

# Environment variables read when the flags are absent. JAX_COORDINATOR_ADDRESS
# is JAX's own; JOB_COMPLETION_INDEX is set by Kubernetes Indexed Jobs.
ENV_COORDINATOR = ("DPNMT_COORDINATOR_ADDRESS", "JAX_COORDINATOR_ADDRESS")
ENV_NUM_PROCESSES = ("DPNMT_NUM_PROCESSES",)
ENV_PROCESS_ID = ("DPNMT_PROCESS_ID", "JOB_COMPLETION_INDEX")
SLURM_VARIABLES = ("SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_STEP_NODELIST")


@dataclasses.dataclass(frozen=True)
class Launch:
    """How this process joins a multi-process run.

    Attributes:
      coordinator_address: "host:port" of process 0's coordination service, or
        None to let JAX detect it from the cluster (SLURM).
      num_processes: processes in the run, or None (detected).
      process_id: this process's rank in [0, num_processes), or None (detected).
      source: where the settings came from ("flags", "environment", "slurm").
    """

    coordinator_address: str | None
    num_processes: int | None
    process_id: int | None
    source: str


def _first(environ: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    return next((environ[name] for name in names if environ.get(name)), None)


def resolve_launch(
    coordinator_address: str | None,
    num_processes: int | None,
    process_id: int | None,
    environ: Mapping[str, str] | None = None,
) -> Launch | None:
    """Decides whether (and how) to start `jax.distributed`.

    Flags win; then `DPNMT_COORDINATOR_ADDRESS` (or `JAX_COORDINATOR_ADDRESS`),
    `DPNMT_NUM_PROCESSES` and `DPNMT_PROCESS_ID` (or Kubernetes'
    `JOB_COMPLETION_INDEX`); then a SLURM step of more than one task, whose
    settings JAX reads itself. Anything else is a single-process run.

    Args:
      coordinator_address: `--coordinator_address`, or None.
      num_processes: `--num_processes`, or None.
      process_id: `--process_id`, or None.
      environ: the environment (default `os.environ`).

    Returns:
      A `Launch`, or None for a single-process run.

    Raises:
      ValueError: an incomplete or inconsistent set of settings.
    """
    environ = os.environ if environ is None else environ
    given = {
        "coordinator_address": coordinator_address,
        "num_processes": num_processes,
        "process_id": process_id,
    }
    source = "flags"
    if all(value is None for value in given.values()):
        coordinator = _first(environ, ENV_COORDINATOR)
        number = _first(environ, ENV_NUM_PROCESSES)
        if coordinator is None and number is None:  # A rank alone starts nothing.
            slurm = all(name in environ for name in SLURM_VARIABLES)
            if slurm and int(environ["SLURM_NTASKS"]) > 1:
                return Launch(None, None, None, "slurm")
            return None
        rank = _first(environ, ENV_PROCESS_ID)
        source = "environment"
        given = {
            "coordinator_address": coordinator,
            "num_processes": None if number is None else int(number),
            "process_id": None if rank is None else int(rank),
        }
    missing = [name for name, value in given.items() if value is None]
    if missing:
        raise ValueError(
            f"multi-process launch from {source} lacks {missing}: give all of "
            "--coordinator_address, --num_processes and --process_id (or their "
            "DPNMT_* environment variables), or none for a single-process run."
        )
    if given["num_processes"] < 1 or not 0 <= given["process_id"] < given["num_processes"]:
        raise ValueError(
            f"--process_id={given['process_id']} must lie in [0, --num_processes="
            f"{given['num_processes']})."
        )
    return Launch(given["coordinator_address"], given["num_processes"], given["process_id"], source)


def single_process_problems(app_name: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """A problem when the environment asks for a multi-process launch of a single-process app.

    Such an app never joins `jax.distributed`: each process would run alone
    as process 0 of 1, draw its own secret choices and write the same
    workdir.

    Args:
      app_name: the app, e.g. "dpnmt.memorization".
      environ: the environment (default `os.environ`).
    """
    try:
        launch = resolve_launch(None, None, None, environ)
    except ValueError as error:
        return [f"{app_name} runs on one process; the environment is set up for several: {error}"]
    if launch is None:
        return []
    fix = (
        "start it once, outside `srun` (one task)"
        if launch.source == "slurm"
        else f"unset {', '.join(ENV_COORDINATOR + ENV_NUM_PROCESSES)} and start it once"
    )
    return [f"{app_name} runs on one process, but the environment launches several: {fix}."]


def initialize(
    launch: Launch | None,
    *,
    initialization_timeout_s: int = 300,
    heartbeat_timeout_s: int = 100,
) -> None:
    """Starts `jax.distributed` for `launch` (nothing for None); call before any JAX use.

    Args:
      launch: from `resolve_launch`.
      initialization_timeout_s: how long to wait for every process to join.
      heartbeat_timeout_s: a process silent this long is declared dead and the
        coordination service terminates the others with an error naming it
        (instead of leaving them blocked in a collective).
    """
    if launch is None:
        return
    # CPU collectives across processes need an implementation (gloo); GPUs and
    # TPUs use their own. Set explicitly so a changed default cannot hang us.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=launch.coordinator_address,
        num_processes=launch.num_processes,
        process_id=launch.process_id,
        initialization_timeout=initialization_timeout_s,
        heartbeat_timeout_seconds=heartbeat_timeout_s,
    )
    logging.info(
        "jax.distributed (%s): process %d of %d, %d local of %d devices.",
        launch.source,
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )


def is_primary() -> bool:
    """True on process 0, the only one that logs, reports ε and writes files."""
    return jax.process_index() == 0


def broadcast_int(value: int | None) -> int:
    """Process 0's non-negative `value` (below 2**256), on every process.

    Sent as eight 32-bit words (JAX's default int width is 32 bits), so a
    128-bit secret seed arrives whole. On one process this returns `value`.
    """
    if jax.process_count() == 1:
        return int(value)
    words = np.zeros(_BROADCAST_WORDS, np.uint32)
    if is_primary():
        if not 0 <= int(value) < 2 ** (32 * _BROADCAST_WORDS):
            bits = int(value).bit_length()
            raise ValueError(f"broadcast_int takes [0, 2**256), got a {bits}-bit value.")
        words[:] = [(int(value) >> (32 * i)) & 0xFFFFFFFF for i in range(_BROADCAST_WORDS)]
    words = np.asarray(multihost_utils.broadcast_one_to_all(words))
    return sum(int(word) << (32 * i) for i, word in enumerate(words))


_BROADCAST_WORDS = 8


def on_primary(fn: Callable[[], Result], what: str) -> Result | None:
    """Runs `fn` on process 0 only; every process learns whether it succeeded.

    Args:
      fn: the work (e.g. writing a file to the shared workdir).
      what: a few words naming it, for the error on the other processes.

    Returns:
      `fn()` on process 0, None elsewhere.

    Raises:
      RuntimeError: on the other processes, when `fn` raised on process 0
        (which re-raises its own exception).
    """
    if jax.process_count() == 1:
        return fn()
    result, failed = None, False
    if is_primary():
        try:
            result = fn()
        except BaseException:
            failed = True
            multihost_utils.broadcast_one_to_all(np.ones((), np.int32))
            raise
    if not failed:
        flag = multihost_utils.broadcast_one_to_all(np.zeros((), np.int32))
        if int(flag) and not is_primary():
            raise RuntimeError(f"process 0 failed while {what}; see its log for the error.")
    return result


def agree(value: bool) -> bool:
    """Process 0's `value` on every process (decisions that must not diverge)."""
    if jax.process_count() == 1:
        return bool(value)
    return bool(multihost_utils.broadcast_one_to_all(np.asarray(bool(value), np.int32)))


def local_mesh():
    """A data mesh over this process's devices only (process-local evaluation)."""
    from dpnmt import bridge  # Deferred: bridge imports torch.

    return bridge.make_data_mesh(jax.local_devices())


def to_local(tree, mesh):
    """Replicated global arrays as copies replicated on `mesh` (this process's devices).

    On one process the arrays already live there and are returned unchanged.
    """
    if jax.process_count() == 1:
        return tree
    from dpnmt import bridge  # Deferred: bridge imports torch.

    sharding = bridge.replicated_sharding(mesh)
    return jax.tree.map(lambda a: jax.device_put(a.addressable_data(0), sharding), tree)


class NullWriter:
    """Stands in for the metrics writer on processes other than 0."""

    def write(self, step: int, scalars: dict) -> None:
        """Drops the scalars."""

    def close(self) -> None:
        """Nothing to close."""
