r"""Copies what a run or sweep publishes (its small text files) into a results folder.

    python -m dpnmt.publish --workdir=runs/m30k --out=docs/results/m30k

Copies results.json, config.json, metrics.jsonl and the other published text
files of every finished run under --workdir (a run, a sweep or a decode
folder), keeping their layout; never private/, checkpoints/ or tensorboard/.
Nothing is copied if a file names a local absolute path. Logic:
`dpnmt.training.publishing`.
"""

from absl import app, flags

from dpnmt import cli
from dpnmt.training import publishing

_WORKDIR = flags.DEFINE_string("workdir", None, "A run's, sweep's or decode's folder.")
_OUT = flags.DEFINE_string("out", None, "Results folder (created; files there are replaced).")


def main(argv):
    """Publishes --workdir into --out and says what was copied and skipped."""
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    files, skipped = publishing.publish(_WORKDIR.value, _OUT.value)
    print(f"Copied {len(files)} file(s) from {_WORKDIR.value} to {_OUT.value}.")
    for folder in skipped:
        print(f"Skipped {folder}: not finished (rerun dpnmt.publish once it is).")


if __name__ == "__main__":
    flags.mark_flags_as_required(["workdir", "out"])
    cli.run(main)
