r"""Translates your own text with a trained run or an exported model.

    python -m dpnmt.translate --workdir=runs/tiny --input=in.txt --output=out.txt
    echo "Ein Hund läuft." | python -m dpnmt.translate --model=exported/tiny

One output line per input line; an empty input line gives an empty output
line. Logic: `dpnmt.release` (loading) and `dpnmt.evaluation.translate`.
A bad input (no such run or model folder, an input file that is missing or not
UTF-8) prints one line naming it and the fix; a model that translates
non-blank lines to empty text gets a warning. Heavy libraries are imported in
`main`, so `--help` and flag errors answer at once.
"""

import sys

from absl import app, flags
from absl import logging as absl_logging

from dpnmt import cli

_WORKDIR = flags.DEFINE_string("workdir", None, "A training run's folder (latest checkpoint).")
_MODEL = flags.DEFINE_string("model", None, "Or a folder written by python -m dpnmt.export.")
_INPUT = flags.DEFINE_string("input", None, "Text file, one sentence a line (default: stdin).")
_OUTPUT = flags.DEFINE_string("output", None, "Where to write translations (default: stdout).")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Sentences per decoding batch.")
_NUM_BEAMS = flags.DEFINE_integer("num_beams", 1, "1: greedy; more: beam search.")
_MAX_LENGTH = flags.DEFINE_integer("max_length", 64, "Generated tokens per sentence.")


def main(argv):
    """Reads lines, translates them, writes one line each."""
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    from dpnmt import release  # noqa: PLC0415 - heavy (JAX, models): not for --help.

    lines = release.read_lines(_INPUT.value)  # Before the model loads: a bad file fails at once.
    translator = release.load_translator(workdir=_WORKDIR.value, model_dir=_MODEL.value)
    translations = release.translate_lines(
        translator,
        lines,
        batch_size=_BATCH_SIZE.value,
        num_beams=_NUM_BEAMS.value,
        max_new_tokens=_MAX_LENGTH.value,
        show_progress=_INPUT.value is not None,
    )
    warning = release.empty_translation_warning(lines, translations)
    if warning:
        absl_logging.warning("%s", warning)
    text = "".join(line + "\n" for line in translations)
    if _OUTPUT.value is None:
        sys.stdout.write(text)
    else:
        with open(_OUTPUT.value, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    cli.run(main)
