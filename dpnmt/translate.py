r"""Translates your own text with a trained run or an exported model.

    python -m dpnmt.translate --workdir=runs/tiny --input=in.txt --output=out.txt
    echo "Ein Hund läuft." | python -m dpnmt.translate --model=exported/tiny
    python -m dpnmt.translate --model=exported/tiny --num_beams=5 --no_repeat_ngram_size=6

Decoding as `dpnmt.decode`'s (`dpnmt.decoding_flags`: `--num_beams`,
`--length_penalty`, `--no_repeat_ngram_size`), plus `--max_length` and
`--batch_size`; each left out is the run's `eval` setting or the export's
`dpnmt.json`.

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

from dpnmt import cli, decoding_flags

_WORKDIR = flags.DEFINE_string("workdir", None, "A training run's folder (latest checkpoint).")
_MODEL = flags.DEFINE_string("model", None, "Or a folder written by python -m dpnmt.export.")
_INPUT = flags.DEFINE_string("input", None, "Text file, one sentence a line (default: stdin).")
_OUTPUT = flags.DEFINE_string("output", None, "Where to write translations (default: stdout).")
_BATCH_SIZE = flags.DEFINE_integer(
    "batch_size", None, "Sentences per decoding batch. Default: recorded (eval.batch_size)."
)
_MAX_LENGTH = flags.DEFINE_integer(
    "max_length", None, "Generated tokens per sentence. Default: recorded (eval.max_new_tokens)."
)


def main(argv):
    """Reads lines, translates them, writes one line each."""
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    decoding = decoding_flags.overrides(  # Before anything loads: a bad flag fails at once.
        max_new_tokens=("max_length", _MAX_LENGTH.value),
        batch_size=("batch_size", _BATCH_SIZE.value),
    )
    from dpnmt import release  # noqa: PLC0415 - heavy (JAX, models): not for --help.

    lines = release.read_lines(_INPUT.value)  # Before the model loads: a bad file fails at once.
    translator = release.load_translator(workdir=_WORKDIR.value, model_dir=_MODEL.value)
    translations = release.translate_lines(
        translator,
        lines,
        show_progress=_INPUT.value is not None,
        **decoding,
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
