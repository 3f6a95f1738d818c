"""Scores a trained run's canaries: log-likelihood, exposure and greedy extraction."""

import jax
import jax.numpy as jnp
import numpy as np

from dpnmt import models, training
from dpnmt.auditing import canaries as canary_lib
from dpnmt.auditing.options import AuditOptions
from dpnmt.bridge.dataset import INPUT_IDS, INPUT_LENGTH, LABEL_LENGTH, LABELS
from dpnmt.config import DataConfig, ModelConfig, RunConfig
from dpnmt.data import preprocess
from dpnmt.data.languages import parse_pair
from dpnmt.evaluation import decode as decode_lib


class LogLikelihoodScorer:
    """log p(target | source) by teacher forcing, in fixed-shape jitted batches."""

    def __init__(
        self, model, model_config, params, data: DataConfig, pad_id: int, batch_size: int = 512
    ):
        """Keeps the model; `data` gives the (fixed) source and target lengths."""
        self._params = params
        self._pad_id = pad_id
        self._batch_size = batch_size
        self._source_length = data.max_source_length
        self._target_length = data.max_target_length

        def batch_log_likelihood(params, batch):
            def one(example):
                loss = training.example_loss(model, model_config, params, example, None)
                return -loss * example[LABEL_LENGTH]  # Token mean -> sum over the target.

            return jax.vmap(one)(batch)

        self._fn = jax.jit(batch_log_likelihood)

    def __call__(self, input_ids: list[list[int]], labels: list[list[int]]) -> np.ndarray:
        """[n] float64 log-likelihoods (nats) of labels[i] given input_ids[i]."""
        out = []
        for start in range(0, len(labels), self._batch_size):
            rows = list(range(start, min(start + self._batch_size, len(labels))))
            batch = {
                INPUT_IDS: np.full((self._batch_size, self._source_length), self._pad_id, np.int32),
                INPUT_LENGTH: np.ones(self._batch_size, np.int32),
                LABELS: np.full((self._batch_size, self._target_length), self._pad_id, np.int32),
                LABEL_LENGTH: np.ones(self._batch_size, np.int32),
            }
            for r, i in enumerate(rows):  # Rows past the end stay dummies (discarded).
                batch[INPUT_IDS][r, : len(input_ids[i])] = input_ids[i]
                batch[INPUT_LENGTH][r] = len(input_ids[i])
                batch[LABELS][r, : len(labels[i])] = labels[i]
                batch[LABEL_LENGTH][r] = len(labels[i])
            scores = self._fn(self._params, jax.tree.map(jnp.asarray, batch))
            out.append(np.asarray(scores, np.float64)[: len(rows)])
        return np.concatenate(out) if out else np.zeros(0)


def _encode(tokenizer, texts, max_length: int, *, target: bool, what: str) -> list[list[int]]:
    """Ids as training preprocesses them; refuses truncation and text that does not round-trip."""
    ids = tokenizer.encode(list(texts), target=target)
    for text, row, decoded in zip(texts, ids, tokenizer.decode(ids), strict=True):
        if len(row) > max_length:
            raise ValueError(
                f"The canary {what} {text!r} has {len(row)} tokens, more than {max_length}: "
                "shorten the template or the fills."
            )
        if decoded.split() != text.split():
            raise ValueError(
                f"The run's tokenizer does not round-trip the canary {what} {text!r} (got "
                f"{decoded!r}: unk or normalised characters), so distinct secrets could share "
                "ids; use templates and fills the vocabulary encodes exactly."
            )
    return ids


def _source_prefix(data: DataConfig, model: ModelConfig) -> str:
    pair = parse_pair(data.pair)
    return preprocess.family_source_prefix(model.family, pair, model.source_prefix)


def score_canaries(
    run: RunConfig,
    workdir: str,
    canaries: list[canary_lib.Canary],
    options: AuditOptions,
    seed: int,
) -> list[dict]:
    """Per-canary log-likelihood, exposure and greedy extraction for a trained run.

    Returns:
      [M] dicts (private): index, inserted, log_likelihood (nats), exposure
      (bits), num_candidates, exact_match, secret_in_output.
    """
    from dpnmt import evaluation

    tokenizer, model, model_config, params, _, _ = decode_lib.load_trained(run, workdir)
    scorer = LogLikelihoodScorer(model, model_config, params, run.data, tokenizer.pad_id)
    prefix = _source_prefix(run.data, run.model)
    max_source, max_target = run.data.max_source_length, run.data.max_target_length
    sources = _encode(
        tokenizer, [prefix + c.source for c in canaries], max_source, target=False, what="source"
    )
    rng = np.random.default_rng([seed, 1])
    all_sources, all_labels, spans = [], [], []
    for canary, source_ids in zip(canaries, sources, strict=True):
        candidates = canary_lib.candidate_secrets(
            canary.secret, options.secret_length, options.num_candidates, rng
        )
        texts = [canary_lib.fill_target(options.target_template, canary.key, s) for s in candidates]
        spans.append((len(all_labels), len(all_labels) + len(texts)))
        all_labels += _encode(tokenizer, texts, max_target, target=True, what="target")
        all_sources += [source_ids] * len(texts)
    scores = scorer(all_sources, all_labels)  # All canaries' candidates in full batches.
    rows = []
    for canary, (start, stop) in zip(canaries, spans, strict=True):
        true_score, others = scores[start], scores[start + 1 : stop]
        rows.append(
            {
                "index": canary.index,
                "inserted": canary.inserted,
                "log_likelihood": float(true_score),
                "exposure": canary_lib.exposure(true_score, others),
                "num_candidates": stop - start,
            }
        )
    gen = models.decoding.from_model_config(model_config, run.eval.max_new_tokens, num_beams=1)
    hypotheses = evaluation.translate(
        model,
        params,
        tokenizer,
        sources,
        gen=gen,
        batch_size=run.eval.batch_size,
        max_source_length=max_source,
    )
    for row, canary, hypothesis in zip(rows, canaries, hypotheses, strict=True):
        words = hypothesis.split()
        row["exact_match"] = words == canary.target.split()
        row["secret_in_output"] = f" {canary.secret} " in f" {' '.join(words)} "
        row["hypothesis"] = hypothesis
    return rows
