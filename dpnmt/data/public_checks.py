"""Public vocabulary text must be public: never a DP run's private corpus.

Checks of `tokenizer.public_corpora` / `tokenizer.public_text_paths` (by name,
folder and text) and of `python -m dpnmt.public_vocab --measure`, which may
not read a DP config's private split. Each takes the typed sections it reads,
or the `dpnmt.config.RunConfig` where it needs the resolved tokenizer kind.
"""

import hashlib
import os
import re
from collections.abc import Iterable
from typing import Any

from dpnmt.config import DataConfig, PrivacyConfig, RunConfig, TokenizerConfig
from dpnmt.data import corpora, languages, overlap, public_vocab
from dpnmt.data.checks import corpus_identity, private_pair_problems
from dpnmt.data.corpora.common import validation_is_carved_from_train
from dpnmt.errors import InputError


def public_source_problems(run: RunConfig) -> list[str]:
    """`sentencepiece_public`'s text: `public_corpora_problems`, and paths that exist."""
    try:
        if run.tokenizer_kind != "sentencepiece_public":
            return []
    except InputError:
        return []  # Named by RunConfig.problems.
    return public_corpora_problems(run.tokenizer, run.data, run.dp) + [
        f"tokenizer.public_text_paths: {p} does not exist; fix the path."
        for p in run.tokenizer.public_text_paths
        if not os.path.isfile(p)
    ]


def public_corpora_problems(
    tokenizer: TokenizerConfig, data: DataConfig, dp: PrivacyConfig
) -> list[str]:
    """`tokenizer.public_corpora`: known names, not with text paths, never the private corpus."""
    spec = tokenizer.public_corpora
    if not spec:
        return []
    if list(tokenizer.public_text_paths):
        return [
            "tokenizer.public_corpora and tokenizer.public_text_paths are both set; give one "
            "source of public text for the vocabulary."
        ]
    try:
        public = corpora.parse_corpus_names(spec, "tokenizer.public_corpora")
        private = corpora.parse_corpus_names(data.corpus)
    except InputError as error:
        return [str(error)]
    found = [_public_corpus_problem(e, data.pair) for e in public]
    problems = [problem for problem, _ in found if problem]
    lacking = [without for _, without in found if without]
    if lacking and not private_pair_problems(data):  # Else the user's files are named.
        problems.append(
            f"tokenizer.public_corpora={spec!r}: the public vocabulary has no {data.pair} text "
            f"({'; '.join(lacking)}). For data.pair={data.pair!r} name public text of that pair "
            "(tokenizer.public_corpora, or tokenizer.public_text_paths), a pretrained model "
            "with its tokenizer (model.name_or_path), or tokenizer.kind='dp_sentencepiece' "
            "(its ε adds to the run's)."
        )
    if problems or not dp.enabled:
        return problems  # Non-private: the public stage trains on these corpora too.
    folders = {corpus_identity(entry.registry_name) for entry in private}
    shared = [e.name for e in public if corpus_identity(e.registry_name) in folders]
    if shared:
        return [
            f"tokenizer.public_corpora={spec!r} includes {shared}, the private training data of "
            f"this DP run (data.corpus={data.corpus!r}): a vocabulary learnt from it "
            "without DP voids the guarantee. Name public corpora only, or use "
            "tokenizer.kind='dp_sentencepiece'."
        ]
    return []


def _public_corpus_problem(entry, pair: str) -> tuple[str | None, str | None]:
    """(a problem of a public corpus itself, or what it holds when it lacks the run's pair).

    Cheap: the folder, its file names and header, the corpus's pair list.
    """
    corpus, argument = corpora.lookup(entry.registry_name)
    try:
        direction = languages.parse_pair(pair)
    except ValueError:
        return None, None  # Named by the data checks.
    where = f"tokenizer.public_corpora: {entry.name!r}"
    if corpus.name == "wmt16":
        try:
            languages.check_pair_available(direction, corpora.WMT16_PAIRS, "wmt16")
        except ValueError:
            return None, f"{entry.name!r} has no {pair}"
    if corpus.name != "files":
        return None, None
    folder = corpora.files.resolve_folder(argument)
    if not os.path.isdir(folder):
        problem = (
            f"{where}: folder {argument} does not exist here or under ${corpora.DATA_DIR_ENV}."
        )
        return problem, None
    if corpora.files.pair_problem(folder, direction):
        held = corpora.files.folder_languages(folder)
        return None, f"{entry.name!r} holds {'-'.join(held)}"
    try:
        found = corpora.common.read_local_split(folder, "train", direction)
    except InputError as error:
        return f"{where}: {error}", None
    if found is None:
        return f"{where}: {folder} has no train file for {pair}.", None
    return None, None


