"""Empirical privacy audit of a training run: the library behind `python -m dpnmt.audit`.

1. Canaries (`dpnmt.canaries`): M secret sentence pairs, each inserted into the
   training split r times with probability 1/2, else held out.
2. Training: `trainer.train_and_evaluate` with the canaries added to train
   before the vocabulary and the privacy plan are built: they are training
   examples, counted in N, q and the vocabulary's histogram.
3. Scores: each canary's log-likelihood of its target given its source (teacher
   forcing, nats, eos included) is the membership score; exposure ranks its
   secret among candidate secrets by the same likelihood; greedy generation
   from its source tests exact extraction.
4. Membership audit (jax_privacy `CanaryScoreAuditor`): AUC of inserted vs
   held-out scores and the one-run ε lower bound (Steinke, Nasr & Jagielski
   2023) at the given confidence, compared with the ε the run claims. The
   bound can never exceed what M canaries all guessed right give
   (`reachable_lower_bound`: about 2.46 for M = 100 at 95%); a claim at or
   above that is UNTESTABLE, not consistent, and the audit names the M that
   would test it. The plan is logged before training (`audit_plan`).

What the attack sees is the trained model AND its vocabulary, so the claim
tested is the run's total (ε, δ) (DP-SGD composed with a DP vocabulary). For
canaries inserted r > 1 times the per-example guarantee covers them only as a
group of r: by group privacy (Vadhan 2017, Lemma 2.2) an (ε, δ) run is
(rε, r e^{(r-1)ε} δ)-DP for them, and that is the claim tested.

Private outputs (the secrets, which canaries were inserted, per-canary scores)
go to `workdir/private/`; `audit.json` and `audit_scores.png` hold aggregates.
"""

import dataclasses
import functools
import json
import logging
import math
import os
import secrets

import datasets
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from dpnmt import canaries as canary_lib
from dpnmt import inference, models, trainer
from dpnmt.bridge.dataset import INPUT_IDS, INPUT_LENGTH, LABEL_LENGTH, LABELS
from dpnmt.data import dp_sentencepiece, preprocess
from dpnmt.data.languages import parse_pair

AUDIT_FILE = "audit.json"
PLOT_FILE = "audit_scores.png"
CANARY_FILE = "canaries.json"  # Under trainer.PRIVATE_DIR: secrets and membership.
CANARY_SCORES_FILE = "audit_canaries.json"  # Under trainer.PRIVATE_DIR.


@dataclasses.dataclass(frozen=True)
class AuditOptions:
    """How to audit (the run itself is described by its config).

    Attributes:
      num_canaries: M canaries, about half inserted.
      repeats: r copies of each inserted canary (1 audits the per-example claim).
      key_length: digits of each canary's source key.
      secret_length: digits of each secret (10**secret_length possible secrets).
      num_candidates: other secrets each secret is ranked against for exposure
        (all of them when at least 10**secret_length - 1).
      confidence: confidence of the ε lower bound, in (0.5, 1).
      source_template: source with one "{key}".
      target_template: target with one "{secret}".
    """

    num_canaries: int = 100
    repeats: int = 1
    key_length: int = 4
    secret_length: int = 4
    num_candidates: int = 1000
    confidence: float = 0.95
    source_template: str = canary_lib.SOURCE_TEMPLATE
    target_template: str = canary_lib.TARGET_TEMPLATE

    def __post_init__(self):
        canary_lib.check_templates(self.source_template, self.target_template)
        if self.repeats < 1:
            raise ValueError(f"repeats={self.repeats} must be at least 1.")
        if self.num_candidates < 1:
            raise ValueError(f"num_candidates={self.num_candidates} must be at least 1.")
        if not 0.5 < self.confidence < 1:
            raise ValueError(f"confidence={self.confidence} must be in (0.5, 1), e.g. 0.95.")


def group_claim(epsilon: float, delta: float, group_size: int) -> tuple[float, float]:
    """(ε, δ) an (epsilon, delta)-DP mechanism guarantees for a group of `group_size`.

    Vadhan 2017, Lemma 2.2: (kε, k e^{(k-1)ε} δ). For k = 1 the claim itself.
    """
    if group_size == 1 or not math.isfinite(epsilon):
        return epsilon, delta
    return group_size * epsilon, group_size * math.exp((group_size - 1) * epsilon) * delta


