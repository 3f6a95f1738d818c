"""`dpnmt.api`: the pipeline from Python, with the apps' checks."""

import json

import pytest

from dpnmt import api
from dpnmt.errors import ConfigError, MissingInputError
from tests.markers import needs_data
from tests.small_configs import load_config, smaller_config


def test_load_config_reads_a_file_and_its_variant_as_the_config_flag_does():
    config = api.load_config("configs/tiny.py:eps8", train__num_epochs=3)
    expected = load_config("tiny", "eps8")
    expected.train.num_epochs = 3
    assert config.to_dict() == expected.to_dict()
    with pytest.raises(MissingInputError, match="no such config file configs/tinyy.py"):
        api.load_config("configs/tinyy.py:eps8")


def test_translate_uses_an_export_and_checks_its_decoding_settings(tmp_path):
    from tests.tiny_export import write_tiny_export

    folder = str(write_tiny_export(tmp_path))
    out = api.translate(["ein kleiner Satz 3 hier", ""], model=folder, max_new_tokens=3)
    assert len(out) == 2 and out[1] == "" and isinstance(out[0], str)
    with pytest.raises(ConfigError, match="num_beams=0 must be >= 1"):
        api.translate(["ein Satz"], model=folder, num_beams=0)
    with pytest.raises(MissingInputError, match="no such folder"):
        api.translate(["ein Satz"], workdir=str(tmp_path / "nope"))


def test_plan_is_the_planner():
    plan = api.plan(1000, expected_lot_size=100, num_epochs=2, noise_multiplier=1.5)
    assert plan.num_steps == 20 and plan.sampling_rate == 0.1


@needs_data
def test_train_runs_once_and_a_finished_run_is_returned_as_it_is(tmp_path):
    workdir = tmp_path / "run"
    config = smaller_config("nonprivate")
    config.tokenizer.vocab_size = 600  # The DP vocabulary's characters need more than 300.
    results = api.train(config, str(workdir))
    assert results["finished"] and (workdir / "results.json").is_file()
    written = (workdir / "results.json").stat().st_mtime_ns
    again = api.train(config, str(workdir))
    assert again == json.loads((workdir / "results.json").read_text())
    assert (workdir / "results.json").stat().st_mtime_ns == written  # Not rewritten.
