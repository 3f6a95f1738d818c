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


def _up(value: float, digits: int) -> str:
    """`value` rounded up to `digits` significant digits (a stated ε or δ never rounds down)."""
    if value <= 0 or not math.isfinite(value):
        return f"{value:g}"
    unit = 10.0 ** (math.floor(math.log10(value)) - digits + 1)
    return f"{math.ceil(value / unit * (1 - 1e-12)) * unit:.{digits}g}"


def _count(n: int, noun: str) -> str:
    """'1 run', '2 runs'."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def released_together(runs: list[runs_table.PublishedRun], starts: list[dict] = ()) -> str:
    """What the table's private rows guarantee published together (`epsilon_check`).

    Args:
      runs: the table's runs.
      starts: the table's start rows (`runs_table.start_rows`): any with an ε
        total above 0 on this corpus is named, not composed.
    """
    private = [run for run in runs if run.privacy["private"]]
    public = [run.name for run in runs if not run.privacy["private"]]
    lines = ["## The rows released together", ""]
    if not private:
        lines.append("No private run among the trained rows: none of them has a guarantee.")
    elif len(private) == 1:
        lines.append(f"One private run, {private[0].name}: its ε holds for its own model.")
    else:
        together = epsilon_check.released_together([run.privacy for run in private])
        if together.added == 0:
            how = "their DP-SGD runs composed with dp_accounting"
        elif together.events == 0:
            how = "their whole totals added (basic composition)"
        else:
            how = (
                f"the DP-SGD of {_count(together.events, 'run')} composed with dp_accounting, "
                f"the whole totals of {_count(together.added, 'run')} added (basic composition)"
            )
        if math.isfinite(together.epsilon):
            lines.append(
                f"Each row's ε holds for its own model. The {len(private)} private rows "
                f"published together are ε {_up(together.epsilon, 4)} at δ "
                f"{_up(together.delta, 3)} for {together.unit} ({how}: an upper bound whatever "
                f"their training data share{'; ' + together.note if together.note else ''})."
            )
        else:
            lines.append(
                f"Each row's ε holds for its own model. The {len(private)} private rows "
                f"together: no joint bound is stated ({together.note})."
            )
    if public:
        lines.append(
            f"Not private: {', '.join(public)}. An example a non-private row trained on "
            "has no guarantee wherever that row is published beside the others."
        )
    spent = list(dict.fromkeys(r["run"].split(" [")[0] for r in starts if r["epsilon_total"] != 0))
    if spent:
        lines.append(
            f"Starts with an ε of their own on this corpus: {', '.join(spent)}; not composed "
            "above (add their ε by basic composition)."
        )
    return "\n\n".join([lines[0], *lines[2:]]) + "\n"


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
