"""configs/span_then_translate.py's plan without training (issue 32, item 4's BLEU half).

Multi30K's train split is cut into disjoint halves by the make script; each
stage is DP at ε = 8 (σ, q, T recomputed here with dp_accounting directly),
and the fine-tuning after span corruption declares the pre-training data
disjoint: the composed total is ε = 8 (parallel composition), accepted by the
stage-composition checks for half B and refused for half A.
"""

import json
import os
import pathlib

import dp_accounting
import pytest
from dp_accounting.pld import pld_privacy_accountant

from dpnmt import privacy
from dpnmt.config import RunConfig
from dpnmt.data import corpus_record, objectives, overlap, text_objective, tokenizers
from dpnmt.errors import ConfigError
from dpnmt.training import pieces, preflight, pretrained_privacy
from dpnmt.training.privacy_report import privacy_report
from tests.markers import needs_data
from tests.small_configs import config_module, load_config
from tests.train.test_added_sentinels import write_model_without_sentinels

ROOT = pathlib.Path(__file__).resolve().parents[2]
MAKE_FILES = ROOT / "docs" / "results" / "span_then_translate" / "make_files.py"


def _make_files():
    return config_module(MAKE_FILES)  # Any .py file, freshly executed.


def _epsilon(sigma, rate, steps, delta):
    """ε of one Poisson-sampled Gaussian DP-SGD run, dp_accounting's PLD (not dpnmt's)."""
    accountant = pld_privacy_accountant.PLDAccountant()
    event = dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma))
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    return accountant.get_epsilon(delta)


def test_the_stages_differ_only_where_they_should():
    a, span, b = (load_config("span_then_translate", v) for v in ("", "span", "span_translate"))
    assert (a.data.corpus, b.data.corpus, span.data.corpus) == (
        "files:multi30k_half_a",
        "files:multi30k_half_a",
        "files:multi30k_half_b",
    )
    assert span.data.objective == "span_corruption" and span.data.objective_language == "de"
    assert span.tokenizer.sentinels == 16 and span.model.name_or_path == a.model.name_or_path
    data = RunConfig.of(span).data
    needed = objectives.span_count(
        data.max_source_length - 1,
        noise_density=data.noise_density,
        mean_span_length=data.mean_span_length,
    )
    assert 1 <= needed <= span.tokenizer.sentinels
    assert b.model.name_or_path == "runs/exported/span_then_translate_span"
    assert all(c.model.pretrained_data_disjoint and c.dp.target_epsilon == 8 for c in (a, span, b))
    a_json, b_json = (json.loads(c.to_json_best_effort()) for c in (a, b))
    for section in ("train", "dp", "eval", "data"):  # (a) and (b) differ in the start alone.
        assert a_json[section] == b_json[section], section
    prefix = load_config("span_then_translate", "prefix,eps8")
    assert prefix.data.objective == "prefix_lm" and prefix.tokenizer.sentinels == 0
    with pytest.raises(ValueError, match="Two stage variants"):
        load_config("span_then_translate", "span,translate")
    with pytest.raises(ValueError, match="lora with a pre-training stage"):
        load_config("span_then_translate", "span,lora")


