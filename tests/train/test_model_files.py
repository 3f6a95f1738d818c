"""A pretrained model's files are looked for before anything is written (`models.hub`)."""

import os
import subprocess
import sys

import pytest

from dpnmt import cli
from dpnmt.models import hub
from tests.small_configs import files_corpus

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HUB_ID = "someone/no-such-model"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def test_an_unavailable_hub_model_is_refused_in_one_line_before_the_workdir_is_written(tmp_path):
    """The preflight passed, then loading the model failed after config.json, checkpoints/
    and private/ (the noise seed) were written."""
    workdir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=REPO, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    command = [
        sys.executable,
        "-m",
        "dpnmt.train",
        "--config=configs/files.py:eps8",
        f"--config.data.corpus=files:{files_corpus(tmp_path / 'corpus')}",
        "--config.tokenizer.kind=pretrained",
        f"--config.model.name_or_path={HUB_ID}",
        "--config.model.pretrained_data_disjoint=True",  # Else its dpnmt.json refuses it.
        "--config.train.expected_lot_size=16",
        f"--workdir={workdir}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert not workdir.exists() or not os.listdir(workdir), os.listdir(workdir)
    assert result.returncode == cli.USAGE_EXIT_CODE, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("dpnmt.train:")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert f"model.name_or_path={HUB_ID!r}" in errors[0] and "HF_HUB_OFFLINE=1" in errors[0]
    assert "local folder" in errors[0] and "Traceback" not in result.stderr


def _cache(tmp_path, monkeypatch, names):
    """A Hugging Face cache holding `HUB_ID`'s `names` (tests/conftest.py: hub offline)."""
    from huggingface_hub import constants  # noqa: PLC0415

    snapshot = tmp_path / "hf_cache" / f"models--{HUB_ID.replace('/', '--')}"
    (snapshot / "refs").mkdir(parents=True)
    (snapshot / "refs" / "main").write_text(COMMIT)
    (snapshot / "snapshots" / COMMIT).mkdir(parents=True)
    for name in names:
        (snapshot / "snapshots" / COMMIT / name).write_text("{}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf_cache"))


def test_offline_a_hub_model_needs_its_files_in_the_cache(tmp_path, monkeypatch):
    _cache(tmp_path, monkeypatch, ["config.json", "model.safetensors"])
    assert hub.availability_problem(HUB_ID, needs_tokenizer=False) is None
    problem = hub.availability_problem(HUB_ID, needs_tokenizer=True)
    assert problem.startswith(f"model.name_or_path={HUB_ID!r} is no local folder, HF_HUB_OFFLINE")
    assert "lacks its tokenizer files" in problem and "weights" not in problem


def test_an_unreachable_hub_is_asked_once_then_the_cache(tmp_path, monkeypatch):
    """Not offline, no network: one short request, not the hub client's retries (~25 s)."""
    import httpx2  # noqa: PLC0415
    import huggingface_hub  # noqa: PLC0415
    from huggingface_hub import constants  # noqa: PLC0415

    asked = []

    def unreachable(url, **kwargs):
        asked.append(url)
        raise httpx2.ConnectError("Name or service not known")

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", unreachable)
    _cache(tmp_path, monkeypatch, [])
    problem = hub.availability_problem(HUB_ID, needs_tokenizer=True)
    assert "the Hugging Face hub could not be reached (ConnectError" in problem
    assert "lacks its config.json, weights" in problem and len(asked) == 1
    _cache(tmp_path / "full", monkeypatch, ["config.json", "model.safetensors", "spiece.model"])
    assert hub.availability_problem(HUB_ID, needs_tokenizer=True) is None  # The cached copy.


@pytest.mark.parametrize(
    ("files", "missing"),
    [
        ((), "config.json, weights"),
        (("config.json", "spiece.model"), "weights (model.safetensors or pytorch_model.bin)"),
        (("config.json", "model.safetensors.index.json"), "tokenizer files"),
        (("config.json", "pytorch_model.bin", "tokenizer.json"), None),
    ],
)
def test_a_local_folder_needs_a_config_weights_and_a_tokenizer(tmp_path, files, missing):
    for name in files:
        (tmp_path / name).write_text("{}")
    problem = hub.availability_problem(str(tmp_path), needs_tokenizer=True)
    if missing is None:
        assert problem is None
    else:
        assert problem.startswith(f"model.name_or_path={str(tmp_path)!r}: the folder lacks")
        assert missing in problem


def test_a_sweep_and_a_zero_shot_decode_refuse_an_unavailable_model_before_writing(tmp_path):
    from dpnmt.errors import ConfigError  # noqa: PLC0415
    from dpnmt.evaluation import decode  # noqa: PLC0415
    from dpnmt.sweeps import grid, runner  # noqa: PLC0415

    overrides = [
        f"--config.data.corpus=files:{files_corpus(tmp_path / 'corpus')}",
        "--config.tokenizer.kind=pretrained",
        f"--config.model.name_or_path={HUB_ID}",
    ]
    specs = grid.expand(["nonprivate"], ["shuffle"], 1)
    sweep = tmp_path / "sweep"
    with pytest.raises(ConfigError, match=rf"model.name_or_path='{HUB_ID}' is no local folder"):
        runner.run_sweep(os.path.join(REPO, "configs", "files.py"), str(sweep), specs, overrides)
    assert not sweep.exists()
    run = grid.resolve_config(os.path.join(REPO, "configs", "files.py"), specs[0], overrides)
    with pytest.raises(ConfigError, match=rf"model.name_or_path='{HUB_ID}' is no local folder"):
        decode.decode_and_score(run, str(tmp_path / "zero_shot"), zero_shot=True)
    assert not (tmp_path / "zero_shot").exists()
