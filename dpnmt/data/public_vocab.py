"""A SentencePiece vocabulary learnt from named PUBLIC corpora, built once and cached.

`tokenizer.kind="sentencepiece_public"` with `tokenizer.public_corpora` (names
as in `data.corpus`, e.g. "files:tatoeba_de_en,detok:wmt16") learns a joint
vocabulary from the train splits of those corpora, both sides of the run's
language pair. No private data enters it, so it costs no ε (the run's ε is
DP-SGD's alone). It is cached under `cache_root()/<key>/` (`spm.model`, and
`key.json`: what the key hashes), where the key hashes the text it was learnt
from and the trainer options, never names or paths: every run naming the same
text and options reuses it, and changed text makes a new one. Each run makes
its own record (published: its workdir, results, exports) from its own corpus
names, each path reduced to its last component (`files:/data/x` -> `files:x`).
`python -m dpnmt.public_vocab` builds it ahead of the runs; a run builds it on
first use otherwise, then keeps its own copy in its workdir like any vocabulary.
"""

import dataclasses
import hashlib
import json
import os
from typing import Any

import numpy as np

from dpnmt import atomic_file, cache_dir
from dpnmt.config import TokenizerConfig
from dpnmt.data import tokenizers
from dpnmt.data.corpora import mixture
from dpnmt.data.languages import parse_pair
from dpnmt.public_names import public_name

CACHE_ENV = cache_dir.ENV_VAR
MODEL_FILE = "spm.model"
KEY_FILE = "key.json"
_KEY_VERSION = 1  # Bump when what the key hashes changes meaning.


def cache_root() -> str:
    """`$DPNMT_CACHE_DIR/vocab`, else `$XDG_CACHE_HOME/dpnmt/vocab`, else `~/.cache/dpnmt/vocab`."""
    return cache_dir.folder("vocab")


@dataclasses.dataclass(frozen=True)
class PublicVocabSpec:
    """What a public vocabulary is learnt from, and how.

    Attributes:
      corpora: corpus names (`data.corpus` syntax, `detok:` allowed), public only.
      languages: the two language codes, sorted (either direction: one vocabulary).
      vocab_size: SentencePiece pieces.
      model_type: "unigram" or "bpe".
      character_coverage: SentencePiece's character coverage.
      byte_fallback: unseen characters as bytes.
      seed: SentencePiece's seed (public data: a fixed seed is fine).
      sentinels: T5 sentinel pieces reserved (`tokenizer.sentinels`).
    """

    corpora: tuple[str, ...]
    languages: tuple[str, str]
    vocab_size: int
    model_type: str = "unigram"
    character_coverage: float = 1.0
    byte_fallback: bool = True
    seed: int = 0
    sentinels: int = 0

    @classmethod
    def create(
        cls,
        corpora: str,
        pair: str,
        vocab_size: int,
        model_type: str = "unigram",
        sentinels: int = 0,
    ) -> "PublicVocabSpec":
        """From a comma-separated corpus list and a pair ("de-en")."""
        entries = mixture.parse_corpus_names(corpora, "tokenizer.public_corpora")
        names = tuple(entry.name for entry in entries)
        languages = tuple(sorted(parse_pair(pair).languages))
        return cls(names, languages, int(vocab_size), model_type, sentinels=int(sentinels))

    @classmethod
    def from_sections(cls, tokenizer: TokenizerConfig, pair: str) -> "PublicVocabSpec":
        """The spec of `tokenizer.public_corpora` for a run on `pair` (`data.pair`)."""
        return cls.create(
            tokenizer.public_corpora,
            pair,
            tokenizer.vocab_size,
            tokenizer.model_type,
            tokenizer.sentinels,
        )

    def trainer_options(self) -> dict[str, Any]:
        """The options that, with the text, decide the model (the key hashes them)."""
        fields = dataclasses.asdict(self)
        del fields["corpora"], fields["languages"]
        if not fields["sentinels"]:
            del fields["sentinels"]  # The keys of vocabularies without sentinels stay.
        return fields


def public_texts(spec: PublicVocabSpec) -> list[tuple[str, list[str]]]:
    """(name, sentences) per corpus: its train split, each pair's two sides in `languages` order."""
    pair = f"{spec.languages[0]}-{spec.languages[1]}"
    out = []
    for entry in mixture.parse_corpus_names(",".join(spec.corpora)):
        train = mixture.load_one(entry, pair)["train"]["translation"]
        out.append((entry.name, [row[lang] for row in train for lang in spec.languages]))
    return out


