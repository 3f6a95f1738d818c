"""The sections under the runs table: noise to signal, rows together, extrapolation, samples.

Each reads only what a run folder publishes: `noise_to_signal.json` (from
`python -m dpnmt.noise_to_signal`, written there only when validation is a
public split), `decode_test/hypotheses.test.txt` (from `python -m dpnmt.decode`)
and the validation curve (`runs_table.validation_curve`).
"""

import json
import math
import os

from dpnmt.sweeps import epsilon_check, extrapolate, runs_table

NOISE_TO_SIGNAL = "noise_to_signal.json"
TEST_HYPOTHESES = os.path.join("decode_test", "hypotheses.test.txt")


def noise_to_signal(runs: list[runs_table.PublishedRun]) -> str:
    """One line per private run: noise norm against the clipped-mean norm, or what is public."""
    lines = ["## Noise to signal (private runs)", ""]
    for run in runs:
        privacy = run.privacy
        if not privacy["private"]:
            continue
        sigma, clip, lot = (
            privacy["noise_multiplier"],
            privacy["l2_clip"],
            privacy["expected_lot_size"],
        )
        path = os.path.join(run.folder, NOISE_TO_SIGNAL)
        if os.path.isfile(path):
            with open(path) as f:
                m = json.load(f)
            lines.append(
                f"- {run.name}: noise σC√d/L = {m['noise_norm']:.3g} (d = {m['num_trainable']:,}); "
                f"‖mean clip(g)‖ on validation {m['initial']['mean_clipped_norm']:.3g} at the "
                f"start → {m['trained']['mean_clipped_norm']:.3g} trained; noise/signal "
                f"{m['initial']['noise_to_signal']:.1f} → {m['trained']['noise_to_signal']:.1f}."
            )
        else:
            lines.append(
                f"- {run.name}: noise std per coordinate of the averaged gradient σC/L = "
                f"{sigma * clip / lot:.3g} (σ = {sigma:.3f}, C = {clip:g}, L = {lot}); the "
                f"clipped-mean norm is not published (no {NOISE_TO_SIGNAL}: run `python -m "
                "dpnmt.noise_to_signal` on the run), so no ratio."
            )
    if len(lines) == 2:
        lines.append("No private run among these runs.")
    return "\n".join(lines) + "\n"


def released_together(runs: list[runs_table.PublishedRun]) -> str:
    """What the table's private rows guarantee when published together (`epsilon_check`)."""
    private = [run for run in runs if run.privacy["private"]]
    public = [run.name for run in runs if not run.privacy["private"]]
    lines = ["## The rows released together", ""]
    if len(private) < 2:
        lines.append(f"{len(private)} private run: its row's ε is the table's guarantee.")
    else:
        epsilon, delta = epsilon_check.released_together([run.privacy for run in private])
        together = f"ε {epsilon:.2f} at δ {delta:.3g}" if math.isfinite(epsilon) else "ε ∞"
        lines.append(
            f"Each row's ε holds for its own model. The {len(private)} private rows published "
            f"together are {together} for one training example: their DP-SGD runs composed "
            "with dp_accounting, an upper bound whatever their training data share."
        )
    if public:
        lines.append(
            f"Not private: {', '.join(public)}. An example a non-private row trained on "
            "has no guarantee wherever that row is published beside the others."
        )
    return "\n".join(lines) + "\n"


def extrapolation(runs: list[runs_table.PublishedRun], at_epochs: float | None) -> str:
    """One labelled line per run: its validation BLEU curve fitted and extrapolated."""
    lines = [
        "## Validation BLEU extrapolated from the measured curves",
        "",
        f"Lines marked {extrapolate.LABEL} come from a saturating fit of the measured "
        "validation BLEU by epoch; they estimate what more training would buy, not results.",
        "",
    ]
    for run in runs:
        if runs_table.private_validation(run):
            lines.append(
                f"- {run.name}: validation carved from the private train split: not shown."
            )
            continue
        lines.append(extrapolate.describe(run.name, runs_table.validation_curve(run), at_epochs))
    return "\n".join(lines) + "\n"


def samples(runs: list[runs_table.PublishedRun], count: int) -> str:
    """The first `count` test translations of each run that published its test decode."""
    lines = ["## Sample test translations (first lines of the test split)", ""]
    for run in runs:
        path = os.path.join(run.folder, TEST_HYPOTHESES)
        if not os.path.isfile(path):
            lines.append(f"- {run.name}: no published test decode ({TEST_HYPOTHESES}).")
            continue
        with open(path, encoding="utf-8") as f:
            hypotheses = [line.rstrip("\n") for _, line in zip(range(count), f, strict=False)]
        lines.append(f"- {run.name}:")
        lines += [f"  {i + 1}. {h or '(empty)'}" for i, h in enumerate(hypotheses)]
    return "\n".join(lines) + "\n"
