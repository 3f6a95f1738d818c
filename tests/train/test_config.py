"""Config files and `:variant` strings resolve to the documented values."""

import copy
import inspect
import json
import pathlib
import re

import pytest

from dpnmt import config_lib
from dpnmt.config import RunConfig
from dpnmt.config import fields as config_fields_lib
from dpnmt.config import sections as config_sections
from dpnmt.errors import ConfigError
from dpnmt.training import preflight, run_dir
from tests.markers import needs_data
from tests.small_configs import config_module

CONFIG_DIR = pathlib.Path(__file__).resolve().parents[2] / "configs"


def _load(name):
    return config_module(name)


@pytest.mark.parametrize(
    "variant, enabled, target, sampling",
    [
        ("", True, 8.0, "poisson"),
        ("eps1", True, 1.0, "poisson"),
        ("eps3", True, 3.0, "poisson"),
        ("eps5", True, 5.0, "poisson"),
        ("eps8", True, 8.0, "poisson"),
        ("eps1000", True, 1000.0, "poisson"),
        ("eps5,shuffle", True, 5.0, "shuffle"),
        ("shuffle,eps1", True, 1.0, "shuffle"),
        ("eps1,poisson", True, 1.0, "poisson"),
        ("nonprivate", False, None, "shuffle"),
        ("nonprivate,poisson", False, None, "poisson"),
    ],
)
def test_variants_resolve_to_documented_values(variant, enabled, target, sampling):
    config = _load("tiny").get_config(variant)
    assert config.dp.enabled is enabled
    assert config.dp.target_epsilon == target
    assert config.dp.sampling == sampling
    assert config.variant == variant


@pytest.mark.parametrize("bad", ["eps2", "poison", "eps1,eps5", "shuffle,poisson"])
def test_unknown_or_conflicting_variants_fail_listing_valid_ones(bad):
    with pytest.raises(ValueError) as error:
        _load("tiny").get_config(bad)
    if "Unknown" in str(error.value):
        for name in ("eps1", "eps1000", "nonprivate", "shuffle", "poisson"):
            assert name in str(error.value)


@pytest.mark.parametrize("name", ["tiny", "wmt16", "bsd", "clinspen", "files"])
def test_every_config_file_builds(name):
    config = _load(name).get_config("eps5,shuffle")
    assert config.dp.target_epsilon == 5.0 and config.dp.sampling == "shuffle"
    assert config.train.physical_batch_size >= 1 and config.train.expected_lot_size >= 1


def test_paper_wmt16_setting():
    config = _load("wmt16").get_config("eps1")
    assert config.train.expected_lot_size == 524_288 and config.train.num_epochs == 7
    assert config.dp.delta == 1e-8


def test_every_base_field_is_commented():
    source = inspect.getsource(config_lib.base_config)
    assignments = [
        line for line in source.splitlines() if re.match(r"\s+c\.[\w.]+ = (?!ml_collections)", line)
    ]
    assert len(assignments) > 40
    uncommented = [line.strip() for line in assignments if "#" not in line]
    assert not uncommented


# `files` reads its public vocabulary text from $DPNMT_DATA_DIR (configs/multi30k.py's).
@pytest.mark.parametrize(
    "name",
    ["tiny", "tiny_clinspen", "wmt16", "bsd", "clinspen", pytest.param("files", marks=needs_data)],
)
@pytest.mark.parametrize("variant", ["eps5,shuffle", "nonprivate"])
def test_every_config_file_passes_validation(name, variant, monkeypatch):
    from dpnmt.models import hub, pretrained  # noqa: PLC0415

    # The hub is offline in tests: answer as it does for google/mt5-small (no dpnmt.json),
    # its files as if cached (`tests/train/test_model_files.py` checks them).
    monkeypatch.setattr(pretrained, "find_file", lambda name_or_path, filename: None)
    monkeypatch.setattr(hub, "availability_problem", lambda name, needs_tokenizer: None)
    problems = preflight.config_problems(
        RunConfig.of(_load(name).get_config(variant)), device_count=8
    )
    if name == "files":  # Its corpus folder is a placeholder the user sets.
        assert len(problems) == 1 and problems[0].startswith("data.corpus='files:data'")
    else:
        assert problems == []


def test_every_enum_field_is_a_base_field_with_a_valid_default():
    config = config_lib.base_config()
    fields = config_fields_lib.config_fields(config)
    enums = {
        f"{section.NAME}.{name}": allowed
        for section in config_sections.SECTIONS
        for name, allowed in section().choices().items()
    }
    assert len(enums) >= 12
    for field, allowed in enums.items():
        assert field in fields
        default = config_fields_lib.field_value(config, field)
        assert default is None or default in allowed, field


def test_vocabulary_fields_are_config_fields():
    fields = config_fields_lib.config_fields(config_lib.base_config())
    for prefix in run_dir.VOCABULARY_FIELDS:
        assert any(f == prefix or f.startswith(prefix) for f in fields), prefix


