"""Preprocessing: prefixes, language codes, drops and truncation counted, caching."""

import pytest

from dpnmt.data import corpora, preprocess, tokenizers
from dpnmt.data.languages import parse_pair

from .conftest import generated_sentences

SOURCES = generated_sentences(60, seed=21)
TARGETS = generated_sentences(60, seed=22)


def _corpus(rows, pair="de-en"):
    return corpora.make_corpus(
        parse_pair(pair), {s: rows for s in corpora.SPLITS}, {s: "test" for s in corpora.SPLITS}
    )


@pytest.fixture
def rows():
    rows = list(zip(SOURCES, TARGETS, strict=True))
    rows[3] = ("   ", rows[3][1])  # whitespace-only source
    rows[5] = (rows[5][0], "")  # empty target
    rows[8] = ("", "\t")  # both empty
    return rows


class CountingTokenizer:
    """Delegates to a tokenizer and counts encode calls (to see cache hits)."""

    def __init__(self, inner):
        self.inner, self.calls, self.texts = inner, 0, []
        self.pad_id, self.eos_id = inner.pad_id, inner.eos_id
        self.vocab_size, self.fingerprint = inner.vocab_size, inner.fingerprint

    def encode(self, texts, *, target=False, max_length=None):
        self.calls += 1
        self.texts.append(list(texts))
        return self.inner.encode(texts, target=target, max_length=max_length)

    def decode(self, ids):
        return self.inner.decode(ids)


def test_drops_and_truncations_are_counted(spm_tokenizer, rows):
    max_len = 8
    processed, stats = preprocess.preprocess(
        _corpus(rows), spm_tokenizer, pair="de-en", max_source_length=max_len, max_target_length=6
    )
    kept_rows = [(s, t) for s, t in rows if s.strip() and t.strip()]
    split = stats.splits["train"]
    assert (split.num_examples, split.num_kept, split.num_dropped) == (60, 57, 3)
    assert (split.num_empty_source, split.num_empty_target) == (2, 2)
    full_source = [len(ids) for ids in spm_tokenizer.encode([s for s, _ in kept_rows])]
    full_target = [len(ids) for ids in spm_tokenizer.encode([t for _, t in kept_rows])]
    assert split.num_source_truncated == sum(n > max_len for n in full_source) > 0
    assert split.num_target_truncated == sum(n > 6 for n in full_target) > 0
    train = processed["train"]
    assert len(train) == 57
    assert train["source_full_length"] == full_source
    assert all(
        len(ids) <= max_len and ids[-1] == spm_tokenizer.eos_id for ids in train["input_ids"]
    )
    assert all(len(ids) <= 6 and ids[-1] == spm_tokenizer.eos_id for ids in train["labels"])
    assert train["source_length"] == [len(ids) for ids in train["input_ids"]]
    assert [rows[i] for i in train["example_index"]] == kept_rows


def test_t5_prefix_and_none(spm_tokenizer, rows):
    processed, stats = preprocess.preprocess(
        _corpus(rows),
        spm_tokenizer,
        pair="de-en",
        family="t5",
        max_source_length=512,
        max_target_length=512,
    )
    assert stats.source_prefix == "translate German to English: "
    first = processed["test"][0]
    assert spm_tokenizer.decode([first["input_ids"]]) == [
        "translate German to English: " + rows[first["example_index"]][0]
    ]
    assert spm_tokenizer.decode([first["labels"]]) == [rows[first["example_index"]][1]]
    plain, stats = preprocess.preprocess(
        _corpus(rows), spm_tokenizer, pair="de-en", max_source_length=512, max_target_length=512
    )
    assert stats.source_prefix == ""
    assert spm_tokenizer.decode([plain["test"][0]["input_ids"]]) == [rows[0][0]]


def test_mbart_family_checks_language_codes(spm_tokenizer, rows, tmp_path):
    from .test_tokenizers import _hf_from_spm

    path = _hf_from_spm(spm_tokenizer, tmp_path, "mbart")
    wrong, _ = tokenizers.load_pretrained_tokenizer(path, src_lang="en_XX", tgt_lang="de_DE")
    with pytest.raises(ValueError, match="src_lang='de_DE', tgt_lang='en_XX'"):
        preprocess.preprocess(
            _corpus(rows),
            wrong,
            pair="de-en",
            family="mbart",
            max_source_length=16,
            max_target_length=16,
        )
    right, _ = tokenizers.load_pretrained_tokenizer(path, src_lang="de_DE", tgt_lang="en_XX")
    processed, stats = preprocess.preprocess(
        _corpus(rows),
        right,
        pair="de-en",
        family="mbart",
        max_source_length=16,
        max_target_length=16,
    )
    vocab = right.tokenizer.get_vocab()
    assert all(
        ids[-2:] == [right.eos_id, vocab["de_DE"]] for ids in processed["train"]["input_ids"]
    )
    assert all(ids[-2:] == [right.eos_id, vocab["en_XX"]] for ids in processed["train"]["labels"])
    assert all(len(ids) <= 16 for ids in processed["train"]["input_ids"])
    assert stats.splits["train"].num_source_truncated > 0


