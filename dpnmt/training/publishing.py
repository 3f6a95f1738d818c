"""What of a workdir goes into a results folder: its published text files, checked, then copied.

A workdir's published part is the workdir minus `private/` (`run_dir`). For
a results folder (a paper's repository, `docs/results/`) only its small text
files are wanted: `PUBLISHED_SUFFIXES` (results.json, config.json,
metrics.jsonl, pretrained.json, vocabulary.json, noise_to_signal.json, a
sweep's sweep.json and report, a decode's results and hypotheses). Never
copied: `private/` (secret), `checkpoints/` and `tensorboard/` (large or
binary; publishable, but not results), `tokenizer.model`, hidden files (a
sweep's locks), and a sweep.json with nothing published below it. A run
folder (one with config.json) is copied only once its results.json says it
finished: a running or stopped run has no result.

Refused before anything is copied (every problem at once): a workdir inside
`private/`, `checkpoints/` or `tensorboard/`; a symbolic link among the files
(it could point into `private/` or out of the workdir); a file that names a
local absolute path (the workdir's, the home folder's, the current folder's,
or any JSON string that is one, e.g. `files:/data/x`): a published file must
not say where it was made; and, for a private run whose validation pairs were
carved from its private train split, a validation decode or noise-to-signal
file outside `private/` (written there by versions before they moved).
"""

import json
import os
import re
import shutil

from dpnmt import decode_folders
from dpnmt.errors import InputError
from dpnmt.training.run_dir import (
    CHECKPOINT_DIR,
    CONFIG_FILE,
    NOISE_TO_SIGNAL_FILE,
    PRIVATE_DIR,
    RESULTS_FILE,
    SWEEP_MANIFEST_FILE,
    TENSORBOARD_DIR,
)

PUBLISHED_SUFFIXES = (".json", ".jsonl", ".txt", ".md", ".csv", ".png", ".svg")
SKIPPED_DIRS = frozenset({PRIVATE_DIR, CHECKPOINT_DIR, TENSORBOARD_DIR})
_TEXT_SUFFIXES = (".json", ".jsonl", ".txt", ".md", ".csv", ".svg")
# A JSON string that is an absolute path, bare or after a scheme ("files:/data/x"); not a URL.
_ABSOLUTE = re.compile(r"^(?:[A-Za-z_]+:)?/(?!/)\S")


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


def published_files(workdir: str) -> tuple[list[str], list[str], list[str]]:
    """(files to copy, unfinished run folders skipped, symbolic links), relative, sorted.

    Raises:
      InputError: `workdir` is not a folder.
    """
    if not os.path.isdir(workdir):
        raise InputError(f"--workdir={workdir!r} is not a folder: give a run's or sweep's folder.")
    files, skipped, links = [], [], []
    for folder, dirs, names in os.walk(workdir):
        relative = os.path.relpath(folder, workdir)
        if unfinished_run(folder):
            skipped.append(relative)
            dirs[:] = []
            continue
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.startswith("."))
        for name in [*dirs, *names]:
            if os.path.islink(os.path.join(folder, name)):
                links.append(os.path.normpath(os.path.join(relative, name)))
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]
        for name in names:
            if not name.startswith(".") and name.endswith(PUBLISHED_SUFFIXES):
                files.append(os.path.normpath(os.path.join(relative, name)))
    files = set(files) - set(links)
    # A sweep's manifest is copied only with something published below it (a finished run).
    for manifest in [f for f in files if os.path.basename(f) == SWEEP_MANIFEST_FILE]:
        folder = os.path.dirname(manifest)
        below = [f for f in files if f != manifest and f.startswith(os.path.join(folder, ""))]
        if not below:
            files.discard(manifest)
    return sorted(files), sorted(skipped), sorted(links)


def local_paths(workdir: str) -> list[str]:
    """The absolute local paths a published file must not contain, longest first."""
    candidates = {
        os.path.abspath(workdir),
        os.path.realpath(workdir),
        os.path.expanduser("~"),
        os.getcwd(),
    }
    return sorted((p for p in candidates if p not in ("/", "")), key=len, reverse=True)


