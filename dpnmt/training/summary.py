"""The few human lines that end a training run: its privacy, its test scores, what to run next.

Read from results.json's published values only, so the lines keep the log's
rules (README "Privacy rules the code keeps"): no exact count of a private
split, no training loss, no seed; paths are the `--workdir` as the user gave
it (the log names local paths already; nothing here adds an absolute one).
"""

import math
import os
import shlex

from dpnmt.training.privacy_report import PrivacyReport
from dpnmt.training.run_dir import PRIVATE_DIR, RESULTS_FILE


def _epsilon(value) -> str:
    value = float(value)
    return "∞" if math.isinf(value) else f"{value:.3g}"


def privacy_line(report: PrivacyReport) -> str:
    """ε of DP-SGD and in total, δ, the sampling and bound, or why there is no guarantee."""
    if not report.private:
        return "Privacy: non-private run: no guarantee (ε = ∞)."
    sampling = (
        f"{report.sampling} sampling, σ {report.noise_multiplier:.3g}, "
        f"C {report.l2_clip:g}, q {report.sampling_rate:.3g}, T {report.steps_planned} lots"
    )
    if_secret = report.epsilon_if_seed_were_secret_NOT_A_GUARANTEE
    if if_secret is not None:
        return (
            "Privacy: NO guarantee, the noise seed was fixed (tests only); DP-SGD's ε would be "
            f"{_epsilon(if_secret)} at δ = {report.dp_sgd_delta:g} with a secret seed ({sampling})."
        )
    delta = report.total_delta if report.total_delta is not None else report.dp_sgd_delta
    unit = report.privacy_unit
    per = (
        f" per whole group (dp.unit=group: a user or document, at most k = {unit.group_cap} "
        "of its pairs per lot)"
        if unit is not None and unit.unit == "group"
        else " per sentence pair"
    )
    return (
        f"Privacy{per}: ε = {_epsilon(report.dp_sgd_epsilon)} for DP-SGD ({sampling}); "
        f"ε = {_epsilon(report.total_epsilon)} in total at δ = {delta:g} ({report.composition})."
    )


def test_line(test: dict | None) -> str:
    """Test BLEU and chrF (a public split), or that none was computed."""
    if not test or test.get("bleu") is None:
        return "Test: not scored (no test split, or data.max_test_examples=0)."
    scores = [f"BLEU {test['bleu']:.1f}"]
    if test.get("chrf") is not None:
        scores.append(f"chrF {test['chrf']:.1f}")
    bertscore = test.get("bertscore")
    if isinstance(bertscore, dict) and bertscore.get("f1") is not None:
        scores.append(f"BERTScore F1 {bertscore['f1']:.3f}")
    return f"Test: {', '.join(scores)} on {test.get('num_sentences', '?')} sentences."


def end_of_run_lines(results: dict, workdir: str) -> list[str]:
    """The run's summary for a person: privacy, test scores, where the files are, what next.

    Args:
      results: results.json's dict (`loop.train_and_evaluate`'s return).
      workdir: the run's folder, as given on the command line.
    """
    report = PrivacyReport.from_json(results["privacy"])
    folder = shlex.quote(workdir)
    export_to = shlex.quote(os.path.normpath(workdir) + "_export")
    lines = [
        privacy_line(report),
        test_line(results.get("test")),
        f"Results: {os.path.join(workdir, RESULTS_FILE)} (scores, the privacy report); "
        f"never publish {os.path.join(workdir, PRIVATE_DIR)}/ (the secret seed). Curves: "
        f"python -m dpnmt.report --workdir={folder}, or tensorboard --logdir {folder}",
        f"Model card and a transformers model: python -m dpnmt.export --workdir={folder} "
        f"--out={export_to}; then translate: python -m dpnmt.translate --model={export_to}",
    ]
    if results.get("validation_is_private"):
        lines.append(
            "Validation was carved from the private training data: its scores are outside "
            "the guarantee (results.json validation_note)."
        )
    return lines
