"""`dp.group_lot_size`: L_groups, the lot in groups, one source for the plan (issue 31).

The literal `--config=configs/clinspen.py:eps8 --config.dp.unit=group` plans and
trains (its lot of 128 pairs would be refused as groups: ClinSpEn has 42); the
field is read only with dp.unit=group; the committed group runs, saved before
the field existed, restore to the plan they ran.
"""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import dp_accounting
import pytest
from dp_accounting.pld import pld_privacy_accountant

from dpnmt import config_lib, privacy
from dpnmt.config import RunConfig
from dpnmt.data.tokenizers import VocabularyRecord
from dpnmt.errors import ConfigError
from dpnmt.training import run_dir, steps
from dpnmt.training.privacy_report import privacy_report
from tests.markers import needs_data
from tests.small_configs import load_config
from tests.tiny_export import write_tiny_export

ROOT = pathlib.Path(__file__).resolve().parents[2]
PUBLIC = VocabularyRecord("pretrained", False)
# ClinSpEn-CC's train split (issue 31): 968 pairs in 42 case reports, the largest 55.
PAIRS, GROUPS, LARGEST = 968, 42, 55


def _literal(**fields):
    """configs/clinspen.py:eps8 with --config.dp.unit=group (and `fields` overridden)."""
    config = load_config("clinspen", "eps8")
    config.update_from_flattened_dict({"dp.unit": "group", **fields})
    return config


def epsilon_from_unit_record(unit: dict) -> float:
    """ε of the published σ, q and T, recomputed with dp_accounting alone."""
    accountant = pld_privacy_accountant.PLDAccountant()
    accountant.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(
                unit["sampling_rate"], dp_accounting.GaussianDpEvent(unit["noise_multiplier"])
            ),
            unit["steps_planned"],
        )
    )
    return accountant.get_epsilon(unit["delta"])


def test_the_literal_clinspen_group_command_plans_over_groups():
    run = RunConfig.parse(_literal())
    assert (run.dp.group_lot_size, run.train.expected_lot_size) == (8, 128)  # groups, pairs
    plan = privacy.plan_privacy(run.dp, run.train, PAIRS, largest_group=LARGEST, num_groups=GROUPS)
    assert (plan.unit, plan.num_groups, plan.group_cap) == ("group", GROUPS, 8)
    assert plan.expected_lot_size == 8 and plan.sampling_rate == 8 / GROUPS
    assert plan.num_steps == round(10 * GROUPS / 8) and plan.steps_per_epoch == GROUPS // 8
    record = json.loads(json.dumps(privacy_report(plan, plan.num_steps, PUBLIC).to_json()))
    unit = record["privacy_unit"]
    assert (unit["unit"], unit["num_groups"], unit["group_cap"]) == ("group", GROUPS, 8)
    assert unit["expected_groups_per_lot"] == 8 and unit["sampling_rate"] == 8 / GROUPS
    assert unit["epsilon_per_group"] == pytest.approx(epsilon_from_unit_record(unit), rel=1e-6)
    assert unit["epsilon_per_group"] == pytest.approx(8.0, rel=1e-2)  # The variant's target.
    assert record["expected_lot_size"] == 8 and record["dataset_size"] == GROUPS
    # The step's noise: N(0, σ²C²) on the sum of clipped group contributions, ÷ L_groups.
    step = steps.StepPrivacy.from_plan(plan)
    assert step.expected_lot_size == 8 and step.noise_multiplier == plan.noise_multiplier


def test_resuming_a_group_run_with_another_group_lot_is_refused(tmp_path):
    run = RunConfig.parse(_literal())
    run_dir.RunDir(str(tmp_path)).bind_config(run)
    (tmp_path / run_dir.CHECKPOINT_DIR / "5").mkdir(parents=True)  # A checkpoint binds.
    assert run_dir.workdir_problems(str(tmp_path), run) == []
    (problem,) = run_dir.workdir_problems(
        str(tmp_path), RunConfig.parse(_literal(**{"dp.group_lot_size": 6}))
    )
    assert "dp.group_lot_size: run 8, now 6" in problem
    assert "--config.dp.group_lot_size=8" in problem


def test_a_per_pair_run_does_not_read_group_lot_size():
    config = load_config("clinspen", "eps8")
    config.dp.group_lot_size = 0  # Not even checked: read only with dp.unit=group.
    run = RunConfig.parse(config)
    plan = privacy.plan_privacy(
        dataclasses.replace(run.dp, target_epsilon=None, noise_multiplier=1.0), run.train, PAIRS
    )
    assert (plan.unit, plan.expected_lot_size, plan.dataset_size) == ("example", 128, PAIRS)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"dp.group_lot_size": 0}, "dp.group_lot_size=0 must be an int >= 1: L_groups"),
        ({"dp.group_cap": None}, "dp.group_cap=None: dp.unit='group' needs dp.group_cap = k"),
    ],
)
def test_the_config_refuses_a_group_run_without_a_group_lot_or_cap(fields, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        RunConfig.parse(_literal(**fields))


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {"dp.group_lot_size": 42},
            "dp.group_lot_size=42 (groups per lot) must be in [1, N_groups=42) (groups of the "
            "train pairs kept after preprocessing); lower it.",
        ),
        (
            {"dp.group_lot_size": None},
            "dp.unit='group' with dp.group_lot_size unset reads train.expected_lot_size=128 as "
            "groups per lot, which must be in [1, N_groups=42) (groups of the train pairs kept "
            "after preprocessing): set dp.group_lot_size, the expected groups per lot (e.g. "
            "--config.dp.group_lot_size=8).",
        ),
    ],
)
def test_the_plan_refuses_a_group_lot_not_below_n_groups_naming_the_field(fields, message):
    run = RunConfig.parse(_literal(**fields))
    assert privacy.size_problems(run.dp, run.train, PAIRS, num_groups=GROUPS) == [message]


