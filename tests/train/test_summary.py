"""The human lines that end a run (`training.summary`): what they say and what they never say."""

import math

from dpnmt.data.tokenizers import VocabularyRecord
from dpnmt.training import summary
from dpnmt.training.privacy_report import privacy_report
from tests.small_configs import small_plan

DP_VOCABULARY = VocabularyRecord("dp_sentencepiece", True, 2.0, 1e-9, "DP vocabulary")
TEST = {"bleu": 12.34, "bleu_signature": "nrefs:1", "chrf": 40.12, "num_sentences": 1000}


def _results(plan, vocabulary=DP_VOCABULARY, test=TEST):
    report = privacy_report(plan, plan.num_steps, vocabulary)
    return {"finished": True, "test": test, "privacy": report.to_json(), "steps_done": 10}, report


def test_a_private_run_says_its_two_epsilons_delta_sampling_and_scores():
    results, report = _results(small_plan())
    lines = summary.end_of_run_lines(results, "runs/tiny")
    privacy, test, where, export = lines
    assert f"ε = {report.dp_sgd_epsilon:.3g} for DP-SGD (poisson sampling" in privacy
    assert f"ε = {report.total_epsilon:.3g} in total at δ = {1e-6 + 1e-9:g}" in privacy
    assert math.isclose(report.total_epsilon, report.dp_sgd_epsilon + 2.0)
    assert test == "Test: BLEU 12.3, chrF 40.1 on 1000 sentences."
    assert where.startswith("Results: runs/tiny/results.json") and "runs/tiny/private/" in where
    assert where.endswith(
        "python -m dpnmt.report --workdir=runs/tiny, or tensorboard --logdir runs/tiny"
    )
    assert "python -m dpnmt.export --workdir=runs/tiny --out=runs/tiny_export" in export
    assert "python -m dpnmt.translate --model=runs/tiny_export" in export


def test_the_summary_holds_no_count_loss_or_other_path_than_the_workdir_given():
    results, report = _results(small_plan())
    results["train_loss"] = 1.2345  # Were one there, the summary must not repeat it.
    text = "\n".join(summary.end_of_run_lines(results, "runs/tiny"))
    assert "1.23" not in text and "loss" not in text
    assert str(report.dataset_size) not in text.replace("1000 sentences", "")  # N: no count.
    paths = [word.split("=")[-1] for word in text.split() if "/" in word]
    assert paths and all(path.startswith("runs/tiny") for path in paths)  # The workdir as given.


def test_a_non_private_run_and_a_run_without_test_scores():
    results, _ = _results(small_plan(private=False), test=None)
    privacy, test, *_ = summary.end_of_run_lines(results, "w")
    assert privacy == "Privacy: non-private run: no guarantee (ε = ∞)."
    assert test.startswith("Test: not scored")


def test_the_privacy_line_names_the_unit_its_epsilon_is_for():
    from dpnmt import config_lib, privacy

    config = config_lib.base_config()
    config.dp.update(unit="group", group_cap=8, delta=1e-5, noise_multiplier=1.2)
    config.train.expected_lot_size, config.train.num_epochs = 6, 1
    plan = privacy.plan_privacy(config.dp, config.train, dataset_size=968, num_groups=42)
    privacy_line, *_ = summary.end_of_run_lines(_results(plan)[0], "w")
    assert privacy_line.startswith("Privacy per whole group (dp.unit=group")
    assert "k = 8" in privacy_line
    assert "42" not in privacy_line and "968" not in privacy_line  # No count (N_groups, pairs).
    privacy_line, *_ = summary.end_of_run_lines(_results(small_plan())[0], "w")
    assert privacy_line.startswith("Privacy per sentence pair: ε = ")
