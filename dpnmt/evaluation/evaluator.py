"""Scores a model on a run's splits: teacher-forced loss, and BLEU/chrF/BERTScore by generation.

Used by the training loop (validation during training, test at the end) and by
`dpnmt.evaluation.decode` (decoding a trained run).
"""

import contextlib
import dataclasses

import numpy as np

from dpnmt import bridge, distributed, models
from dpnmt.config import DataConfig, EvalConfig
from dpnmt.data.languages import parse_pair
from dpnmt.evaluation import metrics
from dpnmt.evaluation.translate import translate as translate_sources


def tokenized_examples(split, data: DataConfig, pad_id: int) -> bridge.TokenizedExamples:
    """A tokenized split (`input_ids`, `labels`) as fixed-length examples (`data`'s lengths)."""
    return bridge.TokenizedExamples(
        split["input_ids"],
        split["labels"],
        max_source_length=data.max_source_length,
        max_target_length=data.max_target_length,
        pad_id=pad_id,
    )


def split_microbatches(split, data: DataConfig, batch_size: int, pad_id: int) -> list[dict]:
    """A tokenized split as masked micro-batches of `batch_size` rows, in order."""
    examples = tokenized_examples(split, data, pad_id)
    lot = bridge.Lot(
        np.arange(len(examples), dtype=np.int64),
        examples.__getitems__(list(range(len(examples)))).fields,
    )
    return bridge.to_microbatches(lot, batch_size, pad_values=examples.pad_values)


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """What evaluation reads of a run's configuration.

    Attributes:
      eval: decoding and scoring (`config.eval`).
      data: lengths, split limits, the pair, detokenization (`config.data`).
      loss_batch_size: rows per teacher-forced loss micro-batch
        (`train.physical_batch_size`: the shapes training compiled).
    """

    eval: EvalConfig
    data: DataConfig
    loss_batch_size: int


class Evaluator:
    """Scores a model on a split: teacher-forced loss and BLEU/chrF/BERTScore from generation."""

    def __init__(
        self,
        settings: EvalSettings,
        model,
        model_config,
        tokenizer,
        tokenized,
        corpus,
        eval_loss,
        mesh,
        timer=None,
    ):
        """Keeps what scoring needs; `eval_loss` (`training.make_eval_loss`) may be None.

        `timer` (a `dpnmt.training.profile.PhaseTimer`, optional) charges decoding
        and the teacher-forced loss to their own phases.
        """
        self._eval, self._data = settings.eval, settings.data
        self._loss_batch_size = settings.loss_batch_size
        self._model = model
        self._tokenizer = tokenizer
        self._tokenized = tokenized
        self._corpus = corpus
        self._eval_loss = eval_loss
        self._mesh = mesh
        self._gen = models.decoding.from_model_config(
            model_config,
            self._eval.max_new_tokens,
            num_beams=self._eval.num_beams,
            length_penalty=self._eval.length_penalty,
            no_repeat_ngram_size=self._eval.no_repeat_ngram_size,
        )
        self._target = parse_pair(self._data.pair).target
        if self._data.objective != "translation":  # Targets are spans of the text's language.
            self._target = self._data.text_language
        self._timer = timer

    def _phase(self, name: str):
        return self._timer.phase(name) if self._timer else contextlib.nullcontext()

    def _split(self, name: str, limit: int | None):
        split = self._tokenized[name]
        if limit is not None and limit < len(split):
            split = split.select(range(limit))
        if self._data.objective != "translation":
            # Pre-training: the reference is the objective's target (the masked spans
            # or the continuation, sentinels dropped by decoding), not a translation.
            return split, self._tokenizer.decode(list(split["labels"]))
        originals = self._corpus[name]["translation"]
        references = [originals[i][self._target] for i in split["example_index"]]
        return split, references

    def _loss(self, params, split) -> float:
        total, count = 0.0, 0
        with self._phase("teacher-forced loss"):
            for micro in split_microbatches(
                split, self._data, self._loss_batch_size, self._tokenizer.pad_id
            ):
                loss_sum, n = self._eval_loss(params, bridge.shard_microbatch(micro, self._mesh))
                total, count = total + float(loss_sum), count + int(n)
        return total / max(count, 1)

    def translate(self, params, name: str, limit: int | None) -> tuple[list[str], list[str]]:
        """(hypotheses by generation, references) for the first `limit` pairs of a split."""
        split, references = self._split(name, limit)
        with self._phase("decoding"):
            hypotheses = translate_sources(
                self._model,
                params,
                self._tokenizer,
                list(split["input_ids"]),
                gen=self._gen,
                batch_size=self._eval.batch_size,
                max_source_length=self._data.max_source_length,
            )
        return hypotheses, references

    def scores(self, hypotheses, references, *, bertscore: bool) -> dict:
        """SacreBLEU (score, signature), chrF, optionally BERTScore; EM for an objective."""
        kwargs = dict(detokenize=self._data.detokenize, target_lang=self._target)
        bleu = metrics.corpus_bleu(hypotheses, references, **kwargs)
        chrf = metrics.corpus_chrf(hypotheses, references, **kwargs)
        out = {
            "bleu": bleu["score"],
            "bleu_signature": bleu["signature"],
            "chrf": chrf["score"],
            "num_sentences": len(hypotheses),
        }
        if self._data.objective != "translation":  # The paper's EM: the whole target produced.
            exact = [h.strip() == r.strip() for h, r in zip(hypotheses, references, strict=True)]
            out["exact_match"] = sum(exact) / max(1, len(exact))
        if bertscore:
            hyp, ref = hypotheses, references
            if self._data.detokenize:
                hyp = metrics.detokenize_moses(hyp, lang=self._target)
                ref = metrics.detokenize_moses(ref, lang=self._target)
            out["bertscore"] = metrics.bertscore(
                hyp, ref, model_type=self._eval.bertscore_model, lang=self._target
            )
        return out

    def validation_loss(self, params) -> dict:
        """Teacher-forced validation loss on the first `data.max_eval_examples` pairs (no BLEU).

        Before training: an untrained model's greedy decode runs to full length and
        scores BLEU 0, so it is not worth its cost.
        """
        params = distributed.to_local(params, self._mesh)
        split, _ = self._split("validation", self._data.max_eval_examples)
        return {"loss": self._loss(params, split)}

    def validation(self, params) -> dict:
        """Validation loss and BLEU on the first `data.max_eval_examples` pairs."""
        params = distributed.to_local(params, self._mesh)
        limit = self._data.max_eval_examples
        hypotheses, references = self.translate(params, "validation", limit)
        split, _ = self._split("validation", limit)
        scores = self.scores(hypotheses, references, bertscore=False)
        return {"loss": self._loss(params, split), "bleu": scores["bleu"], "chrf": scores["chrf"]}

    def test(self, params) -> dict:
        """Test-split scores (BERTScore if `eval.bertscore`)."""
        params = distributed.to_local(params, self._mesh)
        hypotheses, references = self.translate(params, "test", self._data.max_test_examples)
        return self.scores(hypotheses, references, bertscore=self._eval.bertscore)
