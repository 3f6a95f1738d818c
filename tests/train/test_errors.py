"""Errors a user can hit before training starts say what to do."""

import pytest

from dpnmt import config_lib, experiment, inference


def test_unreachable_hub_model_says_to_use_a_local_path(tmp_path):
    config = config_lib.base_config()
    config.tokenizer.kind = "pretrained"
    config.model.name_or_path = "google/mt5-small"  # The hub is offline in tests.
    with pytest.raises(OSError, match="local directory"):
        experiment.build_tokenizer(config, None, str(tmp_path), noise_seed=None)


def test_decode_of_a_folder_without_a_run_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        inference.load_run_config(str(tmp_path))


def test_saved_vocabulary_is_required_when_not_learning(tmp_path):
    config = config_lib.base_config()  # dp_sentencepiece
    with pytest.raises(FileNotFoundError, match="not learnt again"):
        experiment.build_tokenizer(config, None, str(tmp_path), noise_seed=None, learn=False)
