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


def test_a_fixed_noise_seed_in_a_private_run_is_refused_before_anything_is_written(tmp_path):
    """Anyone holding a fixed seed rebuilds every noise draw: true ε = ∞, not the plan's."""
    from dpnmt import trainer

    config = config_lib.make_config("eps8")
    config.noise_seed = 12345
    workdir = tmp_path / "run"
    with pytest.raises(ValueError, match=r"config\.noise_seed .*testing_only_fixed_noise_seed"):
        trainer.train_and_evaluate(config, str(workdir))
    assert not workdir.exists()


def test_the_test_only_switch_needs_a_seed_and_a_nonprivate_run_may_fix_one():
    config = config_lib.make_config("eps8")
    config.testing_only_fixed_noise_seed_NO_PRIVACY = True
    with pytest.raises(ValueError, match="needs config.noise_seed"):
        config_lib.check_noise_seed(config)
    config.noise_seed = 3
    config_lib.check_noise_seed(config)  # Allowed: the run then reports ε = ∞.
    nonprivate = config_lib.make_config("nonprivate")
    nonprivate.noise_seed = 3
    config_lib.check_noise_seed(nonprivate)  # ε = ∞ anyway.
