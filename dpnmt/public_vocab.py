r"""Builds (or finds) the cached SentencePiece vocabulary of PUBLIC corpora.

    python -m dpnmt.public_vocab --config=configs/multi30k.py
    python -m dpnmt.public_vocab --corpora=files:tatoeba_de_en,detok:wmt16 \
        --pair=de-en --vocab_size=8000 --measure=files:multi30k

With --config it builds exactly the vocabulary that config's runs use
(`tokenizer.public_corpora`, `data.pair`, `tokenizer.vocab_size`,
`tokenizer.model_type`); the plain flags override those fields or stand
alone. It prints the cache folder and the vocabulary's record (JSON), and with
--measure the pieces per sentence of that corpus's --measure_split, each side.
Measure a public split (validation): with a DP --config, a split that is its
private data is refused (its train split by name; a validation carved from it,
or any split holding more than 1% of a private side, by reading the text), its
statistics being private.
A run builds the same vocabulary on first use when it is missing; this app
builds it ahead (`dpnmt.data.public_vocab`: cache folder, key, record).
"""

import json

from absl import app, flags
from ml_collections import config_flags

from dpnmt import cli
from dpnmt.config import RunConfig
from dpnmt.data import public_checks, public_vocab
from dpnmt.errors import raise_problems

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file whose public vocabulary to build (optional)."
)
_CORPORA = flags.DEFINE_string(
    "corpora", None, "Overrides tokenizer.public_corpora: e.g. files:tatoeba_de_en,detok:wmt16."
)
_PAIR = flags.DEFINE_string("pair", None, "Overrides data.pair, e.g. de-en (default de-en).")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", None, "Overrides tokenizer.vocab_size (8000).")
_MODEL_TYPE = flags.DEFINE_enum(
    "model_type", None, ["unigram", "bpe"], "Overrides tokenizer.model_type (unigram)."
)
_REBUILD = flags.DEFINE_bool("rebuild", False, "Learn it again even when cached.")
_MEASURE = flags.DEFINE_string(
    "measure", None, "A corpus (e.g. files:multi30k) to report pieces per sentence of."
)
_MEASURE_SPLIT = flags.DEFINE_enum(
    "measure_split",
    "validation",
    ["train", "validation", "test"],
    "The split --measure reads: a public one (train is refused for a DP --config's corpus).",
)


def main(argv):
    """Resolves the spec from --config and the flags, then builds and prints it."""
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    # Checked: a misspelt field (data.corpuss) must not leave the private corpus unnamed.
    run = RunConfig.parse(_CONFIG.value) if _CONFIG.value is not None else None
    if run is not None:
        raise_problems(
            public_checks.public_corpora_problems(run.tokenizer, run.data, run.dp)
            + public_checks.measure_split_problems(run, _MEASURE.value, _MEASURE_SPLIT.value)
        )
    corpora = _CORPORA.value or (run.tokenizer.public_corpora if run else "")
    if not corpora:
        raise app.UsageError(
            "Name the public corpora: --corpora=..., or a --config whose "
            "tokenizer.public_corpora is set."
        )
    spec = public_vocab.PublicVocabSpec.create(
        corpora,
        _PAIR.value or (run.data.pair if run else "de-en"),
        _VOCAB_SIZE.value or (run.tokenizer.vocab_size if run else 8000),
        _MODEL_TYPE.value or (run.tokenizer.model_type if run else "unigram"),
    )
    measured = None
    if _MEASURE.value:
        measured = public_vocab.load_measured(
            _MEASURE.value,
            f"{spec.languages[0]}-{spec.languages[1]}",
            **public_checks.measure_options(run.data if run else None, _MEASURE.value),
        )
        if run is not None and run.dp.enabled:
            from dpnmt.training import pieces  # Only here: it imports the model code.

            private = pieces.load_corpus(run.data)
            raise_problems(
                public_checks.measured_content_problems(
                    run, _MEASURE.value, _MEASURE_SPLIT.value, measured, private
                )
            )
    summary = public_vocab.build_and_measure(
        spec,
        rebuild=_REBUILD.value,
        measure=_MEASURE.value,
        measure_split=_MEASURE_SPLIT.value,
        measured=measured,
    )
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    cli.run(main)
