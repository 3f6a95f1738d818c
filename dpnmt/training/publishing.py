"""What of a workdir goes into a results folder: its published text files, checked, then copied.

A workdir's published part is the workdir minus `private/` (`run_dir`). For
a results folder (a paper's repository, `docs/results/`) only its small text
files are wanted: `PUBLISHED_SUFFIXES` (results.json, config.json,
metrics.jsonl, pretrained.json, vocabulary.json, noise_to_signal.json, a
sweep's sweep.json and report, a decode's results and hypotheses). Never
copied: `private/` (secret), `checkpoints/` and `tensorboard/` (large or
binary; publishable, but not results), `tokenizer.model`, hidden files (a
sweep's locks). A run folder (one with config.json) is copied only once
its results.json says it finished: a running or stopped run has no result.

Nothing is copied when a file to copy names an absolute local path (the
workdir's own, the home folder's, the current folder's): a published file
must not say where it was made. Every problem is reported at once.
"""

import json
import os
import shutil

from dpnmt.errors import InputError
from dpnmt.training.run_dir import (
    CHECKPOINT_DIR,
    CONFIG_FILE,
    PRIVATE_DIR,
    RESULTS_FILE,
    TENSORBOARD_DIR,
)

PUBLISHED_SUFFIXES = (".json", ".jsonl", ".txt", ".md", ".csv", ".png", ".svg")
SKIPPED_DIRS = frozenset({PRIVATE_DIR, CHECKPOINT_DIR, TENSORBOARD_DIR})
_TEXT_SUFFIXES = (".json", ".jsonl", ".txt", ".md", ".csv", ".svg")


def unfinished_run(folder: str) -> bool:
    """A run folder (it has config.json) without a finished results.json (running, stopped)."""
    if not os.path.isfile(os.path.join(folder, CONFIG_FILE)):
        return False
    try:
        results = os.path.join(folder, RESULTS_FILE)
        with open(results, encoding="utf-8") as f:
            return json.load(f).get("finished") is not True
    except (OSError, ValueError, AttributeError):
        return True  # Unreadable: not a finished run either.


def published_files(workdir: str) -> tuple[list[str], list[str]]:
    """(files to copy, unfinished run folders skipped), paths relative to `workdir`, sorted.

    Raises:
      InputError: `workdir` is not a folder.
    """
    if not os.path.isdir(workdir):
        raise InputError(f"--workdir={workdir!r} is not a folder: give a run's or sweep's folder.")
    files, skipped = [], []
    for folder, dirs, names in os.walk(workdir):
        relative = os.path.relpath(folder, workdir)
        if unfinished_run(folder):
            skipped.append(relative)
            dirs[:] = []
            continue
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.startswith("."))
        for name in names:
            if not name.startswith(".") and name.endswith(PUBLISHED_SUFFIXES):
                files.append(os.path.normpath(os.path.join(relative, name)))
    return sorted(files), sorted(skipped)


def local_paths(workdir: str) -> list[str]:
    """The absolute local paths a published file must not contain, longest first."""
    candidates = {
        os.path.abspath(workdir),
        os.path.realpath(workdir),
        os.path.expanduser("~"),
        os.getcwd(),
    }
    return sorted((p for p in candidates if p not in ("/", "")), key=len, reverse=True)


def path_problems(workdir: str, files: list[str]) -> list[str]:
    """One line per text file that names a local absolute path (`local_paths`)."""
    paths = local_paths(workdir)
    problems = []
    for name in files:
        if not name.endswith(_TEXT_SUFFIXES):
            continue
        with open(os.path.join(workdir, name), encoding="utf-8", errors="replace") as f:
            text = f.read()
        found = [p for p in paths if p in text]
        if found:
            problems.append(f"{name} names the local path {found[0]!r}")
    return problems


def publish(workdir: str, out: str) -> tuple[list[str], list[str]]:
    """Copies `workdir`'s published text files to `out` (same relative layout).

    Returns:
      (files copied, unfinished run folders skipped), relative paths.

    Raises:
      InputError: `workdir` is no folder, `out` lies inside it, nothing is
        published there, or a file names a local path (nothing is written then).
    """
    files, skipped = published_files(workdir)
    inside = os.path.commonpath([os.path.realpath(workdir), os.path.realpath(out)])
    if inside == os.path.realpath(workdir):
        raise InputError(f"--out={out!r} lies inside --workdir={workdir!r}: give one outside it.")
    if not files:
        raise InputError(
            f"--workdir={workdir!r} has no finished run or published result to copy"
            + (f" (unfinished: {', '.join(skipped)})" if skipped else "")
            + "."
        )
    problems = path_problems(workdir, files)
    if problems:
        raise InputError(
            "Nothing copied: a published file must not name a local path; "
            "rerun or rewrite these with relative paths:\n  " + "\n  ".join(problems)
        )
    for name in files:
        target = os.path.join(out, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(workdir, name), target)
    return files, skipped