def measure_split_problems(run: RunConfig | None, measure: str | None, split: str) -> list[str]:
    """`python -m dpnmt.public_vocab --measure`: never the train split of a DP config's corpus.

    A private run's train split is private: its size and length statistics are
    not published, and lengths or buckets fitted on them are choices made on
    private data outside the guarantee. Its public validation split is measured
    instead.

    Args:
      run: the `--config` (None: nothing is private).
      measure: the `--measure` corpus name.
      split: `--measure_split`.
    """
    if not measure or split != "train" or run is None or not run.dp.enabled:
        return []
    try:
        measured = corpora.parse_corpus_names(measure, "--measure")
        private = corpora.parse_corpus_names(run.data.corpus)
    except InputError as error:
        return [str(error)]
    folders = {corpus_identity(entry.registry_name) for entry in private}
    if not any(corpus_identity(entry.registry_name) in folders for entry in measured):
        return []
    return [
        f"--measure={measure} --measure_split=train reads the train split of "
        f"data.corpus={run.data.corpus!r}, the private training data of this DP --config: "
        "its size and length statistics are private, and lengths or buckets chosen from "
        "them are choices made on private data. Measure its public validation split "
        "(--measure_split=validation, the default), or give a non-private --config."
    ]


def measure_options(data: DataConfig | None, measure: str) -> dict[str, Any]:
    """The loader options `--measure` is read with: the config's, when it names the config's corpus.

    So a validation split is carved (`data.validation_size`, ...) as the runs carve it.

    Args:
      data: the `--config`'s data section (None: no `--config`, no options).
      measure: the `--measure` corpus name.
    """
    if data is None:
        return {}
    try:
        (measured,) = corpora.parse_corpus_names(measure, "--measure")
        first = corpora.mixture.first_registry_name(data.corpus)
    except (InputError, ValueError):
        return {}
    if corpus_identity(measured.registry_name) != corpus_identity(first):
        return {}
    return data.corpus_options()


def measured_content_problems(
    run: RunConfig | None, measure: str | None, split: str, measured, private
) -> list[str]:
    """`--measure`: its split must not be a DP config's private data under another name or split.

    `measure_split_problems` compares names; this reads the text: the measured
    split is refused when it is a validation split carved from the train split
    of the config's corpus, or when it holds more than `overlap.OVERLAP_LIMIT`
    of a side of a private split (train, and a validation carved from it), so
    a copy of the private corpus, or its carved validation, is refused.

    Args:
      run: the `--config` (None: nothing is private).
      measure: the `--measure` corpus name.
      split: `--measure_split`.
      measured: the measured corpus as loaded (`measure_options`).
      private: the config's corpus (`training.pieces.load_corpus`).
    """
    if not measure or run is None or not run.dp.enabled:
        return []
    where = f"--measure={measure} --measure_split={split}"
    fix = (
        "Measure a public split that is not this run's data (a corpus's own validation or "
        "test split), or give a non-private --config."
    )
    first = corpora.mixture.first_registry_name(run.data.corpus)
    (entry,) = corpora.parse_corpus_names(measure, "--measure")
    same = corpus_identity(entry.registry_name) == corpus_identity(first)
    if same and split == "validation" and validation_is_carved_from_train(measured):
        return [
            f"{where} reads the validation split of data.corpus={run.data.corpus!r}, which "
            "is carved from its train split, the private training data of this DP --config: "
            f"its size and length statistics are private. {fix}"
        ]
    rows = measured[split]["translation"]
    text = overlap.sentence_set(text for row in rows for text in row.values())
    found = overlap.large_overlaps(text, overlap.private_sides(private, _private_splits(private)))
    if not found:
        return []
    return [
        f"{where} holds {'; '.join(o.describe() for o in found)} of data.corpus="
        f"{run.data.corpus!r}, up to case and spacing: that is the private training data "
        "of this DP --config, whose size and length statistics are private (more than "
        f"{overlap.OVERLAP_LIMIT:.0%} of a private side shared is refused). {fix}"
    ]


def _path_pieces(description: str) -> list[str]:
    """The file paths a split's recorded origin names (`corpora.common.make_corpus`)."""
    origin = re.sub(r"^\w+: ", "", description)
    origin = re.sub(r"^last \d+ \w+ of ", "", origin)
    origin = re.sub(r" less its last \d+ \w+$", "", origin)
    pieces = origin.split(" + ") + origin.split()
    return [p for p in pieces if os.path.isfile(p)]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _text_digest(lines: Iterable[str]) -> str:
    """Digest of the set of non-blank text lines: their order and repeats do not count.

    A file with a split side's sentences reordered (or deduplicated) is still
    that side's text.
    """
    distinct = sorted({line.strip() for line in lines} - {""})
    return _sha256("\n".join(distinct).encode("utf-8"))


