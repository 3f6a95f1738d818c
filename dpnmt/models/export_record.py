"""Whether a model folder is a dpnmt export that lost its privacy record (`dpnmt.json`).

`dpnmt.export` marks the transformers `config.json` it writes with
`MARKER_KEY`: the model's own files then say that a `dpnmt.json` (its privacy
record) belongs beside them. A folder so marked without that file (a copy
that left it out, an export killed by code older than the atomic export, a
hand-made folder) is never a valid start: fine-tuning it would drop the
export's ε, and translating with it would serve a model whose guarantee is
unknown. Light: only `json` and `os`, and `models.pretrained.find_file` when
asked about a hub id.

An export also lists its files' sha256 (`dpnmt.manifest`, written last):
a local folder whose files differ from that list (changed, truncated,
missing or added after the export) is refused the same way (`problem`).
"""

import json
import os

MARKER_KEY = "dpnmt_privacy_record"  # In config.json: the file that holds the record.
RECORD_FILE = "dpnmt.json"  # `training.pretrained_privacy.SETTINGS_FILE`.
MODEL_CONFIG_FILE = "config.json"


def mark(folder: str) -> None:
    """Adds `MARKER_KEY` to `folder/config.json` (written by `models.export.save_pretrained`)."""
    from dpnmt import atomic_file  # noqa: PLC0415 - the base layer; kept beside its one use.

    path = os.path.join(folder, MODEL_CONFIG_FILE)
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    config[MARKER_KEY] = RECORD_FILE
    atomic_file.write_atomic(path, json.dumps(config, indent=2, sort_keys=True) + "\n")


def _marked(config_path: str | None) -> bool:
    if config_path is None:
        return False
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(config, dict) and MARKER_KEY in config


def missing_record_problem(name_or_path: str, flag: str) -> str | None:
    """One line refusing `name_or_path` when it is a dpnmt export without its `dpnmt.json`.

    Args:
      name_or_path: a model folder or hub id (as `model.name_or_path` or `--model`).
      flag: how the user gave it, for the message (e.g. "model.name_or_path").

    Returns:
      The refusal, or None: not marked as a dpnmt export, or its record is there,
      or whether it is cannot be read (the callers' own checks say so).
    """
    from dpnmt.models.pretrained import find_file  # noqa: PLC0415 - flax only when needed.

    try:
        if find_file(name_or_path, RECORD_FILE) is not None:
            return None
        marked = _marked(find_file(name_or_path, MODEL_CONFIG_FILE))
    except (OSError, ValueError):
        return None
    if not marked:
        return None
    return (
        f"{flag}={name_or_path} is a dpnmt export without its privacy record ({RECORD_FILE}: "
        "cut short by a kill, or left out of a copy), so its ε is unknown; export the run "
        "again (python -m dpnmt.export --workdir=RUN --out=NEW_FOLDER) or copy the whole folder."
    )


def problem(name_or_path: str, flag: str) -> str | None:
    """One line refusing `name_or_path` as a start or a translator, or None.

    A dpnmt export without its record (`missing_record_problem`), a local
    marked export without its `SHA256SUMS`, or a local folder whose files
    differ from it (`dpnmt.manifest`).
    """
    from dpnmt import manifest  # noqa: PLC0415 - the base layer; kept beside its one use.

    lost = missing_record_problem(name_or_path, flag)
    if lost is not None or not os.path.isdir(name_or_path):
        return lost
    marked = _marked(os.path.join(name_or_path, MODEL_CONFIG_FILE))
    if marked and not os.path.isfile(os.path.join(name_or_path, manifest.FILE)):
        return (
            f"{flag}={name_or_path} is a dpnmt export without its {manifest.FILE} (every marked "
            "export has one: left out of a copy, or removed), so its files cannot be checked; "
            "export the run again (python -m dpnmt.export --workdir=RUN --out=NEW_FOLDER) or "
            "copy the whole folder."
        )
    try:
        changed = manifest.problems(name_or_path)
    except ValueError as error:
        changed = [str(error)]
    if not changed:
        return None
    return (
        f"{flag}={name_or_path}: its files are not the ones exported ({'; '.join(changed[:3])}); "
        "export the run again, or copy the whole folder again."
    )