def _json_strings(value):
    """Every string (keys included) in a parsed JSON value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _json_strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _json_strings(item)


def _absolute_in_json(name: str, text: str) -> str | None:
    """The first JSON string of `text` that is an absolute path, or None (unparsable: None)."""
    documents = text.splitlines() if name.endswith(".jsonl") else [text]
    for document in documents:
        try:
            parsed = json.loads(document) if document.strip() else None
        except ValueError:
            continue
        for string in _json_strings(parsed):
            if _ABSOLUTE.match(string):
                return string
    return None


def path_problems(workdir: str, files: list[str]) -> list[str]:
    """One line per text file that names a local absolute path (`local_paths`, JSON strings)."""
    paths = local_paths(workdir)
    problems = []
    for name in files:
        if not name.endswith(_TEXT_SUFFIXES):
            continue
        with open(os.path.join(workdir, name), encoding="utf-8", errors="replace") as f:
            text = f.read()
        found = [p for p in paths if p in text]
        if not found and name.endswith((".json", ".jsonl")):
            found = [p for p in [_absolute_in_json(name, text)] if p is not None]
        if found:
            problems.append(f"{name} names the local path {found[0]!r}")
    return problems


def _carved_validation_problems(workdir: str, files: list[str]) -> list[str]:
    """Validation outputs outside private/ of a private run that validated on private pairs."""
    problems, untagged = [], decode_folders.folder("validation")
    for name in files:
        folder = os.path.dirname(name)
        if os.path.basename(name) != RESULTS_FILE or not os.path.isfile(
            os.path.join(workdir, folder, CONFIG_FILE)
        ):
            continue
        with open(os.path.join(workdir, name), encoding="utf-8") as f:
            results = json.load(f)
        if not (results.get("validation_is_private") and results.get("privacy", {}).get("private")):
            continue
        for other in files:
            inside = os.path.relpath(other, folder)
            top = inside.split(os.sep, 1)[0]
            tagged = top.startswith(untagged + "_")  # dpnmt.decode --tag
            if inside == NOISE_TO_SIGNAL_FILE or (os.sep in inside and (top == untagged or tagged)):
                problems.append(
                    f"{other}: measured on validation pairs carved from the private train "
                    f"split, so it belongs in {PRIVATE_DIR}/ (written by an older version)"
                )
    return problems


def _check_workdir(workdir: str) -> None:
    """Raises InputError if `workdir` lies inside a folder never published (`SKIPPED_DIRS`)."""
    inside = sorted(set(os.path.realpath(workdir).split(os.sep)) & SKIPPED_DIRS)
    if inside:
        raise InputError(
            f"--workdir={workdir!r} lies inside a {inside[0]}/ folder, which is never "
            "published: give the run's or sweep's own folder."
        )


def publish(workdir: str, out: str) -> tuple[list[str], list[str]]:
    """Copies `workdir`'s published text files to `out` (same relative layout).

    Returns:
      (files copied, unfinished run folders skipped), relative paths.

    Raises:
      InputError: `workdir` is no folder or lies in a folder never published,
        `out` lies inside it, nothing is published there, or a check of the
        module docstring fails (nothing is written then).
    """
    _check_workdir(workdir)
    files, skipped, links = published_files(workdir)
    inside = os.path.commonpath([os.path.realpath(workdir), os.path.realpath(out)])
    if inside == os.path.realpath(workdir):
        raise InputError(f"--out={out!r} lies inside --workdir={workdir!r}: give one outside it.")
    if not files:
        raise InputError(
            f"--workdir={workdir!r} has no finished run or published result to copy"
            + (f" (unfinished: {', '.join(skipped)})" if skipped else "")
            + "."
        )
    problems = [f"{link} is a symbolic link (it may lead into private/)" for link in links]
    problems += path_problems(workdir, files) + _carved_validation_problems(workdir, files)
    if problems:
        raise InputError(
            "Nothing copied: a published file must be a plain file that names no local "
            "path and holds nothing private; fix or remove these:\n  " + "\n  ".join(problems)
        )
    for name in files:
        target = os.path.join(out, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(workdir, name), target)
    return files, skipped
