"""A resumed run keeps the σ it started with (`checkpointing.resumed_plan`).

Newer code can calibrate a slightly different σ for the same target ε (the
search changed in 7c3284c): a run resumed on it refused to continue (the plan
differed from the checkpoint's), and had it continued, its lots would have mixed
two σ under one reported σ. It now continues with the checkpoint's σ once that σ
still meets the target with this code's accountant; any other change is refused
by name.
"""

import dataclasses

import pytest

from dpnmt import config_lib, privacy
from dpnmt.config import RunConfig
from dpnmt.training import checkpointing, loop
from tests.small_configs import smaller_config

TARGET, N = 8.0, 1_000


def _plan(**fields) -> privacy.PrivacyPlan:
    config = config_lib.base_config()
    config.dp.update(target_epsilon=TARGET, **fields)
    return privacy.plan_privacy(config.dp, config.train, dataset_size=N)


def _saved(plan: privacy.PrivacyPlan, **changes) -> dict:
    return dataclasses.asdict(dataclasses.replace(plan, **changes))


def test_the_checkpoints_sigma_is_kept_when_it_still_meets_the_target():
    plan = _plan()
    started = plan.noise_multiplier * (1 + 3e-4)  # Another search's σ for the same target.
    resumed = checkpointing.resumed_plan(plan, _saved(plan, noise_multiplier=started), TARGET, "w")
    assert resumed == dataclasses.replace(plan, noise_multiplier=started)
    assert resumed.epsilon_after(resumed.num_steps) <= TARGET
    assert checkpointing.resumed_plan(plan, _saved(plan), TARGET, "w") == plan  # Same σ.


def test_a_saved_sigma_that_no_longer_meets_the_target_is_refused():
    plan = _plan()
    below = plan.noise_multiplier * (1 - 1e-2)
    assert dataclasses.replace(plan, noise_multiplier=below).epsilon_after(plan.num_steps) > TARGET
    with pytest.raises(ValueError, match=r"above dp.target_epsilon=8.0; finish it with the code"):
        checkpointing.resumed_plan(plan, _saved(plan, noise_multiplier=below), TARGET, "w")


def test_a_fixed_test_seed_still_checks_the_saved_sigma_against_the_target():
    plan = dataclasses.replace(_plan(), seed_is_secret=False)  # Its ε is ∞ whatever σ is.
    started = plan.noise_multiplier * (1 + 3e-4)
    resumed = checkpointing.resumed_plan(plan, _saved(plan, noise_multiplier=started), TARGET, "w")
    assert resumed.noise_multiplier == started


@pytest.mark.parametrize(
    "changes, fields",
    [
        ({"dataset_size": N - 1}, "dataset_size"),
        ({"num_steps": 7, "noise_multiplier": 2.0}, "num_steps, noise_multiplier"),
        ({"delta": 1e-6}, "delta"),
    ],
)
def test_any_other_change_is_refused_by_name(changes, fields):
    plan = _plan()
    with pytest.raises(
        ValueError, match=f"--workdir=w: .* differs from the checkpoint's in {fields} "
    ):
        checkpointing.resumed_plan(plan, _saved(plan, **changes), TARGET, "w")


def test_a_given_sigma_is_never_replaced():
    plan = _plan()  # target None below: σ was given, so a different σ is a different run.
    with pytest.raises(ValueError, match="in noise_multiplier "):
        checkpointing.resumed_plan(plan, _saved(plan, noise_multiplier=1.5), None, "w")


def test_a_plan_saved_before_largest_group_existed_is_not_a_change():
    plan = dataclasses.replace(_plan(), largest_group=55)
    saved = _saved(plan)
    del saved["largest_group"]
    assert checkpointing.resumed_plan(plan, saved, TARGET, "w") == plan


def _config() -> RunConfig:
    c = smaller_config("eps8")  # A fixed noise seed: deterministic, no guarantee.
    c.dp.target_epsilon, c.dp.noise_multiplier = TARGET, None  # σ calibrated.
    c.data.max_train_examples = 112
    c.train.expected_lot_size = 16  # 7 lots.
    c.train.checkpoint_every_steps = 3
    return RunConfig.of(c)


@pytest.mark.slow
def test_a_run_resumed_on_code_that_calibrates_another_sigma_finishes_on_its_own(
    tmp_path, monkeypatch
):
    partial = loop.train_and_evaluate(_config(), str(tmp_path), stop_after_steps=3)
    assert not partial["finished"]
    started = checkpointing.saved_plan(checkpointing.make_manager(str(tmp_path)))[
        "noise_multiplier"
    ]
    calibrate = privacy.core.calibrate_noise_multiplier
    monkeypatch.setattr(  # Newer code: a σ 0.03% smaller for the same target.
        privacy.core,
        "calibrate_noise_multiplier",
        lambda *a, **k: calibrate(*a, **k) * (1 - 3e-4),
    )
    resumed = loop.train_and_evaluate(_config(), str(tmp_path))
    assert resumed["finished"] and resumed["steps_done"] == 7
    assert resumed["privacy"]["noise_multiplier"] == started
    saved = checkpointing.saved_plan(checkpointing.make_manager(str(tmp_path)))
    assert saved["noise_multiplier"] == started
