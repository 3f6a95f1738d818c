"""Empirical privacy audit of a training run: the library behind `python -m dpnmt.audit`.

1. Canaries (`canaries`): M secret sentence pairs, each inserted into the
   training split r times with probability 1/2, else held out.
2. Training: `dpnmt.training.train_and_evaluate` with the canaries added to train
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

Modules: `canaries` (drawing them, exposure), `options` (`AuditOptions`),
`statistics` (the one-run bound, testability, verdicts), `scoring`
(log-likelihood, exposure and extraction of a trained run), `run` (the audit
end to end: `run_audit`).
"""

from dpnmt.auditing import canaries
from dpnmt.auditing.options import AuditOptions
from dpnmt.auditing.run import (
    AUDIT_FILE,
    CANARY_FILE,
    CANARY_SCORES_FILE,
    PLOT_FILE,
    add_pairs_to_train,
    canary_seed_and_list,
    plot_scores,
    run_audit,
    summarize,
)
from dpnmt.auditing.scoring import LogLikelihoodScorer, score_canaries
from dpnmt.auditing.statistics import (
    CONSISTENT,
    INCONSISTENT,
    MAX_CANARIES_SEARCHED,
    NO_CLAIM,
    UNTESTABLE,
    VACUOUS,
    CanarySearch,
    audit_outcome,
    audit_plan,
    canaries_to_test,
    forecast_claim,
    group_claim,
    membership_audit,
    reachable_lower_bound,
    untestable_message,
    verdict_message,
)

__all__ = [
    "AUDIT_FILE",
    "CANARY_FILE",
    "CANARY_SCORES_FILE",
    "CONSISTENT",
    "INCONSISTENT",
    "MAX_CANARIES_SEARCHED",
    "NO_CLAIM",
    "PLOT_FILE",
    "UNTESTABLE",
    "VACUOUS",
    "AuditOptions",
    "CanarySearch",
    "LogLikelihoodScorer",
    "add_pairs_to_train",
    "audit_outcome",
    "audit_plan",
    "canaries",
    "canaries_to_test",
    "canary_seed_and_list",
    "forecast_claim",
    "group_claim",
    "membership_audit",
    "plot_scores",
    "reachable_lower_bound",
    "run_audit",
    "score_canaries",
    "summarize",
    "untestable_message",
    "verdict_message",
]