def test_without_group_lot_size_the_lot_still_counts_groups_as_older_runs_did():
    """docs/results/groups_*/group ran before dp.group_lot_size: same plan as the configs now."""
    for corpus in ("groups_clinspen", "groups_bsd"):
        folder = ROOT / "docs" / "results" / corpus / "group"
        saved = json.loads((folder / "config.json").read_text())
        assert "group_lot_size" not in saved["dp"]
        published = json.loads((folder / "results.json").read_text())["privacy"]
        now = RunConfig.parse(load_config(corpus, "eps8,group"))
        plans = []
        for run in (RunConfig.of(saved), now):
            dp = dataclasses.replace(run.dp, noise_multiplier=published["noise_multiplier"])
            size = published["dataset_size"]
            plans.append(privacy.plan_privacy(dp, run.train, size + 1, num_groups=size))
        assert plans[0] == plans[1]
        assert plans[0].expected_lot_size == published["expected_lot_size"] == 8
        assert plans[0].num_steps == published["steps_planned"]
        assert now.train.expected_lot_size == 64  # Pairs: not read in a group run.


def test_the_eval_schedule_of_a_group_run_counts_examples_not_groups():
    run = RunConfig.parse(_literal(**{"data.max_eval_examples": 200}))
    per_example = RunConfig.parse(load_config("clinspen", "eps8"))
    # EVAL_EXAMPLE_RATIO x 200 eval examples over L_groups x k = 64 (not 128 pairs, not 8).
    assert run.eval_every_steps(1) == -(-config_lib.EVAL_EXAMPLE_RATIO * 200 // 64)
    assert per_example.eval_every_steps(1) == -(-config_lib.EVAL_EXAMPLE_RATIO * 200 // 128)


# --- the literal command, end to end -------------------------------------------------


@pytest.fixture(scope="module")
def local_model(tmp_path_factory):
    """A 16-wide T5 and its SentencePiece vocabulary as a transformers folder (no hub)."""
    sentence = "una frase pequeña {i} aquí, a small sentence"
    return write_tiny_export(tmp_path_factory.mktemp("model"), sentence)


def _train(tmp_path, local_model, *overrides):
    """`python -m dpnmt.train` with the literal flags, a local model and tiny sizes.

    Clipping per group by vmap (CI time: ghost unrolls the k = 8 rows of a group,
    84 s against 36 s, cold on 8 CPU devices); ghost group runs train in test_group_unit.py.
    """
    args = [
        "--config=" + str(ROOT / "configs" / "clinspen.py") + ":eps8",
        "--config.dp.unit=group",
        "--config.dp.clipping=vmap",
        f"--config.model.name_or_path={local_model}",
        "--config.data.max_source_length=16",
        "--config.data.max_target_length=16",
        "--config.data.max_eval_examples=4",
        "--config.data.max_test_examples=4",
        "--config.eval.max_new_tokens=4",
        "--config.train.num_epochs=1",
        "--config.train.eval_every_steps=0",
        *overrides,
        "--workdir=run",
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "dpnmt.train", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )


@needs_data
def test_a_group_lot_not_below_n_groups_is_refused_before_anything_is_written(
    tmp_path, local_model
):
    result = _train(tmp_path, local_model, "--config.dp.group_lot_size=42")
    assert result.returncode != 0
    assert "dp.group_lot_size=42 (groups per lot) must be in [1, N_groups=42)" in result.stderr
    assert not (tmp_path / "run").exists()


@needs_data
@pytest.mark.slow
def test_the_literal_clinspen_group_command_trains_and_reports_epsilon_per_group(
    tmp_path, local_model
):
    result = _train(tmp_path, local_model)
    assert result.returncode == 0, result.stderr[-3000:]
    workdir = tmp_path / "run"
    results = json.loads((workdir / "results.json").read_text())
    record = results["privacy"]
    unit = record["privacy_unit"]
    assert (unit["unit"], unit["num_groups"], unit["group_cap"]) == ("group", GROUPS, 8)
    assert unit["expected_groups_per_lot"] == record["expected_lot_size"] == 8
    assert unit["sampling_rate"] == 8 / GROUPS and record["dataset_size"] == GROUPS
    assert record["steps_done"] == unit["steps_planned"] == round(GROUPS / 8)
    assert unit["epsilon_per_group"] == pytest.approx(epsilon_from_unit_record(unit), rel=1e-6)
    assert unit["epsilon_per_group"] == pytest.approx(8.0, rel=1e-2)
    assert results["preprocessing"]["train"] == {"num_groups": GROUPS}
    config = json.loads((workdir / "config.json").read_text())
    assert (config["dp"]["unit"], config["dp"]["group_lot_size"]) == ("group", 8)
    assert "L=8 groups, N_groups=42, k=8" in result.stderr
    assert "train.expected_lot_size=128 (pairs) is not read" in result.stderr
