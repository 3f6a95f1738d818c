"""Runs a sweep's grid: one `python -m dpnmt.train` process per run, states in sweep.json.

Each run trains in its own folder under the sweep's workdir; a rerun skips
finished runs and resumes the others (`grid.is_finished`).
"""

import fcntl
import os
import subprocess
import sys
import time

from absl import logging

import dpnmt
from dpnmt import atomic_file
from dpnmt.errors import raise_problems
from dpnmt.sweeps import grid
from dpnmt.training import compilation_cache
from dpnmt.training.run_dir import CHECKPOINT_DIR, CONFIG_FILE, TOKENIZER_FILE

TAIL_LINES = 40  # Lines of a failed run's log kept in its private/last_error.txt.


def child_env(workdir: str, jax_cache: bool) -> dict:
    """The environment of each run: this sweep's dpnmt first on the path, the XLA cache."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(dpnmt.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    if not jax_cache:
        env[compilation_cache.ENV_VAR] = compilation_cache.OFF
        env.pop("JAX_COMPILATION_CACHE_DIR", None)
    elif "JAX_COMPILATION_CACHE_DIR" not in env:
        # Under private/: which shapes compile can depend on private lot content.
        env["JAX_COMPILATION_CACHE_DIR"] = os.path.abspath(os.path.join(workdir, grid.JAX_CACHE))
    return env


def _log_tail(path: str, offset: int) -> str:
    """The last `TAIL_LINES` lines written to `path` after byte `offset`."""
    with open(path, "rb") as f:
        f.seek(offset)
        text = f.read().decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-TAIL_LINES:])


def train_one(command: list[str], run_dir: str, env: dict) -> tuple[int, str]:
    """Runs one training process, its output appended to `run_dir/private/train.log`.

    The run's lock file stays locked while the process lives (it inherits the
    descriptor), so a second sweep never trains the same folder at once, even
    if this sweep was killed and left the process running.

    Returns:
      (exit status, the tail of this attempt's log); status -1 if the run is
      locked by another live process.
    """
    os.makedirs(run_dir, exist_ok=True)
    lock = open(os.path.join(run_dir, ".sweep.lock"), "w")  # noqa: SIM115
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return -1, f"{run_dir} is locked: another process is training it; wait or stop it."
        log_path = os.path.join(run_dir, grid.TRAIN_LOG)
        atomic_file.make_private_folder(os.path.dirname(log_path))
        with open(log_path, "ab") as log:
            offset = log.tell()
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(command)}\n".encode())
            log.flush()
            process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, pass_fds=(lock.fileno(),)
            )
            try:
                status = process.wait()
            except BaseException:  # Interrupted sweep: stop the run too (it resumes later).
                process.terminate()
                process.wait()
                raise
        return status, _log_tail(log_path, offset)
    finally:
        lock.close()


def run_sweep(
    config_path: str,
    workdir: str,
    specs: list[grid.RunSpec],
    overrides: list[str],
    *,
    max_runs: int | None = None,
    jax_cache: bool = True,
) -> dict:
    """Trains every unfinished run of `specs` in order, recording states in sweep.json.

    Args:
      config_path: the config file (no `:variant`).
      workdir: the sweep folder.
      specs: the runs, from `grid.expand`.
      overrides: `--config.<field>=<value>` flags for every run.
      max_runs: start at most this many runs (finished ones skipped do not count).
      jax_cache: share compiled programs between runs (`child_env`).

    Returns:
      The manifest also written to `workdir/sweep.json`.

    Raises:
      ValueError: a bad override or config, or a workdir holding another sweep.
    """
    if ":" in os.path.basename(config_path):
        raise ValueError(
            f"--config={config_path}: give the file without a :variant; --grid and "
            "--sampling set the variants."
        )
    for warning in grid.check_overrides(overrides):
        logging.warning(warning)
    configs = {spec: grid.resolve_config(config_path, spec, overrides) for spec in specs}
    raise_problems(sweep_workdir_problems(workdir))
    grid.check_configs(configs)
    published = grid.published_overrides(overrides)
    os.makedirs(workdir, exist_ok=True)
    sweep_lock = open(os.path.join(workdir, ".sweep.lock"), "w")  # noqa: SIM115
    try:
        fcntl.flock(sweep_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as error:
        raise ValueError(f"Another sweep is running in {workdir}; wait for it.") from error
    manifest = grid.read_json(os.path.join(workdir, grid.MANIFEST_FILE)) or {
        "config": config_path,
        "overrides": published,
        "runs": {},
    }
    if (manifest["config"], manifest["overrides"]) != (config_path, published):
        raise ValueError(
            f"{workdir} holds a sweep of --config={manifest['config']} with overrides "
            f"{manifest['overrides']}; use a new --workdir, or the same config and overrides."
        )
    _move_old_error_tails(workdir, manifest)
    env = child_env(workdir, jax_cache)
    started = 0
    for spec in specs:
        run_dir = os.path.join(workdir, spec.name)
        record = manifest["runs"].setdefault(
            spec.name,
            {"privacy": spec.privacy, "sampling": spec.sampling, "seed": spec.seed, "attempts": 0},
        )
        if grid.is_finished(run_dir, configs[spec]):
            record["state"] = grid.FINISHED
            logging.info("%s: finished, skipped.", spec.name)
            continue
        if max_runs is not None and started >= max_runs:
            record["state"] = grid.PENDING
            continue
        started += 1
        record.update(state=grid.RUNNING, attempts=record["attempts"] + 1)
        grid.write_manifest(workdir, manifest)
        logging.info("%s: training (attempt %d).", spec.name, record["attempts"])
        command = [sys.executable, "-m", "dpnmt.train"]
        command += grid.train_flags(config_path, spec, run_dir, overrides)
        begin = time.time()
        try:
            status, tail = train_one(command, run_dir, env)
        except BaseException:  # Stopped (Ctrl-C, SIGTERM): the rerun resumes this run.
            record["state"] = grid.INTERRUPTED
            grid.write_manifest(workdir, manifest)
            raise
        if not configs[spec].dp.enabled:
            # A private run's attempt time, less its published 50-lot windows,
            # would time the lots after the last one: never published.
            record["seconds_last_attempt"] = round(time.time() - begin, 1)
        record["returncode"] = status
        if status == grid.TRAIN_INTERRUPTED_EXIT:  # Its own Ctrl-C: checkpointed, not failed.
            record["state"] = grid.INTERRUPTED
            grid.write_manifest(workdir, manifest)
            logging.warning("%s: interrupted; run the sweep again to resume it.", spec.name)
            raise KeyboardInterrupt(spec.name)
        if status == 0 and grid.is_finished(run_dir, configs[spec]):
            record["state"] = grid.FINISHED
            logging.info("%s: finished.", spec.name)
        else:
            _write_error_tail(run_dir, tail)
            record.update(state=grid.FAILED, log=grid.TRAIN_LOG)
            log = os.path.join(run_dir, grid.TRAIN_LOG)
            logging.error("%s: failed (exit %d); log: %s", spec.name, status, log)
        grid.write_manifest(workdir, manifest)
    grid.write_manifest(workdir, manifest)
    return manifest


def _write_error_tail(run_dir: str, tail: str) -> None:
    """Keeps a failed attempt's log tail under the run's private/.

    The tail may quote private data (a malformed training line, say): never in
    the published sweep.json.
    """
    path = os.path.join(run_dir, grid.ERROR_TAIL)
    atomic_file.make_private_folder(os.path.dirname(path))
    with open(path, "w", encoding="utf-8") as f:
        f.write(tail)


def _move_old_error_tails(workdir: str, manifest: dict) -> None:
    """Moves log tails that older releases kept in sweep.json to each run's private/."""
    moved = False
    for name, record in manifest["runs"].items():
        tail = record.pop("error_tail", None)
        if tail is None:
            continue
        moved = True
        if not os.path.exists(os.path.join(workdir, name, grid.ERROR_TAIL)):
            _write_error_tail(os.path.join(workdir, name), tail)
    if moved:
        grid.write_manifest(workdir, manifest)


def status_lines(manifest: dict, specs: list[grid.RunSpec], workdir: str) -> tuple[str, bool]:
    """A one-line-per-run summary for the console and whether any of `specs` failed.

    A failed run's line is followed by the last line of its log (read from the
    run's private/, for the user's console only).
    """
    lines, failed = [], False
    for spec in specs:
        record = manifest["runs"][spec.name]
        lines.append(f"  {spec.name:32s} {record['state']}")
        if record["state"] == grid.FAILED:
            failed = True
            tail_path = os.path.join(workdir, spec.name, grid.ERROR_TAIL)
            tail = ""
            if os.path.exists(tail_path):
                with open(tail_path, encoding="utf-8") as f:
                    tail = f.read()
            last = tail.strip().splitlines()[-1:]
            lines.append(f"      {last[0] if last else ''}")
    return "\n".join(lines), failed


def sweep_workdir_problems(workdir: str) -> list[str]:
    """Problems of a sweep folder: it must not be a training run's workdir."""
    held = [
        n
        for n in (CONFIG_FILE, CHECKPOINT_DIR, TOKENIZER_FILE)
        if os.path.exists(os.path.join(workdir, n))
    ]
    if held and not os.path.exists(os.path.join(workdir, grid.MANIFEST_FILE)):
        return [
            f"--workdir={workdir} holds a training run ({', '.join(held)}), not a sweep; give "
            "the sweep a folder of its own."
        ]
    return []
