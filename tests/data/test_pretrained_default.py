"""A pretrained model on disk brings its own tokenizer by default; a new vocabulary is refused."""

import shutil

import pytest

from dpnmt import config_lib
from dpnmt.config import RunConfig
from dpnmt.data import tokenizers
from dpnmt.training import pieces


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A local `save_pretrained` folder's tokenizer (the model files are not read here)."""
    import transformers

    path = tmp_path_factory.mktemp("t5")
    text = path / "text.txt"
    text.write_text("\n".join(f"ein satz {i} mit worten" for i in range(200)), encoding="utf-8")
    tokenizer, _ = tokenizers.train_sentencepiece([str(text)], vocab_size=300)
    tokenizer.save(str(path / "spiece.model"))
    transformers.T5Tokenizer.from_pretrained(str(path), extra_ids=0).save_pretrained(str(path))
    return str(path)


def test_name_or_path_alone_uses_the_models_tokenizer(model_dir, tmp_path):
    config = config_lib.base_config()  # tokenizer.kind left at its default
    config.model.name_or_path = model_dir
    tokenizer, record = pieces.build_tokenizer(
        RunConfig.of(config), None, str(tmp_path), noise_seed=None
    )
    assert isinstance(tokenizer, tokenizers.HFTokenizer) and record.kind == "pretrained"
    assert not list(tmp_path.iterdir())  # No vocabulary learnt or saved.


def test_from_scratch_default_is_still_dp_sentencepiece():
    assert config_lib.tokenizer_kind(config_lib.base_config()) == "dp_sentencepiece"


@pytest.mark.parametrize("kind", ["dp_sentencepiece", "sentencepiece_public"])
def test_a_new_vocabulary_for_a_pretrained_model_is_refused(model_dir, tmp_path, kind):
    config = config_lib.base_config()
    config.model.name_or_path = model_dir
    config.tokenizer.kind = kind
    with pytest.raises(ValueError, match="embedding rows belong to its own vocabulary"):
        pieces.build_tokenizer(RunConfig.of(config), None, str(tmp_path), noise_seed=None)
    assert not list(tmp_path.iterdir())


def test_the_up_front_check_refuses_a_new_vocabulary_for_a_pretrained_model(model_dir, tmp_path):
    from dpnmt.training import preflight

    model = tmp_path / "model"  # A whole model folder (its files are not read here).
    shutil.copytree(model_dir, model)
    (model / "config.json").write_text('{"model_type": "t5"}')
    (model / "model.safetensors").write_bytes(b"")
    config = config_lib.base_config()
    config.model.name_or_path = str(model)
    config.tokenizer.kind = "dp_sentencepiece"
    problems = preflight.config_problems(RunConfig.of(config), device_count=1)
    assert any("embedding rows belong to its own vocabulary" in p for p in problems), problems
    config.tokenizer.kind = "auto"
    config.dp.target_epsilon = 8.0
    assert not preflight.config_problems(RunConfig.of(config), device_count=1)
