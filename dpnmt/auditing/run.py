"""The audit end to end: canaries into the training split, train, score, report.

Private outputs (the secrets, which canaries were inserted, per-canary scores)
go to `workdir/private/`; `audit.json` and `audit_scores.png` hold aggregates.
"""

import dataclasses
import json
import logging
import math
import os
import secrets

import datasets
import numpy as np

from dpnmt.auditing import canaries as canary_lib
from dpnmt.auditing.options import AuditOptions
from dpnmt.auditing.scoring import score_canaries
from dpnmt.auditing.statistics import UNTESTABLE, audit_plan, forecast_claim, membership_audit
from dpnmt.config import RunConfig
from dpnmt.data.groups import GROUP_COLUMN
from dpnmt.data.languages import parse_pair
from dpnmt.training import loop
from dpnmt.training.privacy_report import PrivacyReport
from dpnmt.training.run_dir import RunDir, write_json

AUDIT_FILE = "audit.json"
PLOT_FILE = "audit_scores.png"
CANARY_FILE = "canaries.json"  # Under private/: secrets and membership.
CANARY_SCORES_FILE = "audit_canaries.json"  # Under private/.


def canary_seed_and_list(workdir: str, options: AuditOptions, seed: int | None):
    """The run's canaries: reloaded from `private/`, or drawn (seed from the OS) and saved.

    Args:
      workdir: the audit's run folder.
      options: audit options; a rerun must use the same ones.
      seed: canary seed for tests; None draws one from the OS (release audits).

    Returns:
      (seed, list of `canaries.Canary`).
    """
    path = RunDir(workdir).private_file(CANARY_FILE)
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
        columns = {"translation": [{direction.source: s, direction.target: t} for s, t in pairs]}
        if GROUP_COLUMN in train.column_names:
            # Each canary is a group of its own, named apart from the corpus's groups.
            taken = set(train[GROUP_COLUMN])
            names = (f"dpnmt-canary-{i}" for i in range(len(pairs) + len(taken) + 1))
            columns[GROUP_COLUMN] = [name for name in names if name not in taken][: len(pairs)]
        extra = datasets.Dataset.from_dict(columns, features=train.features)
        corpus["train"] = datasets.concatenate_datasets([train, extra])
        return corpus

    return transform


def summarize(rows: list[dict], options: AuditOptions, privacy: PrivacyReport) -> dict:
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
    claimed_epsilon, claimed_delta = privacy.claimed
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
            "dp_sgd_epsilon": privacy.dp_sgd_epsilon,
            "dp_sgd_delta": privacy.dp_sgd_delta,
            "total_epsilon": privacy.total_epsilon,
            "total_delta": privacy.total_delta,
            "sampling": privacy.sampling,
            "bound": privacy.bound,
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
    run: RunConfig,
    workdir: str,
    options: AuditOptions,
    *,
    canary_seed: int | None = None,
) -> dict:
    """Inserts canaries, trains (or resumes), scores them and writes the audit.

    Args:
      run: the run's config (`training.preflight.read_config`).
      workdir: the run's folder (a training workdir plus the audit's files).
      options: the audit's options.
      canary_seed: fixed seed for tests; None draws one from the OS.

    Returns:
      The report written to `workdir/audit.json`.
    """
    seed, canaries = canary_seed_and_list(workdir, options, canary_seed)
    num_inserted = sum(c.inserted for c in canaries)
    expected, plan = audit_plan(
        num_inserted, len(canaries) - num_inserted, forecast_claim(run), options
    )
    (logging.warning if expected == UNTESTABLE else logging.info)(plan)
    transform = add_pairs_to_train(
        canary_lib.training_pairs(canaries, options.repeats), run.data.pair
    )
    results = loop.train_and_evaluate(run, workdir, corpus_transform=transform)
    rows = score_canaries(run, workdir, canaries, options, seed)
    report = summarize(rows, options, PrivacyReport.from_json(results["privacy"]))
    RunDir(workdir).write_private_json(CANARY_SCORES_FILE, rows)
    write_json(os.path.join(workdir, AUDIT_FILE), report)
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
