"""`data.tokenize_train`: per-lot tokenization gives the up-front examples (real corpus)."""

import numpy as np
import pytest

from dpnmt.config import RunConfig
from dpnmt.training import pieces, run_dir, setup
from tests.markers import needs_data
from tests.small_configs import small_config


@needs_data
def test_per_lot_examples_equal_upfront_examples_on_the_wmt_sample(tmp_path):
    config = small_config("eps8")
    config.data.max_train_examples = 300
    config.data.max_source_length = config.data.max_target_length = 12  # Some rows truncated.
    corpus = pieces.load_corpus(RunConfig.of(config).data)
    tokenizer, _ = pieces.build_tokenizer(RunConfig.of(config), corpus, str(tmp_path), noise_seed=3)

    config.data.tokenize_train = "upfront"
    tokenized, upfront, upfront_stats = setup.tokenize_splits(
        RunConfig.of(config), corpus, tokenizer
    )
    config.data.tokenize_train = "per_lot"
    evaluation, per_lot, per_lot_stats = setup.tokenize_splits(
        RunConfig.of(config), corpus, tokenizer
    )

    assert len(per_lot) == len(upfront) == upfront_stats["train"].num_kept > 0
    rows = np.arange(len(upfront))
    want, got = upfront.__getitems__(rows), per_lot.__getitems__(rows)
    for name, values in want.fields.items():
        np.testing.assert_array_equal(got.fields[name], values, err_msg=name)
    assert per_lot.pad_values == upfront.pad_values
    # Only the truncation counts differ: not counted per lot (there were some).
    train, counted = per_lot_stats["train"], upfront_stats["train"]
    assert counted.num_source_truncated > 0
    assert (train.num_source_truncated, train.num_target_truncated) == (None, None)
    assert train.num_kept == counted.num_kept and train.num_dropped == counted.num_dropped
    # Evaluation splits are tokenized up front either way, train is not among them.
    assert set(evaluation) == set(tokenized) - {"train"}
    for split in evaluation:
        assert per_lot_stats[split] == upfront_stats[split]
        assert evaluation[split]["input_ids"] == tokenized[split]["input_ids"]


def test_auto_tokenizes_per_lot_only_on_several_processes():
    config = small_config("eps8")
    assert config.data.tokenize_train == "auto"
    assert not pieces.tokenizes_train_per_lot(RunConfig.of(config).data)  # One process here.
    config.data.tokenize_train = "per_lot"
    assert pieces.tokenizes_train_per_lot(RunConfig.of(config).data)
    config.data.tokenize_train = "lazy"
    with pytest.raises(ValueError, match="data.tokenize_train='lazy' is unknown"):
        pieces.tokenizes_train_per_lot(RunConfig.of(config).data)


def test_tokenize_train_does_not_bind_a_workdir(tmp_path):
    """A run may resume in another mode (e.g. on fewer processes); other changes are refused."""
    import json

    config = small_config("eps8")
    run_dir.RunDir(str(tmp_path)).bind_config(RunConfig.of(config))
    (tmp_path / run_dir.TOKENIZER_FILE).write_text("")  # A learnt vocabulary binds it.
    config.data.tokenize_train = "per_lot"
    run_dir.RunDir(str(tmp_path)).bind_config(RunConfig.of(config))
    record = json.loads((tmp_path / run_dir.CONFIG_FILE).read_text())
    assert record["data"]["tokenize_train"] == "per_lot"  # The latest session's mode.
    del record["data"]["tokenize_train"]  # A workdir from before the field existed.
    (tmp_path / run_dir.CONFIG_FILE).write_text(json.dumps(record))
    run_dir.RunDir(str(tmp_path)).bind_config(RunConfig.of(config))
    config.tokenizer.vocab_size *= 2  # The vocabulary depends on it.
    with pytest.raises(ValueError, match=r"fields differ: tokenizer.vocab_size: run "):
        run_dir.RunDir(str(tmp_path)).bind_config(RunConfig.of(config))
