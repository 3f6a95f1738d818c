"""Public text against a private corpus: copies are found, chance stock phrases are not."""

import datasets

from dpnmt.data import overlap
from tests.data.conftest import generated_sentences

STOCK = {
    "en": ["Thank you.", "Of course.", "I see.", "No problem.", "Good morning.", "Thanks."],
    "ja": ["ありがとう。", "はい。", "もちろん。", "なるほど。", "分かりました。", "そうですか。"],
}


def _private(rows=200):
    """A corpus whose train split is long sentences plus common short replies (6 of 206)."""
    en = [s for s in generated_sentences(3 * rows, seed=5) if len(s) >= 40][:rows]
    ja = [f"これは会議の議事録の第{i}番目の文です。" for i in range(rows)]
    pairs = [{"en": e, "ja": j} for e, j in zip(en, ja, strict=True)]
    pairs += [{"en": e, "ja": j} for e, j in zip(STOCK["en"], STOCK["ja"], strict=True)]
    return datasets.DatasetDict({"train": datasets.Dataset.from_dict({"translation": pairs})})


def test_common_short_sentences_are_no_evidence_but_a_copy_is():
    corpus = _private()
    sides = overlap.private_sides(corpus, ["train"])
    # A public corpus of everyday phrases shares all the short replies (3% of each side).
    public = overlap.sentence_set([*STOCK["en"], *STOCK["ja"], "A public sentence of its own."])
    assert not overlap.large_overlaps(public, sides)
    rows = corpus["train"]["translation"]
    copy = overlap.sentence_set(row[lang] for row in rows for lang in ("en", "ja"))
    found = overlap.large_overlaps(copy, sides)
    assert sorted(o.language for o in found) == ["en", "ja"]
    assert all(o.describe().startswith("about 100% of the distinct") for o in found)
    # A few long private sentences (5 of 200, 2.5%) are still evidence.
    some = overlap.sentence_set(row["en"].upper() for row in rows[:5])
    (part,) = overlap.large_overlaps(some, sides)
    assert part.describe() == "more than 1% of the distinct en sentences of the train split"


def test_evidence_length_by_script():
    assert not overlap.is_evidence(overlap.normalised("How are you doing?"))  # 15.
    assert overlap.is_evidence(overlap.normalised("Let's get down to business."))
    assert not overlap.is_evidence(overlap.normalised("ありがとう。"))
    assert overlap.is_evidence(overlap.normalised("お気遣いありがとうございます。"))
    # A side of short sentences only is still checked, every sentence counting.
    short = {overlap.normalised(s) for s in STOCK["en"]}
    assert overlap.evidence(short) == short


def test_tsv_and_json_lines_count_by_field_and_tokenised_text_matches():
    lines = ['{"translation": {"de": "Ein Satz.", "en": "A sentence."}}', "Zwei\tTwo", "{not json"]
    assert {"einsatz.", "asentence.", "zwei", "two", "{notjson"} <= overlap.text_sentence_set(lines)
    assert overlap.normalised("a well @-@ known sub@@ word") == overlap.normalised(
        "a well-known subword"
    )


def test_a_share_is_described_without_counts():
    assert overlap.Overlap("train", "de", 28975, 28975).describe() == (
        "about 100% of the distinct de sentences of the train split"
    )
    assert "about 40%" in overlap.Overlap("validation", "en", 201, 500).describe()
    assert overlap.Overlap("train", "en", 2, 100).describe().startswith("more than 1%")
