"""dp.unit = "group": the plan and results.json over groups, and the config's refusals."""

import json

import dp_accounting
import pytest
from dp_accounting.pld import pld_privacy_accountant

from dpnmt import config_lib, privacy
from dpnmt.config import RunConfig
from dpnmt.data.tokenizers import VocabularyRecord
from dpnmt.errors import ConfigError
from dpnmt.training import run_dir
from dpnmt.training.privacy_report import PrivacyReport, privacy_report

VOCAB = VocabularyRecord("dp_sentencepiece", True, epsilon=0.5, delta=1e-9)


def _configs(**dp):
    config = config_lib.base_config()
    config.dp.update(dp)
    return config.dp, config.train


def _group_plan(**dp):
    dp, train = _configs(unit="group", group_cap=8, delta=1e-5, **dp)
    train.expected_lot_size, train.num_epochs = 6, 5
    return privacy.plan_privacy(dp, train, dataset_size=968, largest_group=55, num_groups=42)


def test_group_plan_accounts_over_groups_and_results_json_is_recomputable(tmp_path):
    plan = _group_plan(noise_multiplier=1.2)  # Given σ: no calibration (slow).
    assert (plan.unit, plan.num_groups, plan.group_cap) == ("group", 42, 8)
    assert plan.sampling_rate == pytest.approx(6 / 42) and plan.num_steps == round(5 * 42 / 6)
    record = privacy_report(plan, plan.num_steps, VOCAB)
    path = tmp_path / "results.json"
    run_dir.write_json(str(path), {"privacy": record.to_json()})
    loaded = json.loads(path.read_text())["privacy"]
    assert PrivacyReport.from_json(loaded) == record
    unit = loaded["privacy_unit"]
    assert (unit["unit"], unit["num_groups"], unit["group_cap"]) == ("group", 42, 8)
    # Recomputed from the published numbers alone, with dp_accounting.
    accountant = pld_privacy_accountant.PLDAccountant()
    accountant.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(
                unit["sampling_rate"], dp_accounting.GaussianDpEvent(unit["noise_multiplier"])
            ),
            unit["steps_planned"],
        )
    )
    independent = accountant.get_epsilon(unit["delta"])
    assert unit["epsilon_per_group"] == pytest.approx(independent, rel=1e-6)
    assert 1.0 < independent < 100.0
    assert loaded["dp_sgd_epsilon"] == unit["epsilon_per_group"]
    assert "whole group" in loaded["adjacency"] and "groups" in loaded["bound"]
    # ε is already per group: no group-privacy conversion on top.
    assert "group_privacy" not in loaded


def test_example_plans_are_unchanged_and_carry_no_unit_record():
    dp, train = _configs(noise_multiplier=1.2)
    plan = privacy.plan_privacy(dp, train, dataset_size=968, largest_group=55, num_groups=42)
    assert plan.unit == "example" and plan.num_groups is None and plan.dataset_size == 968
    report = privacy_report(plan, plan.num_steps, VOCAB).to_json()
    assert "privacy_unit" not in report and "group_privacy" in report


@pytest.mark.parametrize(
    "dp, num_groups, message",
    [
        ({"group_cap": 8}, None, "names none; use dp.unit='example' or add the column"),
        ({}, 42, "dp.group_cap=None: dp.unit='group' needs an int k >= 1"),
        ({"group_cap": 0}, 42, "dp.group_cap=0"),
        ({"group_cap": 8, "sampling": "shuffle"}, 42, "needs dp.sampling='poisson'"),
        ({"group_cap": 8, "unit": "user"}, 42, "dp.unit='user' must be one of"),
    ],
)
def test_group_plans_refuse_what_they_lack(dp, num_groups, message):
    dp = {"unit": "group", "target_epsilon": 8.0, **dp}
    dp, train = _configs(**dp)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        privacy.plan_privacy(dp, train, dataset_size=968, num_groups=num_groups)


def test_config_refuses_group_unit_until_training_implements_it():
    config = config_lib.make_config("eps5")
    config.dp.unit = "group"
    with pytest.raises(ConfigError) as error:
        RunConfig.parse(config)
    text = str(error.value)
    assert "dp.group_cap=None" in text
    assert "not yet implemented in training" in text
    config.dp.group_cap = 8
    with pytest.raises(ConfigError, match="not yet implemented in training"):
        RunConfig.parse(config)
    config.dp.unit = "user"
    with pytest.raises(ConfigError, match="dp.unit='user' is unknown"):
        RunConfig.parse(config)
    config.dp.unit = "example"
    assert RunConfig.parse(config).dp.unit == "example"