def _text_digest(texts: list[str]) -> str:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def cache_key(spec: PublicVocabSpec, digests: list[str]) -> str:
    """Hash of the text digests (in corpus order) and the trainer options."""
    payload = json.dumps(
        {"version": _KEY_VERSION, "text": digests, "options": spec.trainer_options()},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


@dataclasses.dataclass(frozen=True)
class PublicVocabulary:
    """A built (or found) public vocabulary.

    Attributes:
      tokenizer: the SentencePiece tokenizer.
      record: its `VocabularyRecord` (public: ε 0, covered by the guarantee),
        naming this call's corpora (`_record_names`), never a path.
      folder: its cache folder (`spm.model`, `vocabulary.json`); local, never published.
      built: True when this call learnt it, False when it was in the cache.
    """

    tokenizer: tokenizers.SentencePieceTokenizer
    record: tokenizers.VocabularyRecord
    folder: str
    built: bool


def _record_names(spec: PublicVocabSpec) -> list[str]:
    """The corpus names as published: a path argument reduced to its last component."""
    names = []
    for entry in mixture.parse_corpus_names(",".join(spec.corpora)):
        kind, sep, argument = entry.registry_name.partition(":")
        name = f"{kind}{sep}{public_name(argument)}" if sep and argument else entry.registry_name
        names.append((mixture.DETOK_PREFIX if entry.detokenize else "") + name)
    return names


def _key_contents(spec: PublicVocabSpec, texts, digests, key: str) -> dict[str, Any]:
    """What `key.json` holds: the key's inputs, no corpus name or path."""
    return {
        "cache_key": key,
        "languages": list(spec.languages),
        "text": [
            {"split": "train", "sentences": len(lines), "sha256": digest}
            for (_, lines), digest in zip(texts, digests, strict=True)
        ],
        "options": spec.trainer_options(),
    }


def _record(spec: PublicVocabSpec, texts, digests, key: str, size: int):
    published = _record_names(spec)
    names = ", ".join(published)
    return tokenizers.VocabularyRecord(
        kind="sentencepiece_public",
        covered_by_guarantee=True,
        epsilon=0.0,
        delta=0.0,
        note=f"SentencePiece learnt from public corpora only ({names}): no ε spent",
        details={
            "public_corpora": [
                {"name": name, "split": "train", "sentences": len(lines), "sha256": digest}
                for name, (_, lines), digest in zip(published, texts, digests, strict=True)
            ],
            "languages": list(spec.languages),
            "vocab_size": size,
            "vocab_size_asked": spec.vocab_size,
            **{k: v for k, v in spec.trainer_options().items() if k != "vocab_size"},
            "cache_key": key,
        },
    )


def build_public_vocabulary(spec: PublicVocabSpec, *, rebuild: bool = False) -> PublicVocabulary:
    """The cached vocabulary of `spec`, learnt first if it is not in the cache.

    The corpora are read each time (a few seconds): the key is their text's
    hash, so a changed corpus never reuses a stale vocabulary. Only the model
    and the key's inputs are cached; the record is made for this call's names.

    Args:
      spec: corpora and options.
      rebuild: learn it again even if cached (same text and seed: same model).

    Returns:
      The `PublicVocabulary`.
    """
    texts = public_texts(spec)
    digests = [_text_digest(lines) for _, lines in texts]
    key = cache_key(spec, digests)
    folder = os.path.join(cache_root(), key)
    model_path = os.path.join(folder, MODEL_FILE)
    built = rebuild or not os.path.isfile(model_path)
    if built:
        tokenizer = tokenizers.train_sentencepiece_on_texts(
            [line for _, lines in texts for line in lines], **spec.trainer_options()
        )
        os.makedirs(folder, exist_ok=True)
        atomic_file.write_atomic(model_path, tokenizer.model_proto)
        key_data = _key_contents(spec, texts, digests, key)
        atomic_file.write_atomic(os.path.join(folder, KEY_FILE), json.dumps(key_data, indent=2))
    else:
        tokenizer = tokenizers.SentencePieceTokenizer.load(model_path)
    record = _record(spec, texts, digests, key, tokenizer.vocab_size)
    return PublicVocabulary(tokenizer, record, folder, built=built)


def pieces_per_sentence(tokenizer: tokenizers.Tokenizer, texts: list[str]) -> dict[str, float]:
    """Mean, median and 95th percentile of pieces per sentence (eos not counted)."""
    lengths = np.asarray([len(ids) - 1 for ids in tokenizer.encode(texts)], dtype=np.float64)
    return {
        "sentences": int(lengths.size),
        "mean": float(lengths.mean()),
        "p50": float(np.percentile(lengths, 50)),
        "p95": float(np.percentile(lengths, 95)),
        "words_mean": float(np.mean([len(t.split()) for t in texts])),
    }


def load_measured(measure: str, pair: str, **options) -> Any:
    """The corpus `--measure` names (one name, optionally `detok:`), with loader `options`."""
    (entry,) = mixture.parse_corpus_names(measure)
    return mixture.load_one(entry, pair, **options)


def build_and_measure(
    spec: PublicVocabSpec,
    *,
    rebuild: bool = False,
    measure: str | None = None,
    measure_split: str = "validation",
    measured: Any = None,
) -> dict[str, Any]:
    """Builds (or finds) the vocabulary; optionally measures pieces per sentence of a corpus.

    Args:
      spec: corpora and options.
      rebuild: learn it again even if cached.
      measure: a corpus name (e.g. "files:multi30k") whose `measure_split`
        is encoded, each side on its own.
      measure_split: "train", "validation" or "test"; a public split (a private
        corpus's train split is private: `data.public_checks.measure_split_problems`).
      measured: `measure` as already loaded (`load_measured`); None: loaded here.

    Returns:
      A JSON-able summary: the folder, whether it was built now, the record,
      and per side of the measured corpus `pieces_per_sentence`.
    """
    built = build_public_vocabulary(spec, rebuild=rebuild)
    summary: dict[str, Any] = {
        "folder": built.folder,
        "built_now": built.built,
        "record": dataclasses.asdict(built.record),
    }
    if measure:
        if measured is None:
            measured = load_measured(measure, f"{spec.languages[0]}-{spec.languages[1]}")
        rows = measured[measure_split]["translation"]
        summary["pieces_per_sentence"] = {
            "corpus": measure,
            "split": measure_split,
            **{
                lang: pieces_per_sentence(built.tokenizer, [row[lang] for row in rows])
                for lang in spec.languages
            },
        }
    return summary
