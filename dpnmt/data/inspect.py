r"""Print a corpus's split sizes, token-length percentiles, drops and examples.

    python -m dpnmt.data.inspect --config=configs/clinspen.py
    python -m dpnmt.data.inspect --config=configs/files.py \
        --config.data.corpus=files:/path/to/folder --tokenizer=public:/path/to/text.txt

Takes the same `--config` as every other app (corpus, pair, data options, model
family and lengths come from it; a pretrained model's own tokenizer is used
when `tokenizer.kind='pretrained'`). The plain flags override the config, or
stand alone without one (defaults: wmt16 de-en, family none, 128 tokens).

--tokenizer is "spm:<file.model>" (SentencePiece), "hf:<path or hub id>"
(transformers; mBART codes set from the pair when the family is mbart), or
"public:<text file>" (SentencePiece trained on that public text now).
Without a tokenizer it prints sizes and examples only. It never learns a
vocabulary from the private train split.
"""

import dataclasses
from collections.abc import Sequence

import numpy as np
from absl import app, flags
from ml_collections import config_flags

from dpnmt import cli
from dpnmt.config import RunConfig
from dpnmt.data import checks, corpora, groups, languages, preprocess, tokenizers
from dpnmt.errors import ModelUnavailableError

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file, e.g. configs/clinspen.py (optional)."
)
_CORPUS = flags.DEFINE_string("corpus", None, "Overrides data.corpus: wmt16, bsd, clinspen, ...")
_PAIR = flags.DEFINE_string("pair", None, "Overrides data.pair, e.g. de-en.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Overrides data.dir (else $DPNMT_DATA_DIR).")
_BSD_TRAIN_SPLIT = flags.DEFINE_string("bsd_train_split", None, "bsd only: 'train' or 'dev'.")
_VALIDATION_SIZE = flags.DEFINE_integer("validation_size", None, "Overrides data.validation_size.")
_TOKENIZER = flags.DEFINE_string("tokenizer", None, "spm:<model>, hf:<path>, public:<text>.")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 8000, "For public:<text> tokenizers.")
_FAMILY = flags.DEFINE_enum("family", None, list(preprocess.FAMILIES), "Overrides model.family.")
_MAX_SOURCE = flags.DEFINE_integer("max_source_length", None, "Overrides data.max_source_length.")
_MAX_TARGET = flags.DEFINE_integer("max_target_length", None, "Overrides data.max_target_length.")
_NUM_EXAMPLES = flags.DEFINE_integer("num_examples", 3, "Examples printed per split.")


@dataclasses.dataclass(frozen=True)
class Settings:
    """What to inspect: from --config, then the plain flags."""

    corpus: str = "wmt16"
    pair: str = "de-en"
    options: dict = dataclasses.field(default_factory=dict)  # Corpus loader options.
    family: str = "none"
    max_source_length: int = 128
    max_target_length: int = 128
    tokenizer: str | None = None


def resolve_settings() -> Settings:
    """The config's values (if --config), each overridden by its plain flag when given."""
    settings = Settings()
    if _CONFIG.value is not None:
        data, model = (run := RunConfig.parse(_CONFIG.value)).data, run.model
        pretrained = run.tokenizer.kind == "pretrained" and model.name_or_path
        settings = Settings(
            corpus=data.corpus,
            pair=data.pair,
            options=data.corpus_options(),
            family=model.family,
            max_source_length=data.max_source_length,
            max_target_length=data.max_target_length,
            tokenizer=f"hf:{model.name_or_path}" if pretrained else None,
        )
    options = dict(settings.options)
    for flag, option in (
        (_DATA_DIR, "data_dir"),
        (_BSD_TRAIN_SPLIT, "train_split"),
        (_VALIDATION_SIZE, "validation_size"),
    ):
        if flag.value is not None:
            options[option] = flag.value
    overrides = {
        "corpus": _CORPUS.value,
        "pair": _PAIR.value,
        "family": _FAMILY.value,
        "max_source_length": _MAX_SOURCE.value,
        "max_target_length": _MAX_TARGET.value,
        "tokenizer": _TOKENIZER.value,
    }
    given = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(settings, options=options, **given)