# Outcomes of the membership audit (`audit_outcome`).
NO_CLAIM = "no claim"  # Non-private run (or a vocabulary outside the guarantee).
VACUOUS = "vacuous"  # The group claim's δ is ≥ 1: no guarantee for r copies.
UNTESTABLE = "UNTESTABLE"  # No scores could give a bound above the claim at this M.
CONSISTENT = "consistent"  # Testable, and the lower bound does not exceed the claim.
INCONSISTENT = "INCONSISTENT"  # The lower bound exceeds the claim: look for a bug.

# The search for a testing M stops here: more canaries than that is not an audit
# anyone runs (and each bound evaluation costs O(M)).
MAX_CANARIES_SEARCHED = 10_000_000


def reachable_lower_bound(
    num_inserted: int, num_held_out: int, *, confidence: float, delta: float
) -> float:
    """The largest ε lower bound the one-run audit can report with these canaries.

    jax_privacy's `epsilon_one_run` on the best case for the attack: every
    inserted canary scores above every held-out one (all guessed right), with
    the scores tied within each group (the fewest thresholds, so the smallest
    Bonferroni correction). No scores give a larger bound; when it is at most
    the claim, the audit cannot contradict the claim whatever the code does.

    Args:
      num_inserted: canaries inserted into training (about M / 2).
      num_held_out: canaries held out.
      confidence: of the bound, in (0.5, 1).
      delta: the δ of the claim tested, in (0, 1].

    Returns:
      The bound (0.0 when either group is empty: nothing to compare).
    """
    if num_inserted < 1 or num_held_out < 1:
        return 0.0
    from jax_privacy import auditing  # Deferred: only the audit needs it.

    auditor = auditing.CanaryScoreAuditor(np.ones(num_inserted), np.zeros(num_held_out))
    return float(auditor.epsilon_one_run(significance=1 - confidence, delta=delta))


@functools.lru_cache(maxsize=256)
def _half_inserted_bound(num_canaries: int, confidence: float, delta: float) -> float:
    """`reachable_lower_bound` for M canaries, half inserted (the fair coins' mean).

    Cached: the plan before training and the verdict after it search the same Ms.
    """
    inserted = num_canaries // 2
    return reachable_lower_bound(
        inserted, num_canaries - inserted, confidence=confidence, delta=delta
    )


