"""Seconds from `python -m dpnmt.train` to its first lot, cold compilation cache, per phase.

Runs the training command of each checkout (`--trees`, this one by default)
and variant in a process of its own, one after the other and in turns, with
`--config.train.compilation_cache=off`, time-stamps every log line as it
arrives and stops the process once every length bucket is compiled (the
first lot starts then). Prints, per run, when the log reached each milestone
of the start-up: the privacy plan, the model, the initial validation loss,
the bucket phase and the first lot.

    .venv/bin/python -m benchmarks.first_lot --variants=nonprivate,eps8 \\
        --trees=.,/tmp/base --repeats=2

A run's shapes are the config's, never a lot's: this measures exactly what
a user waits for before training starts.
"""

import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

from absl import app, flags

from benchmarks.start_up_log import MILESTONES

_TREES = flags.DEFINE_list("trees", ["."], "Checkouts to time (their dpnmt), side by side.")
_VARIANTS = flags.DEFINE_list("variants", ["nonprivate", "eps8"], "Config variants.")
_CONFIG = flags.DEFINE_string("config", "configs/multi30k.py", "The config file.")
_MAX_TRAIN = flags.DEFINE_integer("max_train_examples", 3000, "Training pairs kept (0: all).")
_REPEATS = flags.DEFINE_integer("repeats", 1, "Runs per (tree, variant), in turns.")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/first_lot", "Scratch folder for the runs.")
_TIMEOUT = flags.DEFINE_integer("timeout_s", 900, "Per-run limit (s).")


def time_one(tree: str, variant: str, workdir: str) -> dict[str, float]:
    """Seconds from the command to each milestone of one cold start (run stopped at the last)."""
    command = [
        sys.executable,
        "-m",
        "dpnmt.train",
        f"--config={_CONFIG.value}:{variant}",
        "--config.train.num_epochs=1",
        "--config.train.compilation_cache=off",
        f"--workdir={workdir}",
    ]
    if _MAX_TRAIN.value:
        command.append(f"--config.data.max_train_examples={_MAX_TRAIN.value}")
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    seen: dict[str, float] = {}
    start = time.perf_counter()
    process = subprocess.Popen(
        command,
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    # Kills a run past the limit even while it prints nothing (a long compile).
    limit = threading.Timer(_TIMEOUT.value, process.kill)
    limit.start()
    try:
        for line in process.stdout:
            now = time.perf_counter() - start
            for name, pattern in MILESTONES:
                if name not in seen and pattern.search(line):
                    seen[name] = now
            if MILESTONES[-1][0] in seen:
                break
    finally:
        limit.cancel()
        process.kill()
        process.wait()
    if MILESTONES[-1][0] not in seen:
        raise RuntimeError(
            f"{tree} {variant}: no first lot within the log (exit {process.returncode}); "
            f"run the command by hand to see why: {' '.join(command)}"
        )
    return seen


def main(argv):
    del argv
    os.makedirs(_WORKDIR.value, exist_ok=True)
    rows: dict[tuple[str, str], list[dict[str, float]]] = {}
    for repeat in range(_REPEATS.value):
        for variant in _VARIANTS.value:
            for index, tree in enumerate(_TREES.value):
                workdir = os.path.join(_WORKDIR.value, f"{variant}_{index}_{repeat}")
                shutil.rmtree(workdir, ignore_errors=True)
                seen = time_one(tree, variant, workdir)
                rows.setdefault((tree, variant), []).append(seen)
                print(f"{tree} {variant}: first lot at {seen[MILESTONES[-1][0]]:.1f} s", flush=True)
    names = [name for name, _ in MILESTONES]
    print(f"\nload average now: {os.getloadavg()[0]:.1f}; seconds from the command (median)\n")
    print("| tree | variant | " + " | ".join(names) + " |")
    print("|---|---|" + "---:|" * len(names))
    for (tree, variant), runs in rows.items():
        cells = []
        for name in names:
            values = [run[name] for run in runs if name in run]
            cells.append(f"{statistics.median(values):.1f}" if values else "—")
        print(f"| {tree} | {variant} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    app.run(main)