def test_a_field_newer_than_the_workdir_binds_only_off_its_default(tmp_path):
    """A run made before a field existed resumes while the field keeps its default."""
    from dpnmt import config_lib
    from dpnmt.training import run_dir

    config = config_lib.base_config()
    published = json.loads(config.to_json_best_effort())
    del published["model"]["finetune"]  # As written before the field existed.
    (tmp_path / run_dir.CONFIG_FILE).write_text(json.dumps(published))
    (tmp_path / run_dir.CHECKPOINT_DIR / "1").mkdir(parents=True)
    assert run_dir.binding_changes(str(tmp_path), RunConfig.of(config)) == []
    config.model.finetune = "bias"
    assert run_dir.binding_changes(str(tmp_path), RunConfig.of(config)) == ["model.finetune"]
    del published["train"]["learning_rate"]  # A field the workdir has and the code lost...
    published["train"]["no_longer_a_field"] = 1  # ...or one the code no longer knows.
    (tmp_path / run_dir.CONFIG_FILE).write_text(json.dumps(published))
    config.model.finetune = "all"
    assert run_dir.binding_changes(str(tmp_path), RunConfig.of(config)) == [
        "train.no_longer_a_field"
    ]


def test_noise_mode_is_an_enum_and_old_workdirs_stay_float(tmp_path):
    """dp.noise_mode (issue 26): checked by name; a run made before it existed was "float"."""
    config = config_lib.base_config()
    assert config.dp.noise_mode == "float"
    config.dp.noise_mode = "secure_mode"
    problems = preflight.config_problems(RunConfig.of(config), device_count=8)
    assert any(p.startswith("dp.noise_mode='secure_mode' is unknown") for p in problems)
    config.dp.noise_mode = "float"
    published = json.loads(config.to_json_best_effort())
    del published["dp"]["noise_mode"]  # As written before the field existed.
    (tmp_path / run_dir.CONFIG_FILE).write_text(json.dumps(published))
    (tmp_path / run_dir.CHECKPOINT_DIR / "1").mkdir(parents=True)
    assert run_dir.binding_changes(str(tmp_path), RunConfig.of(config)) == []
    config.dp.noise_mode = "secure"  # Resuming it with other noise would change the run.
    assert run_dir.binding_changes(str(tmp_path), RunConfig.of(config)) == ["dp.noise_mode"]


@pytest.mark.parametrize("name", sorted(p.stem for p in CONFIG_DIR.glob("*.py")))
def test_config_json_from_the_run_config_is_the_config_dicts(name):
    """config.json is written from the RunConfig (issue 28): the same content the ConfigDict
    wrote (`to_json_best_effort`, noise seed removed), so published runs and their binding
    stay as they were."""
    try:
        config = _load(name).get_config("eps5,shuffle")
    except ValueError:  # A public stage: non-private only.
        config = _load(name).get_config("nonprivate")
    config.noise_seed = 12345
    before = copy.deepcopy(config)
    with before.unlocked():
        before.noise_seed = None
    assert config_lib.published_config(RunConfig.of(config)) == json.loads(
        before.to_json_best_effort()
    )


def test_read_config_refuses_every_unknown_field_with_the_closest():
    """A config file's typo (ConfigDicts take new fields) is named at the edge, not ignored."""
    config = config_lib.base_config()
    config.dp.epsilon = 3.0
    config.train.lerning_rate = 1.0
    with pytest.raises(ConfigError) as error:
        preflight.read_config(config)
    text = str(error.value)
    assert "no field dp.epsilon; did you mean dp.target_epsilon?" in text
    assert "no field train.lerning_rate; did you mean train.learning_rate?" in text
    assert preflight.read_config(config_lib.base_config()) == RunConfig()


def test_a_typo_and_other_problems_come_in_one_message(tmp_path):
    """A misspelt field does not hide the config's other problems or the workdir's."""
    config = config_lib.base_config()
    config.train.lerning_rate = 1.0
    config.dp.delta = 2.0  # Not a probability.
    workdir = tmp_path / "a_file"
    workdir.write_text("")  # A file where the workdir should be.
    with pytest.raises(ConfigError) as error:
        preflight.read_config(config, str(workdir))
    text = str(error.value)
    assert "did you mean train.learning_rate?" in text
    assert "dp.delta" in text
    assert str(workdir) in text


def test_read_config_without_a_workdir_names_only_the_config_problems():
    config = config_lib.base_config()
    config.train.lerning_rate = 1.0
    with pytest.raises(ConfigError) as error:
        preflight.read_config(config)
    assert "did you mean train.learning_rate?" in str(error.value)
    assert "--workdir" not in str(error.value)


def test_a_fixed_noise_seed_in_a_private_run_is_a_config_problem():
    """So every static check (the audit's before its canaries are written) refuses it."""
    config = config_lib.base_config()
    config.dp.enabled = True
    config.noise_seed = 7
    problems = RunConfig.build(config)[0].problems()
    assert any("config.noise_seed is set for a private run" in p for p in problems)
    assert "7" not in " ".join(p for p in problems if "noise_seed" in p)
    config.testing_only_fixed_noise_seed_NO_PRIVACY = True
    assert not RunConfig.build(config)[0].noise_seed_problems()


def test_a_public_stage_is_non_private_by_default_and_refuses_dp():
    from dpnmt import config_lib

    config = config_lib.public_stage_config(None, lambda c: None, "my_stage")
    assert not config.dp.enabled and config.dp.sampling == "shuffle"
    with pytest.raises(ValueError, match="my_stage is a public stage"):
        config_lib.public_stage_config("eps8", lambda c: None, "my_stage")
