r"""Exports a trained run as a Hugging Face transformers model with a model card.

    python -m dpnmt.export --workdir=runs/tiny --out=exported/tiny

Writes config.json, model.safetensors, generation_config.json, the tokenizer
(AutoTokenizer loads it), dpnmt.json and README.md (privacy report, data,
scores) into --out. Never reads the run's private/. Logic: `dpnmt.release`.
"""

from absl import app, flags

from dpnmt import cli, release
from dpnmt.errors import InputError

_WORKDIR = flags.DEFINE_string("workdir", None, "The training run's folder.")
_OUT = flags.DEFINE_string("out", None, "New or empty folder for the exported model.")


def main(argv):
    """Exports --workdir into --out."""
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    from transformers.utils import logging as transformers_logging  # noqa: PLC0415 - heavy.

    transformers_logging.disable_progress_bar()  # "Writing model shards" bars on stderr.
    try:
        release.export_run(_WORKDIR.value, _OUT.value)
    except (FileNotFoundError, FileExistsError) as error:
        raise InputError(str(error)) from None  # One line (cli.run), no --help dump.
    print(f"Exported {_WORKDIR.value} to {_OUT.value} (model card: {_OUT.value}/README.md).")


if __name__ == "__main__":
    flags.mark_flags_as_required(["workdir", "out"])
    cli.run(main)  # Quiet library logs (orbax), one-line input errors.