def _round_up_two_digits(number: int) -> int:
    """`number` rounded up to two significant digits (1,075,200 -> 1,100,000)."""
    unit = 10 ** max(0, len(str(number)) - 2)
    return -(-number // unit) * unit


@dataclasses.dataclass(frozen=True)
class CanarySearch:
    """How many canaries would make a claim testable (`canaries_to_test`).

    Attributes:
      num_canaries: an M (within 10% of the smallest, two significant digits)
        whose reachable bound, half of them inserted, exceeds the claim; None
        if no M up to `searched_up_to` does.
      bound: the reachable bound at `num_canaries`, else the largest seen.
      bound_at: the M of `bound`.
      searched_up_to: the largest M tried.
      peaked: True if the bound stopped growing before the cap: its δ term
        (about 2 M δ) grows with M, so more canaries cannot help.
    """

    num_canaries: int | None
    bound: float
    bound_at: int
    searched_up_to: int
    peaked: bool

    def describe(self, epsilon: float) -> str:
        """One phrase: the M that tests ε, or why none does."""
        if self.num_canaries is not None:
            return (
                f"about M = {self.num_canaries:,} canaries (half inserted) would test "
                f"ε = {epsilon:.4g} (they can show up to {self.bound:.3g})"
            )
        if self.peaked:
            return (
                f"no number of canaries can test ε = {epsilon:.4g} at this δ: the reachable "
                f"bound peaks at about {self.bound:.3g} (M = {self.bound_at:,}) and then falls"
            )
        return (
            f"more than {self.searched_up_to:,} canaries would be needed to test "
            f"ε = {epsilon:.4g} (they can show up to {self.bound:.3g})"
        )


def canaries_to_test(
    epsilon: float,
    *,
    confidence: float,
    delta: float,
    start: int = 100,
    max_canaries: int = MAX_CANARIES_SEARCHED,
) -> CanarySearch:
    """Searches the smallest M whose reachable one-run bound exceeds `epsilon`.

    Doubles M from `start` until the bound (half inserted) exceeds `epsilon`,
    stops growing, or M reaches `max_canaries`; then bisects to within 2% and
    rounds up to two significant digits. Each step costs O(M) (jax_privacy's
    δ term): about 20 s for the tiny config's claim on a busy CPU, and the
    results are cached.

    Args:
      epsilon: the claim to test (finite, > 0).
      confidence: of the bound, in (0.5, 1).
      delta: the claim's δ.
      start: first M tried (at least 2).
      max_canaries: the cap on M.

    Returns:
      A `CanarySearch`.
    """

    def bound(m: int) -> float:
        return _half_inserted_bound(m, confidence, delta)

    low, low_bound = start, bound(start)
    if low_bound > epsilon:
        return CanarySearch(low, low_bound, low, low, False)
    while True:
        high = min(2 * low, max_canaries)
        high_bound = bound(high)
        if high_bound > epsilon:
            break
        if high_bound <= low_bound:
            return CanarySearch(None, low_bound, low, high, True)
        if high == max_canaries:
            return CanarySearch(None, high_bound, high, high, False)
        low, low_bound = high, high_bound
    while high - low > max(1, high // 50):
        middle = (low + high) // 2
        if bound(middle) > epsilon:
            high = middle
        else:
            low = middle
    rounded = _round_up_two_digits(high)
    if bound(rounded) > epsilon:
        high = rounded
    return CanarySearch(high, bound(high), high, high, False)


def audit_outcome(
    lower_bound: float, reachable_bound: float, tested_epsilon: float, tested_delta: float
) -> str:
    """Which of `NO_CLAIM`, `VACUOUS`, `INCONSISTENT`, `UNTESTABLE`, `CONSISTENT` holds.

    Args:
      lower_bound: the measured one-run ε lower bound.
      reachable_bound: the largest bound these canaries could give
        (`reachable_lower_bound`).
      tested_epsilon: the claim tested (inf: none).
      tested_delta: its δ.

    Returns:
      The outcome: INCONSISTENT when the bound exceeds the claim; else
      UNTESTABLE when no scores could have exceeded it; else consistent.
    """
    if not math.isfinite(tested_epsilon):
        return NO_CLAIM
    if not tested_delta < 1:
        return VACUOUS
    if lower_bound > tested_epsilon:
        return INCONSISTENT
    if reachable_bound <= tested_epsilon:
        return UNTESTABLE
    return CONSISTENT


def untestable_message(
    num_inserted: int,
    num_held_out: int,
    reachable_bound: float,
    tested_epsilon: float,
    tested_delta: float,
    repeats: int,
    confidence: float,
) -> str:
    """Why the claim cannot be contradicted, and the M (and r) that would test it."""
    search = canaries_to_test(tested_epsilon, confidence=confidence, delta=tested_delta)
    message = (
        f"UNTESTABLE: M = {num_inserted + num_held_out} canaries ({num_inserted} inserted"
        f"{f' {repeats} times' if repeats > 1 else ''}) can show at most ε ≥ "
        f"{reachable_bound:.3g} at {confidence:.0%}, even if every one is guessed right, "
        f"so the claim ε = {tested_epsilon:.4g} cannot be contradicted whatever the code "
        f"does; {search.describe(tested_epsilon)}"
    )
    if repeats > 1:
        message += (
            f". With r = {repeats} the claim tested is the group's ({repeats}ε); r = 1 tests "
            "the per-example ε, the smallest claim"
        )
    return message


def verdict_message(
    outcome: str,
    *,
    lower_bound: float,
    reachable_bound: float,
    tested_epsilon: float,
    tested_delta: float,
    num_inserted: int,
    num_held_out: int,
    repeats: int,
    confidence: float,
) -> str:
    """The sentence `audit.json` and the log give for an `audit_outcome`."""
    if outcome == NO_CLAIM:
        return "no finite ε claimed (non-private run): nothing to contradict"
    if outcome == VACUOUS:
        return f"the claim gives no guarantee for groups of r={repeats} (δ ≥ 1)"
    if outcome == INCONSISTENT:
        return (
            f"INCONSISTENT: the lower bound {lower_bound:.3g} > the claimed ε "
            f"{tested_epsilon:.4g}; a correct run shows this with probability ≤ "
            f"{1 - confidence:.2g}: look for a bug"
        )
    if outcome == UNTESTABLE:
        return untestable_message(
            num_inserted,
            num_held_out,
            reachable_bound,
            tested_epsilon,
            tested_delta,
            repeats,
            confidence,
        )
    return (
        f"consistent: the lower bound {lower_bound:.3g} ≤ the claimed ε {tested_epsilon:.4g} "
        f"(these canaries could have shown up to {reachable_bound:.3g})"
    )


def membership_audit(
    in_scores: np.ndarray,
    out_scores: np.ndarray,
    *,
    claimed_epsilon: float,
    claimed_delta: float,
    repeats: int,
    confidence: float,
) -> dict:
    """AUC, the one-run ε lower bound, the largest reachable one, and the outcome.

    Args:
      in_scores: [n_in] membership scores of inserted canaries (higher = more
        likely a member).
      out_scores: [n_out] scores of held-out canaries.
      claimed_epsilon: the run's claimed ε for one example (inf if non-private).
      claimed_delta: its δ, in (0, 1).
      repeats: r copies per inserted canary; the claim tested is the group claim.
      confidence: of the lower bound (0.95: it exceeds the true ε with
        probability at most 5%).

    Returns:
      dict with auc, epsilon_lower_bound, reachable_epsilon_lower_bound (the
      largest bound any scores of these canaries could give), the tested
      claim, `outcome` (see `audit_outcome`), `contradicted` (the bound exceeds
      the claim, which a correct DP run does with probability at most
      1 - confidence) and the verdict sentence.
    """
    from jax_privacy import auditing  # Deferred: only the audit needs it.

    auditor = auditing.CanaryScoreAuditor(np.asarray(in_scores), np.asarray(out_scores))
    epsilon, delta = group_claim(claimed_epsilon, claimed_delta, repeats)
    vacuous = not delta < 1
    bound_delta = claimed_delta if vacuous else delta
    lower_bound = float(auditor.epsilon_one_run(significance=1 - confidence, delta=bound_delta))
    num_inserted, num_held_out = int(np.size(in_scores)), int(np.size(out_scores))
    reachable = reachable_lower_bound(
        num_inserted, num_held_out, confidence=confidence, delta=bound_delta
    )
    outcome = audit_outcome(lower_bound, reachable, epsilon, delta)
    verdict = verdict_message(
        outcome,
        lower_bound=lower_bound,
        reachable_bound=reachable,
        tested_epsilon=epsilon,
        tested_delta=bound_delta,
        num_inserted=num_inserted,
        num_held_out=num_held_out,
        repeats=repeats,
        confidence=confidence,
    )
    return {
        "auc": float(auditor.attack_auroc()),
        "epsilon_lower_bound": lower_bound,
        "reachable_epsilon_lower_bound": reachable,
        "confidence": confidence,
        "bound_delta": bound_delta,
        "method": "one-run audit (Steinke, Nasr & Jagielski 2023), jax_privacy "
        "CanaryScoreAuditor.epsilon_one_run, Bonferroni over thresholds; reachable: the "
        "same on perfectly separated scores",
        "num_inserted": num_inserted,
        "num_held_out": num_held_out,
        "claimed_epsilon": claimed_epsilon,
        "claimed_delta": claimed_delta,
        "tested_epsilon": epsilon,
        "tested_delta": delta,
        "outcome": outcome,
        "contradicted": outcome == INCONSISTENT,
        "verdict": verdict,
    }


def forecast_claim(config: ml_collections.ConfigDict) -> tuple[float | None, float]:
    """The run's total (ε, δ) as its config promises it, before anything is trained.

    DP-SGD's ε is the config's target (σ is calibrated to it; the plan's ε is
    at most that); a DP-SentencePiece vocabulary adds its ε and δ as the
    trainer's report composes them. The final verdict uses the trained run's
    reported claim, not this.

    Returns:
      (ε, δ); ε is inf for a non-private run or a vocabulary learnt without DP,
      None when the config gives σ instead of a target ε (ε then depends on N).
    """
    if not config.dp.enabled:
        return math.inf, config.dp.delta
    epsilon = None if config.dp.target_epsilon is None else float(config.dp.target_epsilon)
    delta = float(config.dp.delta)
    kind = config.tokenizer.kind
    if kind == "sentencepiece_private":
        return math.inf, delta
    if kind == "dp_sentencepiece":
        params = dp_sentencepiece.DPVocabularyParams(
            noise_stddev=config.tokenizer.dp_noise_stddev,
            delta=config.tokenizer.dp_delta,
            max_words=config.tokenizer.dp_max_words,
        )
        if epsilon is not None:
            epsilon += max(params.epsilon, params.epsilon_analytic)
        delta += params.delta
    return epsilon, delta


def audit_plan(
    num_inserted: int,
    num_held_out: int,
    claim: tuple[float | None, float],
    options: AuditOptions,
) -> tuple[str, str]:
    """Before training: can these canaries contradict the claim at all?

    Args:
      num_inserted: canaries drawn for insertion.
      num_held_out: canaries held out.
      claim: `forecast_claim`'s (ε, δ) for one example; ε None if unknown.
      options: the audit's options (repeats, confidence).

    Returns:
      (expected outcome, or "unknown" when the claim is, and a log line).
    """
    confidence, repeats = options.confidence, options.repeats
    if claim[0] is None:
        reachable = reachable_lower_bound(
            num_inserted, num_held_out, confidence=confidence, delta=claim[1]
        )
        return "unknown", (
            f"Audit plan: {num_inserted + num_held_out} canaries ({num_inserted} inserted) can "
            f"show at most ε ≥ {reachable:.3g} at {confidence:.0%} (δ = {claim[1]:.3g}); the "
            "claim is known once the privacy plan is built (σ given, not a target ε); a "
            f"claim{f' for r = {repeats} copies' if repeats > 1 else ''} at or above that "
            "bound will be UNTESTABLE."
        )
    epsilon, delta = group_claim(*claim, repeats)
    vacuous = not delta < 1
    bound_delta = claim[1] if vacuous else delta
    reachable = reachable_lower_bound(
        num_inserted, num_held_out, confidence=confidence, delta=bound_delta
    )
    outcome = audit_outcome(0.0, reachable, epsilon, delta)
    if outcome == UNTESTABLE:
        detail = untestable_message(
            num_inserted, num_held_out, reachable, epsilon, bound_delta, repeats, confidence
        )
        line = (
            f"Audit plan: the config claims about ε = {epsilon:.4g} (δ = {delta:.3g}). {detail}. "
            "Training anyway: exposure and extraction still measure memorisation."
        )
    elif outcome == CONSISTENT:  # Testable: the bound may land on either side.
        outcome = "testable"
        line = (
            f"Audit plan: the config claims about ε = {epsilon:.4g} (δ = {delta:.3g}); "
            f"{num_inserted + num_held_out} canaries ({num_inserted} inserted) can show up to "
            f"ε ≥ {reachable:.3g} at {confidence:.0%}: the claim is testable."
        )
    else:
        line = "Audit plan: " + verdict_message(
            outcome,
            lower_bound=0.0,
            reachable_bound=reachable,
            tested_epsilon=epsilon,
            tested_delta=bound_delta,
            num_inserted=num_inserted,
            num_held_out=num_held_out,
            repeats=repeats,
            confidence=confidence,
        )
    return outcome, line


class LogLikelihoodScorer:
    """log p(target | source) by teacher forcing, in fixed-shape jitted batches."""

    def __init__(self, model, model_config, params, config, pad_id: int, batch_size: int = 512):
        """Keeps the model; `config.data` gives the (fixed) source and target lengths."""
        self._params = params
        self._pad_id = pad_id
        self._batch_size = batch_size
        self._source_length = config.data.max_source_length
        self._target_length = config.data.max_target_length

        def batch_log_likelihood(params, batch):
            def one(example):
                loss = trainer.example_loss(model, model_config, params, example, None)
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


def _source_prefix(config) -> str:
    pair = parse_pair(config.data.pair)
    return preprocess.family_source_prefix(config.model.family, pair, config.model.source_prefix)


def canary_seed_and_list(workdir: str, options: AuditOptions, seed: int | None):
    """The run's canaries: reloaded from `private/`, or drawn (seed from the OS) and saved.

    Args:
      workdir: the audit's run folder.
      options: audit options; a rerun must use the same ones.
      seed: canary seed for tests; None draws one from the OS (release audits).

    Returns:
      (seed, list of `canaries.Canary`).
    """
    path = os.path.join(workdir, trainer.PRIVATE_DIR, CANARY_FILE)
    if os.path.exists(path):
        with open(path) as f:
            saved = json.load(f)
        if saved["options"] != dataclasses.asdict(options):
            raise ValueError(
                f"{workdir} was audited with other options {saved['options']}; rerun with the "
                "same ones or use a new --workdir."
            )
        return saved["seed"], [canary_lib.Canary(**c) for c in saved["canaries"]]
    seed = secrets.randbits(63) if seed is None else seed
    drawn = canary_lib.make_canaries(
        options.num_canaries,
        key_length=options.key_length,
        secret_length=options.secret_length,
        seed=seed,
        source_template=options.source_template,
        target_template=options.target_template,
    )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(
            {
                "options": dataclasses.asdict(options),
                "seed": seed,
                "canaries": [dataclasses.asdict(c) for c in drawn],
            },
            f,
            indent=1,
        )
    return seed, drawn


def add_pairs_to_train(pairs: list[tuple[str, str]], pair: str):
    """A `corpus_transform` that appends (source, target) pairs to the train split."""
    direction = parse_pair(pair)

    def transform(corpus: datasets.DatasetDict) -> datasets.DatasetDict:
        train = corpus["train"]
        extra = datasets.Dataset.from_dict(
            {"translation": [{direction.source: s, direction.target: t} for s, t in pairs]},
            features=train.features,
        )
        corpus["train"] = datasets.concatenate_datasets([train, extra])
        return corpus

    return transform


def score_canaries(
    config: ml_collections.ConfigDict,
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

    tokenizer, model, model_config, params, _, _ = inference.load_trained(config, workdir)
    scorer = LogLikelihoodScorer(model, model_config, params, config, tokenizer.pad_id)
    prefix = _source_prefix(config)
    max_source, max_target = config.data.max_source_length, config.data.max_target_length
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
    gen = models.decoding.from_model_config(model_config, config.eval.max_new_tokens, num_beams=1)
    hypotheses = evaluation.translate(
        model,
        params,
        tokenizer,
        sources,
        gen=gen,
        batch_size=config.eval.batch_size,
        max_source_length=max_source,
    )
    for row, canary, hypothesis in zip(rows, canaries, hypotheses, strict=True):
        words = hypothesis.split()
        row["exact_match"] = words == canary.target.split()
        row["secret_in_output"] = f" {canary.secret} " in f" {' '.join(words)} "
        row["hypothesis"] = hypothesis
    return rows


def summarize(rows: list[dict], options: AuditOptions, privacy: dict) -> dict:
    """The public audit report from the private per-canary rows and the run's privacy report."""
    inserted = [r for r in rows if r["inserted"]]
    held_out = [r for r in rows if not r["inserted"]]

    def group(members):
        exposures = np.array([r["exposure"] for r in members])
        scores = np.array([r["log_likelihood"] for r in members])
        return {
            "count": len(members),
            "exposure_mean": float(exposures.mean()),
            "exposure_median": float(np.median(exposures)),
            "exposure_max": float(exposures.max()),
            "log_likelihood_mean": float(scores.mean()),
            "exact_match": int(sum(r["exact_match"] for r in members)),
            "secret_in_output": int(sum(r["secret_in_output"] for r in members)),
        }

    # total_epsilon is inf for a non-private run or a vocabulary outside the guarantee.
    claimed_epsilon = privacy["total_epsilon"] if privacy["private"] else math.inf
    claimed_delta = privacy.get("total_delta", privacy["dp_sgd_delta"])
    membership = membership_audit(
        np.array([r["log_likelihood"] for r in inserted]),
        np.array([r["log_likelihood"] for r in held_out]),
        claimed_epsilon=claimed_epsilon,
        claimed_delta=claimed_delta,
        repeats=options.repeats,
        confidence=options.confidence,
    )
    return {
        "options": dataclasses.asdict(options),
        "membership": membership,
        "exposure_max_possible": math.log2(rows[0]["num_candidates"]),
        "inserted": group(inserted),
        "held_out": group(held_out),
        "privacy": {
            "dp_sgd_epsilon": privacy["dp_sgd_epsilon"],
            "dp_sgd_delta": privacy["dp_sgd_delta"],
            "total_epsilon": privacy["total_epsilon"],
            "total_delta": privacy.get("total_delta"),
            "sampling": privacy["sampling"],
            "bound": privacy["bound"],
        },
        "score": "log p(target | source) in nats by teacher forcing (eos included)",
        "note": "exposure: log2(#candidates) - log2(rank of the secret), ties against it; "
        "about 1.4 bits for an unlearnt secret. Secrets and membership: private/.",
    }


def plot_scores(rows: list[dict], report: dict, path: str) -> None:
    """PNG with histograms of inserted vs held-out log-likelihoods and exposures."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, field, label in (
        (axes[0], "log_likelihood", "log p(target | source) (nats)"),
        (axes[1], "exposure", "exposure (bits)"),
    ):
        values = [r[field] for r in rows]
        bins = np.linspace(min(values), max(values) + 1e-9, 25)
        for inserted, name in ((True, "inserted"), (False, "held out")):
            ax.hist(
                [r[field] for r in rows if r["inserted"] == inserted],
                bins=bins,
                alpha=0.6,
                label=name,
            )
        ax.set_xlabel(label)
        ax.set_ylabel("canaries")
        ax.legend()
    membership = report["membership"]
    reachable = membership["reachable_epsilon_lower_bound"]
    fig.suptitle(
        f"AUC {membership['auc']:.3f}; ε ≥ {membership['epsilon_lower_bound']:.3g} "
        f"({membership['confidence']:.0%}, reachable {reachable:.3g}) "
        f"vs claimed {membership['tested_epsilon']:.4g}: {membership['outcome']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_audit(
    config: ml_collections.ConfigDict,
    workdir: str,
    options: AuditOptions,
    *,
    canary_seed: int | None = None,
) -> dict:
    """Inserts canaries, trains (or resumes), scores them and writes the audit.

    Args:
      config: the run config.
      workdir: the run's folder (a training workdir plus the audit's files).
      options: the audit's options.
      canary_seed: fixed seed for tests; None draws one from the OS.

    Returns:
      The report written to `workdir/audit.json`.
    """
    seed, canaries = canary_seed_and_list(workdir, options, canary_seed)
    num_inserted = sum(c.inserted for c in canaries)
    expected, plan = audit_plan(
        num_inserted, len(canaries) - num_inserted, forecast_claim(config), options
    )
    (logging.warning if expected == UNTESTABLE else logging.info)(plan)
    transform = add_pairs_to_train(
        canary_lib.training_pairs(canaries, options.repeats), config.data.pair
    )
    results = trainer.train_and_evaluate(config, workdir, corpus_transform=transform)
    rows = score_canaries(config, workdir, canaries, options, seed)
    report = summarize(rows, options, results["privacy"])
    trainer.write_json(os.path.join(workdir, trainer.PRIVATE_DIR, CANARY_SCORES_FILE), rows)
    trainer.write_json(os.path.join(workdir, AUDIT_FILE), report)
    plot_scores(rows, report, os.path.join(workdir, PLOT_FILE))
    logging.info(
        "Audit: AUC %.3f, ε lower bound %.3g (%.0f%%), exposure inserted %.2f vs held-out "
        "%.2f bits; %s",
        report["membership"]["auc"],
        report["membership"]["epsilon_lower_bound"],
        100 * options.confidence,
        report["inserted"]["exposure_mean"],
        report["held_out"]["exposure_mean"],
        report["membership"]["verdict"],
    )
    return report
