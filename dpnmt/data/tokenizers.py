"""One small tokenizer interface over Hugging Face and SentencePiece tokenizers.

Every tokenizer here is used through `Tokenizer`: `encode` turns a batch of
strings into id lists that END with `eos_id` (and carry whatever special tokens
the model family needs, e.g. mBART language codes), `decode` inverts it. Vocabulary
training returns a `VocabularyRecord` saying whether the vocabulary is covered by
the run's privacy guarantee.

Kinds:
  * pretrained: a model's own tokenizer, `load_pretrained_tokenizer(path)`
    (transformers.AutoTokenizer); no private data involved.
  * public SentencePiece: `train_sentencepiece(paths)` on public text files.
  * DP-SentencePiece: `dpnmt.data.dp_sentencepiece.train_dp_sentencepiece`.
  * private SentencePiece: `train_private_sentencepiece(texts,
    private_data_ok=True)`; its record says the vocabulary is NOT covered.

SentencePiece models here use ids pad=0, eos=1, unk=2 and no bos (the T5
layout), byte fallback on by default so any text round-trips.
"""

import dataclasses
import hashlib
import io
import os
import threading
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

import sentencepiece as spm

from dpnmt.data import spm_training
from dpnmt.data.spm_training import sentencepiece_trainer_args, train_model
from dpnmt.public_names import public_name

PAD_ID, EOS_ID, UNK_ID = spm_training.PAD_ID, spm_training.EOS_ID, spm_training.UNK_ID


