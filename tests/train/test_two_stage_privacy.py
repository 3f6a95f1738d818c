"""Two private stages through the apps: DP span-corruption pre-training on private
monolingual text, `dpnmt.export`, then DP fine-tuning of that export on private pairs.

The final results.json's total ε is recomputed here from the two stages' published
(σ, q, T, δ) with dp_accounting directly (not through dpnmt's accounting), and the
two units (one text, one pair) are stated in it and in the model cards.
"""

import json
import os
import subprocess
import sys

import dp_accounting
import pytest
from dp_accounting.pld import pld_privacy_accountant

from dpnmt import model_card
from dpnmt.config import RunConfig
from dpnmt.evaluation import decode as decode_lib
from dpnmt.sweeps import epsilon_check
from dpnmt.training import pieces, pretrained_privacy
from dpnmt.training.privacy_report import privacy_report
from tests.small_configs import files_config
from tests.train.test_objective_runs import mono_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def stage_config(tmp: str, stage: str):
    """Stage "pretrain" (span corruption on German texts) or "finetune" (de-en pairs)."""
    import pathlib  # noqa: PLC0415

    tmp = pathlib.Path(tmp)
    if stage == "pretrain":
        c = mono_config(tmp / "mono")
        c.train.checkpoint_every_steps = 100
    else:
        c = files_config(tmp / "pairs")
        c.model.name_or_path = str(tmp / "export")
        c.model.family = "t5"
        c.data.max_source_length = c.data.max_target_length = 16
        c.data.max_eval_examples = c.data.max_test_examples = 4
        c.train.num_epochs, c.train.eval_every_steps = 1, 0
        c.eval.max_new_tokens = 4
    c.noise_seed = None  # A secret seed: a real guarantee (a fixed one reports ε = ∞).
    c.testing_only_fixed_noise_seed_NO_PRIVACY = False
    return c


def _app(tmp_path, *args):
    env = dict(os.environ, PYTHONPATH=REPO)
    result = subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]


def _config_file(tmp_path, stage):
    path = tmp_path / f"{stage}.py"
    path.write_text(
        "from tests.train.test_two_stage_privacy import stage_config\n\n\n"
        f"def get_config(variant=None):\n    return stage_config({str(tmp_path)!r}, {stage!r})\n"
    )
    return f"--config={path}"


def _epsilon(stages, delta):
    """ε of Poisson-sampled Gaussian stages (σ, q, T) composed, dp_accounting's PLD."""
    accountant = pld_privacy_accountant.PLDAccountant()  # Discretisation 1e-4, pessimistic.
    for sigma, rate, steps in stages:
        accountant.compose(
            dp_accounting.SelfComposedDpEvent(
                dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma)),
                steps,
            )
        )
    return accountant.get_epsilon(delta)


def _stage(privacy):
    return privacy["noise_multiplier"], privacy["sampling_rate"], privacy["steps_planned"]


@pytest.mark.slow
def test_pretraining_then_fine_tuning_composes_both_stages(tmp_path):
    _app(tmp_path, "dpnmt.train", _config_file(tmp_path, "pretrain"), "--workdir=pre")
    _app(tmp_path, "dpnmt.export", "--workdir=pre", "--out=export")
    _app(tmp_path, "dpnmt.train", _config_file(tmp_path, "finetune"), "--workdir=fine")
    first = json.loads((tmp_path / "pre" / "results.json").read_text())["privacy"]
    final = json.loads((tmp_path / "fine" / "results.json").read_text())["privacy"]
    exported = json.loads((tmp_path / "export" / "dpnmt.json").read_text())["privacy"]

    # Stage units, stated plainly: one text, then one pair; the total covers one of each.
    assert first["example"].startswith("one text") and "span_corruption" in first["example"]
    assert exported == first and final["example"] == "one sentence pair"
    assert "one text" in final["composition"] and "one sentence pair" in final["composition"]
    assert "at most one example in each stage" in final["composition"]

    # Each stage's DP-SGD ε from its own (σ, q, T, δ); the vocabularies spent none.
    assert first["private"] and first["sampling"] == final["sampling"] == "poisson"
    assert first["vocabulary"]["epsilon"] is None and final["vocabulary"]["epsilon"] is None
    alone = [_epsilon([_stage(p)], p["dp_sgd_delta"]) for p in (first, final)]
    assert first["dp_sgd_epsilon"] == pytest.approx(alone[0], rel=1e-6)
    assert final["dp_sgd_epsilon"] == pytest.approx(alone[1], rel=1e-6)
    # The total: both DP-SGD runs as one event at δ1 + δ2, below the sum of the totals.
    pretrained = final["pretrained"]
    assert pretrained["composed"] and not pretrained["declared_disjoint"]
    assert pretrained["record"] == first
    delta = first["dp_sgd_delta"] + final["dp_sgd_delta"]
    joint = _epsilon([_stage(first), _stage(final)], delta)
    assert final["total_epsilon"] == pytest.approx(joint, rel=1e-6)
    assert final["total_delta"] == pytest.approx(delta, rel=1e-12)
    assert final["total_epsilon"] < first["total_epsilon"] + final["dp_sgd_epsilon"]
    # The ledger composes both stages' DP-SGD runs as one dp_accounting PLD event (issue 59).
    assert "one dp_accounting PLD event" in final["composition"]
    assert final["ledger"]["epsilon"] == pytest.approx(joint, rel=1e-6)
    assert epsilon_check.check_run(final).agrees  # The runs report's check agrees.

    # The model cards: the objective and its unit; the two stages and whom they cover.
    card = (tmp_path / "export" / "README.md").read_text()
    assert "objective: span_corruption" in card and "unit of privacy: one text" in card
    assert "training texts N" in card and "pre-trained model (span_corruption on de" in card
    run = decode_lib.load_run_config(str(tmp_path / "fine"))
    results = json.loads((tmp_path / "fine" / "results.json").read_text())
    card = model_card.render(run, final, results, steps_done=results["steps_done"])
    assert "**Two private stages.**" in card and "one text" in card

    # Declared disjoint (parallel composition): the larger of the two totals, and the
    # report says so.
    declared = stage_config(str(tmp_path), "finetune")
    declared.model.pretrained_data_disjoint = True
    claim = pretrained_privacy.pretrained_claim(RunConfig.of(declared))
    assert claim.declared_disjoint and not claim.composed and claim.record == first
    assert claim.parallel
    _, plan, _ = decode_lib.load_trained_params(str(tmp_path / "fine"))
    _, vocabulary = pieces.build_tokenizer(
        run, None, str(tmp_path / "fine"), noise_seed=None, learn=False
    )
    report = privacy_report(plan, plan.num_steps, vocabulary, pretrained=claim)
    both = (first["total_epsilon"], final["dp_sgd_epsilon"])
    assert report.total_epsilon == pytest.approx(max(both))
    assert report.composition.startswith("parallel composition over disjoint data")
    assert "joint_dp_sgd" not in report.to_json()
