"""An exported SentencePiece vocabulary gives dpnmt's ids in `transformers.AutoTokenizer`."""

import os

import pytest
import transformers

from dpnmt.data import dp_sentencepiece, hf_tokenizer
from tests.markers import needs_data

EDGE_CASES = ["", "  two  spaces ", "Ünïcödé ☃ 日本語", "a\tb", "x\u00a0y ﬁ ｆｕｌｌ"]


def _lines(split: str, lang: str, count: int) -> list[str]:
    path = os.path.join(os.environ["DPNMT_DATA_DIR"], "multi30k", f"{split}.{lang}")
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()[:count]


@needs_data
@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_auto_tokenizer_gives_dpnmt_ids(model_type, tmp_path):
    pairs = list(zip(_lines("train", "de", 3000), _lines("train", "en", 3000), strict=True))
    params = dp_sentencepiece.DPVocabularyParams(noise_stddev=2.0, delta=1e-6, max_words=32)
    tokenizer, _ = dp_sentencepiece.train_dp_sentencepiece(
        pairs, vocab_size=400, params=params, seed=0, model_type=model_type
    )
    hf_tokenizer.save_tokenizer(tokenizer, str(tmp_path))
    loaded = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert (loaded.pad_token_id, loaded.eos_token_id) == (tokenizer.pad_id, tokenizer.eos_id)
    assert len(loaded) == tokenizer.vocab_size  # No id offset, no extra ids.
    # Literal "<pad>" text differs (one special id there): see hf_tokenizer's docstring.
    texts = _lines("test", "de", 200) + _lines("test", "en", 200) + EDGE_CASES
    ids = tokenizer.encode(texts)
    assert ids == loaded(texts)["input_ids"]
    assert tokenizer.decode(ids) == loaded.batch_decode(ids, skip_special_tokens=True)
    assert any(2 < i < 3 + 256 for row in ids for i in row)  # Byte fallback was exercised.