def public_text_problems(run: RunConfig, corpus) -> list[str]:
    """`tokenizer.public_text_paths` must not be the private corpus's own text.

    A private run (`sentencepiece_public`) refuses a path that resolves to a
    file its corpus was read from (any split), or whose bytes, or set of text
    lines (in any order), equal such a file or one language side of a split
    (the split as loaded: one corpus, unshuffled), or whose lines hold more
    than `overlap.OVERLAP_LIMIT` of a private split side's sentences: a
    vocabulary learnt from it would be learnt from the private data without
    DP, reported as ε 0.

    Args:
      run: the run's config (its tokenizer kind, public text paths, corpus).
      corpus: its corpus as loaded (`training.pieces.load_corpus`).
    """
    if not run.dp.enabled or run.tokenizer_kind != "sentencepiece_public":
        return []
    by_path, by_bytes, by_text = {}, {}, {}
    sides = overlap.private_sides(corpus, _private_splits(corpus))
    for split, dataset in corpus.items():
        for path in _path_pieces(dataset.info.description or ""):
            by_path.setdefault(os.path.realpath(path), split)
            with open(path, "rb") as f:
                by_bytes.setdefault(_sha256(f.read()), split)
        translations = dataset["translation"]
        for language in translations[0] if len(translations) else ():
            by_text.setdefault(_text_digest(row[language] for row in translations), split)
    problems = []
    for path in run.tokenizer.public_text_paths:
        if not os.path.isfile(path):
            continue  # Named by the static checks.
        with open(path, "rb") as f:
            data = f.read()
        split, how = by_path.get(os.path.realpath(path)), "is"
        if split is None:
            split, how = by_bytes.get(_sha256(data)), "has the same bytes as"
        if split is None:
            text = data.decode("utf-8", errors="replace").splitlines()
            split, how = by_text.get(_text_digest(text)), "has the same lines as"
        if split is not None:
            problems.append(
                f"tokenizer.public_text_paths: {path} {how} the {split} split of this run's "
                f"corpus ({run.data.corpus}), not public text: a vocabulary learnt from it "
                "is learnt from the private data without DP, yet reported as ε 0. Give public "
                "text that is not this run's data, or use tokenizer.kind='dp_sentencepiece' "
                "(its ε is added), or 'sentencepiece_private' with "
                "tokenizer.private_data_ok=True (the report then says ε = ∞)."
            )
            continue
        text = overlap.text_sentence_set(data.decode("utf-8", errors="replace").splitlines())
        found = overlap.large_overlaps(text, sides)
        if found:
            where = f"tokenizer.public_text_paths: {path}"
            problems.append(_overlap_message(where, found, run.data.corpus))
    return problems


def _private_splits(corpus) -> list[str]:
    """The splits of `corpus` that are private: train, and a validation carved from it."""
    return ["train", "validation"] if validation_is_carved_from_train(corpus) else ["train"]


def _overlap_message(where: str, found: list, corpus_name: str) -> str:
    return (
        f"{where} holds {'; '.join(o.describe() for o in found)} of this DP run's corpus "
        f"({corpus_name}), up to case and spacing: that text is not public (more than "
        f"{overlap.OVERLAP_LIMIT:.0%} of a private side shared is refused), and a vocabulary "
        "learnt from it is learnt from the private data without DP, yet reported as ε 0. "
        "Give public text that does not contain this run's data, or use "
        "tokenizer.kind='dp_sentencepiece' (its ε is added)."
    )


def public_corpora_content_problems(run: RunConfig, corpus) -> list[str]:
    """`tokenizer.public_corpora` must not hold the private corpus's sentences.

    `public_corpora_problems` compares names and folders; this compares text, so
    a copy under another name, a reordered or partial copy, or the folder a
    `wmt16` or `hub:` corpus was read from all count. A DP run refuses a public
    corpus whose train split (both sides) holds more than `overlap.OVERLAP_LIMIT`
    of the distinct sentences of a side of a private split (a copy holds all).
    Reads the public corpora (a few seconds): `check_run` calls it, before
    anything is written.

    Args:
      run: the run's config (its tokenizer kind, public corpora, pair, corpus).
      corpus: its corpus as loaded (`training.pieces.load_corpus`).
    """
    if not run.tokenizer.public_corpora or not run.dp.enabled:
        return []
    if run.tokenizer_kind != "sentencepiece_public":
        return []
    sides = overlap.private_sides(corpus, _private_splits(corpus))
    problems = []
    spec = public_vocab.PublicVocabSpec.from_sections(run.tokenizer, run.data.pair)
    for name, lines in public_vocab.public_texts(spec):
        found = overlap.large_overlaps(overlap.sentence_set(lines), sides)
        if found:
            where = f"tokenizer.public_corpora: {name!r}"
            problems.append(_overlap_message(where, found, run.data.corpus))
    return problems
