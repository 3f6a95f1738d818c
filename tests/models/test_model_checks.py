"""`dpnmt.models.checks`: the one reader of a local model folder's config.json."""

import json

from dpnmt.config import ModelConfig
from dpnmt.models import checks


def test_local_hf_config_reads_an_object_and_nothing_else(tmp_path, monkeypatch):
    good = tmp_path / "good"
    good.mkdir()
    (good / "config.json").write_text(json.dumps({"model_type": "mt5", "vocab_size": 7}))
    assert checks.local_hf_config(str(good)) == {"model_type": "mt5", "vocab_size": 7}
    monkeypatch.setenv("HOME", str(tmp_path))
    assert checks.local_hf_config("~/good") == {"model_type": "mt5", "vocab_size": 7}
    for name, text in (("list", "[1, 2]"), ("broken", "{not json")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(text)
        assert checks.local_hf_config(str(tmp_path / name)) is None
    assert checks.local_hf_config(str(tmp_path / "missing")) is None
    assert checks.local_hf_config("google/t5-small") is None  # A hub id: not looked up.


def test_architecture_reads_the_same_file(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "mt5", "feed_forward_proj": "gated-gelu"})
    )
    model = ModelConfig(name_or_path=str(tmp_path))
    assert checks.architecture(model) == ("mt5", True)
    (tmp_path / "config.json").write_text("[]")
    assert checks.architecture(model) is None
