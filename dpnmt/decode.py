r"""Translates a split with a trained model and scores it (BLEU, chrF, BERTScore).

    python -m dpnmt.decode --workdir=runs/tiny --split=test
    python -m dpnmt.decode --config=configs/clinspen.py:nonprivate \
        --workdir=runs/zero_shot --zero_shot        # pretrained baseline

Writes `hypotheses.<split>.txt` and `results.json` (scores and the run's privacy
report) into `<workdir>/decode_<split>`, or `<workdir>/private/decode_validation`
when the validation split was carved from the private train split. Another
decoding setting beside the run's own goes to its own folder with `--tag`:

    python -m dpnmt.decode --workdir=runs/tiny --split=test \
        --no_repeat_ngram_size=3 --tag=norepeat3        # -> decode_test_norepeat3/

`--num_beams`, `--length_penalty` and `--no_repeat_ngram_size` override the
run's `eval` settings (`dpnmt.decoding_flags`, shared with `dpnmt.translate`;
decoding is post-processing: choose them on a public validation split, never
on test).

Logic: `dpnmt.evaluation.decode`.
"""

import dataclasses

from absl import app, flags
from ml_collections import config_flags

from dpnmt import cli, decode_folders, decoding_flags
from dpnmt.config import RunConfig

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file (only for --zero_shot; a run's own config is read from --workdir)."
)
_WORKDIR = flags.DEFINE_string("workdir", None, "The training run's folder.")
_SPLIT = flags.DEFINE_enum("split", "test", ["validation", "test"], "Split to translate.")
_MAX_EXAMPLES = flags.DEFINE_integer("max_examples", None, "Translate only the first N pairs.")
_TAG = flags.DEFINE_string(
    "tag", None, "Write to decode_<split>_<tag>/ (letters, digits, - and _), not decode_<split>/."
)
_BERTSCORE = flags.DEFINE_boolean("bertscore", True, "Also compute BERTScore.")
_BERTSCORE_MODEL = flags.DEFINE_string(
    "bertscore_model", None, "BERTScore encoder (default: the offline all-MiniLM-L6-v2 package)."
)
_ZERO_SHOT = flags.DEFINE_boolean(
    "zero_shot", False, "Decode --config's pretrained model without training (baseline)."
)


def main(argv):
    """Loads the run (or pretrained model), decodes and scores."""
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if _TAG.value is not None and not decode_folders.is_tag(_TAG.value):
        cli.fail(f"--tag={_TAG.value!r}: use letters, digits, '-' and '_' only (a folder name).")
    overrides = decoding_flags.overrides()
    if _BERTSCORE_MODEL.value is not None:
        overrides["bertscore_model"] = _BERTSCORE_MODEL.value
    cli.setup_logging()
    # Here, not at the top: --help and flag errors answer before JAX and torch load.
    from dpnmt.evaluation import decode as decode_lib  # noqa: PLC0415

    if _ZERO_SHOT.value:
        if _CONFIG.value is None:
            raise app.UsageError("--zero_shot needs --config naming a pretrained model.")
        config = RunConfig.of(_CONFIG.value)
    else:
        config = decode_lib.load_run_config(_WORKDIR.value)
        decode_lib.warn_if_unfinished(_WORKDIR.value)
    config = dataclasses.replace(config, eval=dataclasses.replace(config.eval, **overrides))
    decode_lib.decode_and_score(
        config,
        _WORKDIR.value,
        split=_SPLIT.value,
        max_examples=_MAX_EXAMPLES.value,
        bertscore=_BERTSCORE.value,
        zero_shot=_ZERO_SHOT.value,
        tag=_TAG.value,
    )


if __name__ == "__main__":
    # Here, not at import: importing this module (tests, other apps) must not
    # make these flags required for every absl app in the process.
    flags.mark_flags_as_required(["workdir"])
    cli.run(main)
