"""`train.eval_every_steps`: unset means about ten validations a run, whatever its length."""

import pytest

from dpnmt import config_lib


@pytest.mark.parametrize(
    ("every", "num_steps", "expected"),
    [
        (None, 566, 57),  # Multi30K eps8: 10 validations.
        (None, 2266, 227),  # Multi30K non-private.
        (None, 23, 3),  # A short run still validates ~8 times, not never.
        (None, 5, 1),
        (0, 566, 0),  # Only at the end.
        (100, 566, 100),  # An explicit interval is kept.
    ],
)
def test_eval_interval(every, num_steps, expected):
    config = config_lib.base_config()
    config.train.eval_every_steps = every
    assert config_lib.eval_every_steps(config, num_steps) == expected


def test_the_default_validates_about_ten_times_a_run():
    config = config_lib.base_config()
    assert config.train.eval_every_steps is None
    for num_steps in (10, 99, 566, 2266, 10_001):
        every = config_lib.eval_every_steps(config, num_steps)
        assert config_lib.EVALUATIONS_PER_RUN - 1 <= num_steps // every <= 10