@runtime_checkable
class Tokenizer(Protocol):
    """What the data pipeline and decoding need from a tokenizer."""

    pad_id: int
    eos_id: int
    vocab_size: int
    fingerprint: str  # Changes whenever the ids it produces could change.

    def encode(
        self, texts: Sequence[str], *, target: bool = False, max_length: int | None = None
    ) -> list[list[int]]:
        """Returns ids per text ending in eos; `target` selects target-side specials."""
        ...

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Returns text per id list, special tokens and padding removed."""
        ...


@dataclasses.dataclass(frozen=True)
class VocabularyRecord:
    """How a vocabulary was made, for the run's privacy report.

    Attributes:
      kind: "pretrained", "sentencepiece_public", "dp_sentencepiece" or
        "sentencepiece_private".
      covered_by_guarantee: False when private data shaped the vocabulary without DP.
      epsilon: the vocabulary's own ε (DP-SentencePiece only), else None.
      delta: its δ, else None.
      note: one line for the report.
      details: parameters (vocab size, noise, threshold, counts of words kept/dropped).
    """

    kind: str
    covered_by_guarantee: bool
    epsilon: float | None = None
    delta: float | None = None
    note: str = ""
    details: dict[str, Any] = dataclasses.field(default_factory=dict)


class SentencePieceTokenizer:
    """A SentencePiece model behind the `Tokenizer` interface (appends eos)."""

    def __init__(self, model_proto: bytes):
        """Builds it from a serialized model (the bytes of a .model file)."""
        self.model_proto = _without_training_paths(model_proto)  # It is saved and published.
        self._processor = spm.SentencePieceProcessor(model_proto=model_proto)
        self.pad_id = self._processor.pad_id()
        self.eos_id = self._processor.eos_id()
        self.vocab_size = self._processor.get_piece_size()
        self.fingerprint = "spm-" + _sentencepiece_fingerprint(model_proto)
        if self.eos_id < 0 or self.pad_id < 0:
            raise ValueError("The SentencePiece model needs pad and eos ids; train it with them.")

    @classmethod
    def load(cls, path: str) -> "SentencePieceTokenizer":
        """Loads a .model file."""
        if not os.path.isfile(path):
            raise FileNotFoundError(f"SentencePiece model {path} does not exist; train one first.")
        with open(path, "rb") as f:
            return cls(f.read())

    def save(self, path: str) -> None:
        """Writes the .model file."""
        with open(path, "wb") as f:
            f.write(self.model_proto)

    def pieces(self) -> list[str]:
        """The vocabulary's pieces, by id."""
        return [self._processor.id_to_piece(i) for i in range(self.vocab_size)]

    def piece_id(self, piece: str) -> int | None:
        """The id of `piece` (e.g. a sentinel `<extra_id_0>`), None when absent."""
        found = self._processor.piece_to_id(piece)
        return found if self._processor.id_to_piece(found) == piece else None

    def encode(
        self, texts: Sequence[str], *, target: bool = False, max_length: int | None = None
    ) -> list[list[int]]:
        """Ids per text, eos appended; truncated to max_length keeping the eos.

        Args:
          texts: strings.
          target: unused (source and target sides are encoded alike).
          max_length: longest id list, eos included; None for no limit.

        Returns:
          [len(texts)] lists of ids.
        """
        del target
        if max_length is not None and max_length < 1:
            raise ValueError(f"max_length must be at least 1 (room for eos), not {max_length}.")
        encoded = self._processor.encode(list(texts))
        if max_length is not None:
            encoded = [ids[: max_length - 1] for ids in encoded]
        return [ids + [self.eos_id] for ids in encoded]

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Text per id list; stops at the first eos and ignores padding."""
        texts = []
        for row in ids:
            row = [int(i) for i in row]
            if self.eos_id in row:
                row = row[: row.index(self.eos_id)]
            texts.append(self._processor.decode([i for i in row if i != self.pad_id]))
        return texts


def _without_training_paths(model_proto: bytes) -> bytes:
    """The model without where its training input and output lay on disk (local paths)."""
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto.FromString(model_proto)
    if not model.trainer_spec.input and not model.trainer_spec.model_prefix:
        return model_proto
    model.trainer_spec.ClearField("input")
    model.trainer_spec.ClearField("model_prefix")
    return model.SerializeToString(deterministic=True)


def _sentencepiece_fingerprint(model_proto: bytes) -> str:
    """Hash of a SentencePiece model, ignoring where its training input lay on disk."""
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto.FromString(model_proto)
    model.trainer_spec.ClearField("input")
    model.trainer_spec.ClearField("model_prefix")
    return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()[:32]


class HFTokenizer:
    """A transformers tokenizer behind the `Tokenizer` interface."""

    def __init__(self, tokenizer, *, src_lang: str | None = None, tgt_lang: str | None = None):
        """Wraps `tokenizer`, setting mBART-style language codes when given.

        Args:
          tokenizer: a transformers PreTrainedTokenizerBase.
          src_lang: e.g. "de_DE"; set as tokenizer.src_lang (mBART family).
          tgt_lang: e.g. "en_XX"; set as tokenizer.tgt_lang.
        """
        # Encoder-style tokenizers (BERT) end sequences with [SEP]: it serves as eos.
        eos_id = tokenizer.eos_token_id
        if eos_id is None:
            eos_id = tokenizer.sep_token_id
        if eos_id is None or tokenizer.pad_token_id is None:
            raise ValueError(
                f"Tokenizer {type(tokenizer).__name__} lacks an eos (or sep) or pad token; a "
                "seq2seq model's tokenizer needs both."
            )
        for name, value in (("src_lang", src_lang), ("tgt_lang", tgt_lang)):
            if value is not None:
                if value not in tokenizer.get_vocab():
                    raise ValueError(
                        f"{name}={value!r} is not a token of this tokenizer; use its language "
                        "codes (e.g. de_DE, en_XX for mBART)."
                    )
                setattr(tokenizer, name, value)
        self.tokenizer = tokenizer
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        self.pad_id = tokenizer.pad_token_id
        self.eos_id = eos_id
        self.vocab_size = len(tokenizer)
        self.fingerprint = "hf-" + _hf_fingerprint(tokenizer, src_lang, tgt_lang)
        self._encode_lock = threading.Lock()

    def encode(
        self, texts: Sequence[str], *, target: bool = False, max_length: int | None = None
    ) -> list[list[int]]:
        """Ids per text with the tokenizer's own special tokens and truncation.

        Thread-safe: a fast tokenizer keeps its truncation (and mBART's
        source/target mode) as state set on every call, and per-lot training
        encodes in the prefetch thread, so calls take turns.
        """
        kwargs = {"truncation": max_length is not None, "max_length": max_length}
        with self._encode_lock:
            if target:
                return self.tokenizer(text_target=list(texts), **kwargs)["input_ids"]
            return self.tokenizer(list(texts), **kwargs)["input_ids"]

    def piece_id(self, piece: str) -> int | None:
        """The id of token `piece` (e.g. T5's `<extra_id_0>`), None when absent."""
        return self.tokenizer.get_vocab().get(piece)

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Text per id list, special tokens skipped."""
        rows = [[int(i) for i in row] for row in ids]
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)


def _hf_fingerprint(tokenizer, src_lang: str | None, tgt_lang: str | None) -> str:
    """Hash of everything that decides a transformers tokenizer's ids."""
    digest = hashlib.sha256()
    digest.update(type(tokenizer).__name__.encode())
    digest.update(repr((src_lang, tgt_lang, tokenizer.all_special_tokens)).encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        digest.update(backend.to_str().encode())
    else:
        vocab = sorted(tokenizer.get_vocab().items())
        digest.update(repr(vocab).encode())
    return digest.hexdigest()[:32]


def load_pretrained_tokenizer(
    path: str, *, src_lang: str | None = None, tgt_lang: str | None = None
) -> tuple[HFTokenizer, VocabularyRecord]:
    """Loads a pretrained model's own tokenizer (AutoTokenizer: hub id or local folder).

    Args:
      path: hub model id or a folder with tokenizer files.
      src_lang: mBART-family source code (e.g. "de_DE"); see languages.mbart_codes.
      tgt_lang: mBART-family target code.

    Returns:
      (tokenizer, record); the record says no private data shaped the vocabulary.
    """
    import transformers  # Deferred: heavy import, only this path needs it.

    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    except OSError as e:
        raise OSError(
            f"Could not load a tokenizer from {path!r}: {e}. Give a local folder with "
            "tokenizer files, or a hub id with network access."
        ) from e
    record = VocabularyRecord(
        kind="pretrained",
        covered_by_guarantee=True,
        note=f"pretrained tokenizer {public_name(path)}; no private data used",
        details={"path": public_name(path), "vocab_size": len(tokenizer)},  # Published: no path.
    )
    return HFTokenizer(tokenizer, src_lang=src_lang, tgt_lang=tgt_lang), record


def _train_in_memory(text_source: dict[str, Any], **trainer_args) -> SentencePieceTokenizer:
    """Trains SentencePiece on `text_source` ({"input": paths} or {"sentence_iterator": it})."""
    model = io.BytesIO()
    train_model(model_writer=model, **text_source, **sentencepiece_trainer_args(**trainer_args))
    return SentencePieceTokenizer(model.getvalue())


def train_sentencepiece(
    paths: Sequence[str],
    *,
    vocab_size: int,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    byte_fallback: bool = True,
    seed: int = 0,
    sentinels: int = 0,
) -> tuple[SentencePieceTokenizer, VocabularyRecord]:
    """Trains SentencePiece on PUBLIC text files (one sentence a line).

    Args:
      paths: text files; must not hold the private training data.
      vocab_size: target size (smaller if the text is too small for it).
      model_type: "unigram" or "bpe".
      character_coverage: fraction of characters covered (0.9995 for CJK).
      byte_fallback: encode unseen characters as bytes so any text round-trips.
      seed: SentencePiece's random seed.
      sentinels: T5 sentinel pieces to reserve (span corruption), 0 for none.

    Returns:
      (tokenizer, record) with covered_by_guarantee=True (public data only).
    """
    missing = [p for p in paths if not os.path.isfile(p)]
    if not paths or missing:
        raise FileNotFoundError(
            f"Public text file(s) {missing or 'none given'} not found; give existing files of "
            "public text, one sentence a line."
        )
    tokenizer = _train_in_memory(
        {"input": ",".join(paths)},
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        byte_fallback=byte_fallback,
        seed=seed,
        sentinels=sentinels,
    )
    record = VocabularyRecord(
        kind="sentencepiece_public",
        covered_by_guarantee=True,
        note="SentencePiece trained on public text only",
        details={
            "paths": [public_name(p) for p in paths],  # Published: file names, no folders.
            "vocab_size": tokenizer.vocab_size,
            "model_type": model_type,
        },
    )
    return tokenizer, record


def train_sentencepiece_on_texts(
    texts: Iterable[str],
    *,
    vocab_size: int,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    byte_fallback: bool = True,
    seed: int = 0,
    sentinels: int = 0,
) -> SentencePieceTokenizer:
    """Trains SentencePiece in memory on PUBLIC sentences (`dpnmt.data.public_vocab`).

    The caller makes the `VocabularyRecord`: only it knows where the text came from.
    """
    return _train_in_memory(
        {"sentence_iterator": iter(texts)},
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        byte_fallback=byte_fallback,
        seed=seed,
        sentinels=sentinels,
    )


def train_private_sentencepiece(
    texts: Iterable[str],
    *,
    vocab_size: int,
    private_data_ok: bool = False,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    byte_fallback: bool = True,
    seed: int = 0,
    sentinels: int = 0,
) -> tuple[SentencePieceTokenizer, VocabularyRecord]:
    """Trains plain SentencePiece on PRIVATE text: the vocabulary is NOT private.

    Args:
      texts: sentences of the private training split.
      vocab_size: target size.
      private_data_ok: must be True: you accept that the vocabulary can leak the data.
      model_type: "unigram" or "bpe".
      character_coverage: fraction of characters covered.
      byte_fallback: encode unseen characters as bytes.
      seed: SentencePiece's random seed.
      sentinels: T5 sentinel pieces to reserve (span corruption), 0 for none.

    Returns:
      (tokenizer, record) with covered_by_guarantee=False.

    Raises:
      ValueError: private_data_ok is not True.
    """
    if private_data_ok is not True:
        raise ValueError(
            "Training SentencePiece on the private training data makes a vocabulary outside "
            "the privacy guarantee. Use DP-SentencePiece or public text, or pass "
            "private_data_ok=True to accept that the vocabulary is not covered."
        )
    tokenizer = _train_in_memory(
        {"sentence_iterator": iter(texts)},
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        byte_fallback=byte_fallback,
        seed=seed,
        sentinels=sentinels,
    )
    record = VocabularyRecord(
        kind="sentencepiece_private",
        covered_by_guarantee=False,
        note=(
            "vocabulary trained on the private training data without DP: NOT covered by the "
            "privacy guarantee"
        ),
        details={"vocab_size": tokenizer.vocab_size, "model_type": model_type},
    )
    return tokenizer, record
