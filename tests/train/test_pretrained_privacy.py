"""A dpnmt export given back as `model.name_or_path`: its own ε composes, or the run refuses.

The export folders here are made without training (a tiny T5 and a public
SentencePiece vocabulary saved as `dpnmt.export` saves them) with the
privacy record a run would have published in its `dpnmt.json`.
"""

import json
import math
import shutil

import jax
import pytest

from dpnmt import config_lib
from dpnmt.data import hf_tokenizer, tokenizers
from dpnmt.errors import ConfigError
from dpnmt.models import export
from dpnmt.training import loop, pieces, setup
from dpnmt.training.privacy_report import PrivacyReport, privacy_report
from tests.train.test_errors import _corpus

EXPORT_EPSILON, EXPORT_DELTA = 3.0, 2e-9


def _record(private=True, epsilon=EXPORT_EPSILON):
    """The "privacy" object of an exported run's dpnmt.json (inf stored as "inf")."""
    return {
        "private": private,
        "dp_sgd_epsilon": epsilon - 0.5 if private else "inf",
        "dp_sgd_delta": 1e-9,
        "vocabulary": {"kind": "dp_sentencepiece", "covered_by_guarantee": True},
        "total_epsilon": epsilon if private else "inf",
        "total_delta": EXPORT_DELTA,
        "composition": "basic composition (ε and δ add) of DP-SGD and the vocabulary",
    }


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    """A tiny T5 and its SentencePiece vocabulary as transformers folders (no dpnmt.json)."""
    folder = tmp_path_factory.mktemp("export")
    text = folder / "public.txt"
    text.write_text("".join(f"ein kleiner Satz {i} hier, a small sentence\n" for i in range(200)))
    tokenizer, _ = tokenizers.train_sentencepiece([str(text)], vocab_size=320)
    text.unlink()
    config = config_lib.make_config("nonprivate")
    config.model.update(d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1)
    config.model.num_heads = 2
    _, model_config, params = pieces.build_model(config, tokenizer, jax.random.key(0))
    export.save_pretrained(params, model_config, str(folder))
    hf_tokenizer.save_tokenizer(tokenizer, str(folder))
    return folder


def _export(model_folder, tmp_path, record):
    """A copy of `model_folder` with a dpnmt.json holding `record` (None: no record)."""
    folder = tmp_path / "exported"
    shutil.copytree(model_folder, folder)
    settings = {"pair": "de-en", "family": "none", "source_prefix": ""}
    if record is not None:
        settings["privacy"] = record
    (folder / "dpnmt.json").write_text(json.dumps(settings))
    return str(folder)


def _config(tmp_path, name_or_path, variant="eps8"):
    def customize(c):
        c.data.corpus = f"files:{_corpus(tmp_path / 'corpus')}"
        c.data.pair = "de-en"
        c.model.name_or_path = name_or_path
        c.model.family = "none"
        c.data.max_source_length = c.data.max_target_length = 16
        c.train.expected_lot_size = 16
        c.train.physical_batch_size = 8
        c.dp.noise_multiplier = 1.0  # Given σ: no calibration (fast).

    return config_lib.make_config(variant, customize)


class _Stop(Exception):
    pass


def _stop_before_tokenizing(monkeypatch):
    def stop(*args, **kwargs):
        raise _Stop

    monkeypatch.setattr(setup, "tokenize_splits", stop)


def test_a_private_export_is_composed_into_the_run_total(model_folder, tmp_path):
    config = _config(tmp_path, _export(model_folder, tmp_path, _record()))
    run = setup.build_run(config, str(tmp_path / "run"))
    assert run.pretrained.dpnmt_export and run.pretrained.composed
    assert not run.pretrained.declared_disjoint
    # Its vocabulary is the export's: not "no private data used", and not counted twice.
    assert "no private data" not in run.vocabulary.note and "export" in run.vocabulary.note
    assert run.vocabulary.epsilon is None
    report = privacy_report(run.plan, run.plan.num_steps, run.vocabulary, pretrained=run.pretrained)
    assert report.total_epsilon == pytest.approx(report.dp_sgd_epsilon + EXPORT_EPSILON)
    assert report.total_delta == pytest.approx(run.plan.delta + EXPORT_DELTA)
    assert "pretrained export" in report.composition
    published = report.to_json()
    assert published["pretrained"]["record"] == _record()
    assert PrivacyReport.from_json(json.loads(json.dumps(published))) == report


@pytest.mark.parametrize(
    "record, why",
    [
        (_record(private=False), "trained without DP"),
        (_record(epsilon=math.inf), "total ε is ∞"),
        (None, "without a privacy record"),
    ],
)
def test_an_export_without_a_finite_guarantee_is_refused_before_anything_is_written(
    model_folder, tmp_path, monkeypatch, record, why
):
    _stop_before_tokenizing(monkeypatch)
    config = _config(tmp_path, _export(model_folder, tmp_path, record))
    workdir = tmp_path / "run"
    with pytest.raises(ConfigError) as error:
        loop.train_and_evaluate(config, str(workdir))
    message = str(error.value)
    assert message.startswith("model.name_or_path=") and why in message
    assert "model.pretrained_data_disjoint=True" in message
    assert not workdir.exists()


def test_data_declared_disjoint_are_not_composed_and_the_report_says_so(model_folder, tmp_path):
    record = _record(private=False)  # A public stage: non-private on public text.
    config = _config(tmp_path, _export(model_folder, tmp_path, record))
    config.model.pretrained_data_disjoint = True
    run = setup.build_run(config, str(tmp_path / "run"))
    report = privacy_report(run.plan, run.plan.num_steps, run.vocabulary, pretrained=run.pretrained)
    assert report.total_epsilon == report.dp_sgd_epsilon and math.isfinite(report.total_epsilon)
    claim = report.to_json()["pretrained"]
    assert claim["declared_disjoint"] and not claim["composed"]
    assert "declared disjoint" in claim["note"] and claim["record"] == record


def test_a_model_that_is_not_a_dpnmt_export_carries_no_record(model_folder, tmp_path):
    from dpnmt.training import pretrained_privacy  # noqa: PLC0415 - the module under test.

    config = _config(tmp_path, str(model_folder))
    claim = pretrained_privacy.pretrained_claim(config)
    assert not claim.dpnmt_export and not claim.composed and claim.record is None
    assert "outside this report" in claim.note
    config.model.name_or_path = None
    config.model.pretrained_data_disjoint = True  # Declares nothing: refused, not ignored.
    (problem,) = pretrained_privacy.pretrained_problems(config)
    assert problem.startswith("model.pretrained_data_disjoint=True")