def make_tokenizer(spec: str, family: str, pair: languages.LanguagePair) -> tokenizers.Tokenizer:
    """Builds a tokenizer from a "kind:path" flag value."""
    kind, _, path = spec.partition(":")
    if kind == "spm":
        return tokenizers.SentencePieceTokenizer.load(path)
    if kind == "hf":
        codes = languages.mbart_codes(pair) if family == "mbart" else (None, None)
        return tokenizers.load_pretrained_tokenizer(path, src_lang=codes[0], tgt_lang=codes[1])[0]
    if kind == "public":
        return tokenizers.train_sentencepiece([path], vocab_size=_VOCAB_SIZE.value)[0]
    raise app.UsageError(f"--tokenizer {spec!r}: use spm:<model>, hf:<path> or public:<text>.")


def main(argv: Sequence[str]) -> None:
    """Loads the corpus, optionally tokenizes it, and prints the summary."""
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    settings = resolve_settings()
    pair = languages.parse_pair(settings.pair)
    corpus = corpora.load_corpora(settings.corpus, pair, **settings.options)
    print(f"corpus {settings.corpus} {pair}")
    for split, dataset in corpus.items():
        empty = len(dataset) - checks.kept_pairs(dataset, settings.pair)
        dropped = f", {empty:,d} with an empty side (dropped)" if empty else ""
        print(f"  {split:<10} {len(dataset):>9,d} pairs{dropped}  ({dataset.info.description})")
        if (sizes := groups.summarize(dataset)) is not None:
            print(f"  {'':<10} {sizes.describe()}")
    if settings.tokenizer is None:
        for split, dataset in corpus.items():
            for row in dataset.select(range(min(_NUM_EXAMPLES.value, len(dataset))))["translation"]:
                print(f"  [{split}] {row[pair.source]!r} -> {row[pair.target]!r}")
        return
    try:
        tokenizer = make_tokenizer(settings.tokenizer, settings.family, pair)
    except OSError as error:
        raise ModelUnavailableError(
            f"{error} Or inspect with another tokenizer (--tokenizer=spm:<model>, public:<text>)."
        ) from error
    processed, stats = preprocess.preprocess(
        corpus,
        tokenizer,
        pair=pair,
        family=settings.family,
        max_source_length=settings.max_source_length,
        max_target_length=settings.max_target_length,
    )
    print(f"tokenizer {tokenizer.fingerprint} vocab {tokenizer.vocab_size}")
    print(f"source prefix {stats.source_prefix!r}")
    percentiles = (50, 90, 95, 99, 100)
    for split, dataset in processed.items():
        s = stats.splits[split]
        print(
            f"{split}: kept {s.num_kept:,d}/{s.num_examples:,d}, dropped {s.num_dropped:,d} "
            f"(empty source {s.num_empty_source:,d}, empty target {s.num_empty_target:,d}), "
            f"truncated source {s.num_source_truncated:,d}, target {s.num_target_truncated:,d}"
        )
        for side in ("source", "target"):
            lengths = np.asarray(dataset[f"{side}_full_length"])
            if lengths.size:
                values = np.percentile(lengths, percentiles).astype(int)
                table = ", ".join(f"p{p}={v}" for p, v in zip(percentiles, values, strict=True))
                print(f"  {side} tokens before truncation: {table}")
        for row in dataset.select(range(min(_NUM_EXAMPLES.value, len(dataset)))):
            source, target = tokenizer.decode([row["input_ids"], row["labels"]])
            print(f"  [{split}] {source!r} -> {target!r}")


if __name__ == "__main__":
    cli.run(main)
