"""`train.eval_every_steps` unset: about ten validations a long run, few in a short one."""

import pytest

from dpnmt import config_lib


@pytest.mark.parametrize(
    ("every", "num_steps", "lot_size", "expected"),
    [
        (None, 566, 1024, 57),  # Multi30K eps8: 10 validations a run.
        (None, 2266, 128, 227),  # Multi30K non-private: 10.
        (None, 23, 128, 16),  # A 23-lot run: once (at most 1 per 2,000 examples).
        (None, 5, 4096, 1),
        (0, 566, 1024, 0),  # Only at the end.
        (100, 566, 1024, 100),  # An explicit interval is kept.
    ],
)
def test_eval_interval(every, num_steps, lot_size, expected):
    config = config_lib.base_config()
    config.data.max_eval_examples = 200
    config.train.expected_lot_size = lot_size
    config.train.eval_every_steps = every
    assert config_lib.eval_every_steps(config, num_steps) == expected


@pytest.mark.parametrize("lot_size", [16, 64, 1024])
@pytest.mark.parametrize("num_steps", [10, 99, 566, 2266, 10_001])
def test_the_default_bounds_validations_by_run_length_and_by_examples(num_steps, lot_size):
    config = config_lib.base_config()
    config.train.expected_lot_size = lot_size
    assert config.train.eval_every_steps is None
    every = config_lib.eval_every_steps(config, num_steps)
    validations = num_steps // every
    assert validations <= config_lib.EVALUATIONS_PER_RUN
    examples_per_validation = every * lot_size
    assert examples_per_validation >= 10 * config.data.max_eval_examples