def test_cache_reused_for_same_tokenizer_and_never_for_another(
    spm_tokenizer, public_text_file, rows, tmp_path
):
    corpus = _corpus(rows)
    kwargs = dict(pair="de-en", max_source_length=10, max_target_length=10, cache_dir=str(tmp_path))
    counting = CountingTokenizer(spm_tokenizer)
    first, first_stats = preprocess.preprocess(corpus, counting, **kwargs)
    assert counting.calls > 0
    again = CountingTokenizer(spm_tokenizer)
    second, second_stats = preprocess.preprocess(corpus, again, **kwargs)
    assert again.calls == 0  # served from the cache files
    assert second_stats == first_stats
    assert second["train"]["input_ids"] == first["train"]["input_ids"]
    other, _ = tokenizers.train_sentencepiece([public_text_file], vocab_size=420)
    third, _ = preprocess.preprocess(corpus, other, **kwargs)
    fresh, _ = preprocess.preprocess(corpus, other, **{**kwargs, "cache_dir": None})
    assert third["train"]["input_ids"] == fresh["train"]["input_ids"]
    assert third["train"]["input_ids"] != first["train"]["input_ids"]
    longer = CountingTokenizer(spm_tokenizer)
    preprocess.preprocess(corpus, longer, **{**kwargs, "max_source_length": 11})
    assert longer.calls > 0  # a changed option is a new cache key


def test_deterministic_without_cache(spm_tokenizer, rows):
    kwargs = dict(pair="de-en", max_source_length=9, max_target_length=9)
    a, stats_a = preprocess.preprocess(_corpus(rows), spm_tokenizer, **kwargs)
    b, stats_b = preprocess.preprocess(_corpus(rows), spm_tokenizer, **kwargs)
    assert stats_a == stats_b
    for split in corpora.SPLITS:
        assert a[split].to_dict() == b[split].to_dict()


def test_bad_arguments(spm_tokenizer, rows):
    corpus = _corpus(rows)
    with pytest.raises(ValueError, match="loaded for de-en, not en-de"):
        preprocess.preprocess(
            corpus, spm_tokenizer, pair="en-de", max_source_length=8, max_target_length=8
        )
    with pytest.raises(ValueError, match="Unknown model family"):
        preprocess.preprocess(
            corpus,
            spm_tokenizer,
            pair="de-en",
            family="gpt",
            max_source_length=8,
            max_target_length=8,
        )
    with pytest.raises(ValueError, match="max_target_length must be at least 2"):
        preprocess.preprocess(
            corpus, spm_tokenizer, pair="de-en", max_source_length=8, max_target_length=1
        )


@pytest.mark.parametrize("family", ["none", "t5"])
def test_on_demand_split_tokenizes_only_asked_rows_and_equals_upfront(spm_tokenizer, rows, family):
    """Per-lot tokenization: the same kept rows and ids as `preprocess`, rows only when asked."""
    options = dict(pair="de-en", family=family, max_source_length=8, max_target_length=6)
    processed, stats = preprocess.preprocess(_corpus(rows), spm_tokenizer, **options)
    counting = CountingTokenizer(spm_tokenizer)
    on_demand, split_stats = preprocess.preprocess_on_demand(
        _corpus(rows)["train"], counting, **options
    )
    assert counting.calls == 0  # N is known without tokenizing anything.
    upfront = stats.splits["train"]
    assert len(on_demand) == upfront.num_kept == len(processed["train"]) == 57
    for field in ("num_examples", "num_kept", "num_dropped", "num_empty_source"):
        assert getattr(split_stats, field) == getattr(upfront, field)
    assert split_stats.num_empty_target == upfront.num_empty_target
    assert split_stats.num_source_truncated is None and split_stats.num_target_truncated is None

    wanted = [56, 0, 7, 7, 31]  # Any order, repeats allowed (as a lot's rows are).
    input_ids, labels = on_demand.encode(wanted)
    assert input_ids == [processed["train"][i]["input_ids"] for i in wanted]
    assert labels == [processed["train"][i]["labels"] for i in wanted]
    assert max(len(ids) for ids in input_ids) == 8  # Truncation happened, as up front.
    kept_rows = [(s, t) for s, t in rows if s.strip() and t.strip()]
    sources = [stats.source_prefix + kept_rows[i][0] for i in wanted]
    targets = [kept_rows[i][1] for i in wanted]
    # Only these rows were encoded: sources, their re-cut long ones, targets, theirs.
    encoded = {text for call in counting.texts for text in call}
    assert counting.texts[0] == sources
    assert encoded == set(sources) | set(targets)
    assert on_demand.encode([]) == ([], [])
    for outside in ([57], [-1]):
        with pytest.raises(IndexError, match=r"\[0, 57\)"):
            on_demand.encode(outside)


def test_on_demand_split_refuses_the_wrong_pair(spm_tokenizer, rows):
    with pytest.raises(ValueError, match="loaded for de-en, not en-de"):
        preprocess.preprocess_on_demand(
            _corpus(rows)["train"],
            spm_tokenizer,
            pair="en-de",
            max_source_length=8,
            max_target_length=6,
        )
