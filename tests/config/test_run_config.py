"""`dpnmt.config`: typed sections parsed from the ConfigDict, every problem at once."""

import glob
import json
import pathlib

import pytest

from dpnmt import config_lib, core, privacy
from dpnmt.config import RunConfig, config_fields, sections
from dpnmt.data import preprocess
from dpnmt.errors import ConfigError

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_defaults_are_the_base_config_and_round_trip():
    run, unknown = RunConfig.build(config_lib.base_config())
    assert unknown == [] and run == RunConfig()
    assert RunConfig.fields() == config_fields(config_lib.base_config())
    assert run.to_dict() == config_lib.base_config().to_dict()


def test_literal_choices_are_the_owners_values():
    assert set(sections.ModelConfig().choices()["family"]) == set(preprocess.FAMILIES)
    dp = sections.PrivacyConfig().choices()
    assert set(dp["accountant"]) == {a.value for a in core.accounting.Accountant}
    assert set(dp["clipping"]) == set(core.private_grad.CLIPPING_METHODS)
    assert set(dp["noise_mode"]) == set(core.noise.NOISE_MODES)
    assert set(dp["sampling"]) == {privacy.POISSON, privacy.SHUFFLE}
    assert set(dp["unit"]) == set(privacy.UNITS)


def test_parse_raises_every_problem_at_once_with_the_closest_field():
    config = config_lib.base_config().to_dict()
    config["dp"]["epsilon"] = 1.0  # A typo of dp.target_epsilon.
    config["train"]["optimizer"] = "adm"
    config["dp"]["delta"] = 2.0
    with pytest.raises(ConfigError) as error:
        RunConfig.parse(config)
    lines = str(error.value).splitlines()
    assert lines[0] == "4 problems:"
    text = str(error.value)
    assert "no field dp.epsilon; did you mean dp.target_epsilon?" in text
    assert "train.optimizer='adm' is unknown (did you mean 'adam'?)" in text
    assert "dp.delta=2.0 must be in (0, 1)" in text
    assert "needs dp.target_epsilon" in text  # Neither ε nor σ given.


def test_a_valid_config_parses_to_frozen_sections_with_resolved_values():
    config = config_lib.make_config("eps5")
    config.model.lora_targets = "q, v, q"
    run = RunConfig.parse(config)
    assert run.dp.target_epsilon == 5.0 and run.privacy is run.dp
    assert run.tokenizer_kind == "dp_sentencepiece"
    assert run.model.lora_target_names == ("q", "v")
    assert run.data.corpus_options() == {}
    with pytest.raises(AttributeError):
        run.train.learning_rate = 1.0  # Frozen.


@pytest.mark.parametrize(
    "path",
    sorted(glob.glob(str(ROOT / "docs/results/*/config.json"))),
)
def test_old_runs_config_json_still_parse(path):
    with open(path) as f:
        recorded = json.load(f)
    run = RunConfig.parse(recorded)  # Fields newer than the run take their defaults.
    assert run.dp.noise_mode == "float"
    assert run.data.corpus == recorded["data"]["corpus"]