@pytest.mark.slow  # ~30 s: two σ calibrations and their PLD recomputation.
@needs_data
def test_the_halves_are_disjoint_and_each_stage_plans_eps8_composing_to_eps8(tmp_path, monkeypatch):
    source = os.path.join(os.environ["DPNMT_DATA_DIR"], "multi30k")
    size_a, size_b = _make_files().make(source, str(tmp_path))
    assert size_a + size_b == 29000 and abs(size_a - size_b) < 100
    monkeypatch.setenv("DPNMT_DATA_DIR", str(tmp_path))  # files:multi30k_half_* resolve here.
    runs = {v: RunConfig.of(load_config("span_then_translate", v)) for v in ("", "span")}
    runs["b"] = RunConfig.of(load_config("span_then_translate", "span_translate"))
    corpora = {k: pieces.load_corpus(run.data) for k, run in runs.items()}
    a_text, b_text = (
        {overlap.normalised(t) for row in corpora[k]["train"]["translation"] for t in row.values()}
        for k in ("", "span")
    )
    assert len(b_text) > 14000 and not a_text & b_text  # No caption of A in B's German text.
    # (b)'s fine-tuning plans as (a)'s: the same N, L, epochs and dp section (one calibration).
    assert len(corpora["b"]["train"]) == len(corpora[""]["train"])
    assert (runs["b"].dp, runs["b"].train) == (runs[""].dp, runs[""].train)
    plans = {}
    for key, run in ((k, runs[k]) for k in ("", "span")):
        plan = privacy.plan_privacy(run.dp, run.train, len(corpora[key]["train"]))
        assert plan.sampling == "poisson" and plan.delta == 1e-8
        assert (
            plan.expected_lot_size == 1024
            and abs(plan.num_steps - 20 * plan.dataset_size / 1024) < 1
        )
        assert plan.sampling_rate == 1024 / plan.dataset_size
        recomputed = _epsilon(plan.noise_multiplier, plan.sampling_rate, plan.num_steps, 1e-8)
        assert recomputed == pytest.approx(8.0, abs=0.02), key
        plans[key] = plan
    plans["b"] = plans[""]
    # Stage 1's export as dpnmt.export writes its record (no weights: only the claim is read).
    span = runs["span"]
    vocabulary = tokenizers.VocabularyRecord("pretrained", True)
    record = privacy_report(
        plans["span"],
        plans["span"].num_steps,
        vocabulary,
        example=text_objective.example_unit(span.data),
    ).to_json()
    export = tmp_path / "span_export"
    export.mkdir()
    settings = {"privacy": record, corpus_record.KEY: corpus_record.training_corpora(span)}
    (export / "dpnmt.json").write_text(json.dumps(settings))
    config = load_config("span_then_translate", "span_translate")
    config.model.name_or_path = str(export)
    fine = RunConfig.of(config)
    claim = pretrained_privacy.pretrained_claim(fine)
    assert claim.dpnmt_export and claim.declared_disjoint and not claim.composed
    assert pretrained_privacy.declared_text_problems(fine, corpora["b"]) == []
    total = privacy_report(
        plans["b"], plans["b"].num_steps, vocabulary, pretrained=claim, example="one pair"
    ).to_json()
    assert total["total_epsilon"] == pytest.approx(8.0, abs=0.02)  # Parallel composition:
    assert claim.parallel and total["composition"].startswith("parallel composition over")
    ours = plans["b"].epsilon_after(plans["b"].num_steps)
    assert total["total_epsilon"] == max(ours, record["total_epsilon"])  # the larger ε.
    assert claim.record["dp_sgd_epsilon"] == pytest.approx(8.0, abs=0.02)  # Kept, not added.
    # Declaring an export of half A disjoint from half A is refused before training.
    settings[corpus_record.KEY] = [{"corpus": "files:multi30k_half_a"}]
    (export / "dpnmt.json").write_text(json.dumps(settings))
    (problem,) = pretrained_privacy.pretrained_problems(fine)  # preflight asks it.
    assert "not disjoint" in problem


@needs_data
def test_the_span_stage_passes_the_static_checks_from_a_model_without_sentinels(
    tmp_path, monkeypatch
):
    """The public model's layout (a dpnmt export, no sentinels) in small: the stage's
    objective, lengths, buckets and appended sentinels pass; without them it is refused."""
    _make_files().make(os.path.join(os.environ["DPNMT_DATA_DIR"], "multi30k"), str(tmp_path))
    monkeypatch.setenv("DPNMT_DATA_DIR", str(tmp_path))
    config = load_config("span_then_translate", "span")
    (tmp_path / "public").mkdir()
    config.model.name_or_path = str(write_model_without_sentinels(tmp_path / "public"))
    preflight.check_static(RunConfig.of(config), str(tmp_path / "run"))
    config.tokenizer.sentinels = 0
    with pytest.raises(ConfigError, match=r"tokenizer.sentinels >= 2 \(<extra_id_i> pieces app"):
        preflight.check_static(RunConfig.of(config), str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()
