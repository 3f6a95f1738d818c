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
from dpnmt.training import checkpointing, loop, run_dir, steps
from tests.markers import needs_data
from tests.small_configs import smaller_config

TARGET, N = 8.0, 1_000


def _plan(**fields) -> privacy.PrivacyPlan:
    config = config_lib.base_config()
    config.dp.update(target_epsilon=TARGET, **fields)
    return privacy.plan_privacy(config.dp, config.train, dataset_size=N)


def _saved(plan: privacy.PrivacyPlan, **changes) -> dict:
    return dataclasses.asdict(dataclasses.replace(plan, **changes))


PLANS = {  # Poisson/PLD (the default), shuffled lots, the RDP accountant.
    "poisson-pld": {},
    "shuffle-pld": {"sampling": "shuffle"},
    "poisson-rdp": {"accountant": "rdp"},
}


@pytest.mark.parametrize("fields", PLANS.values(), ids=PLANS)
def test_the_checkpoints_sigma_is_kept_when_it_still_meets_the_target(fields):
    plan = _plan(**fields)
    started = plan.noise_multiplier * (1 + 3e-4)  # Another search's σ for the same target.
    resumed = checkpointing.resumed_plan(plan, _saved(plan, noise_multiplier=started), TARGET, "w")
    assert resumed == dataclasses.replace(plan, noise_multiplier=started)
    assert resumed.epsilon_after(resumed.num_steps) <= TARGET
    assert checkpointing.resumed_plan(plan, _saved(plan), TARGET, "w") == plan  # Same σ.


@pytest.mark.parametrize("fields", PLANS.values(), ids=PLANS)
def test_a_saved_sigma_that_no_longer_meets_the_target_is_refused(fields):
    plan = _plan(**fields)
    below = plan.noise_multiplier * (1 - 5e-3)
    assert dataclasses.replace(plan, noise_multiplier=below).epsilon_after(plan.num_steps) > TARGET
    with pytest.raises(ValueError, match=r"above dp.target_epsilon=8.0; finish it with the code"):
        checkpointing.resumed_plan(plan, _saved(plan, noise_multiplier=below), TARGET, "w")


def test_a_fixed_test_seed_still_checks_the_saved_sigma_against_the_target():
    plan = dataclasses.replace(_plan(), seed_is_secret=False)  # Its ε is ∞ whatever σ is.
    started = plan.noise_multiplier * (1 + 3e-4)
    resumed = checkpointing.resumed_plan(plan, _saved(plan, noise_multiplier=started), TARGET, "w")
    assert resumed.noise_multiplier == started and not resumed.seed_is_secret
    below = plan.noise_multiplier * (1 - 5e-3)
    with pytest.raises(ValueError, match="above dp.target_epsilon"):
        checkpointing.resumed_plan(plan, _saved(plan, noise_multiplier=below), TARGET, "w")


def test_a_sigma_further_away_than_any_calibration_tolerance_is_refused():
    plan = _plan()
    far = plan.noise_multiplier * 1.5  # Safe (more noise), but one calibration is wrong.
    with pytest.raises(ValueError, match=r"more than 1% apart"):
        checkpointing.resumed_plan(plan, _saved(plan, noise_multiplier=far), TARGET, "w")


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"dataset_size": N - 1}, "dataset_size: checkpoint 999, now 1000"),
        ({"num_steps": 7}, "num_steps: checkpoint 7, now "),
        ({"delta": 1e-6}, "delta: checkpoint 1e-06, now 1e-08"),
    ],
)
def test_any_other_change_is_refused_by_name_and_values(changes, named):
    plan = _plan()
    with pytest.raises(
        ValueError, match=f"--workdir=w: .* differs from the checkpoint's .*{named}"
    ):
        checkpointing.resumed_plan(plan, _saved(plan, **changes), TARGET, "w")
    both = _saved(plan, noise_multiplier=plan.noise_multiplier * (1 + 3e-4), **changes)
    with pytest.raises(ValueError) as refused:  # σ is not kept beside another change.
        checkpointing.resumed_plan(plan, both, TARGET, "w")
    assert named in str(refused.value) and "noise_multiplier: checkpoint" in str(refused.value)


def test_a_given_sigma_is_never_replaced():
    plan = _plan()  # target None below: σ was given, so a different σ is a different run.
    with pytest.raises(ValueError, match="noise_multiplier: checkpoint 1.5, now "):
        checkpointing.resumed_plan(plan, _saved(plan, noise_multiplier=1.5), None, "w")


def test_a_plan_saved_before_largest_group_existed_is_not_a_change():
    plan = dataclasses.replace(_plan(), largest_group=55)
    saved = _saved(plan)
    del saved["largest_group"]
    assert checkpointing.resumed_plan(plan, saved, TARGET, "w") == plan


def test_a_field_this_code_does_not_know_is_a_change_not_a_crash():
    plan = _plan()
    with pytest.raises(ValueError, match=r"shuffle_rounds: checkpoint 3, now '\(absent\)'"):
        checkpointing.resumed_plan(plan, _saved(plan) | {"shuffle_rounds": 3}, TARGET, "w")


def _config() -> RunConfig:
    c = smaller_config("eps8")  # A fixed noise seed: deterministic, no guarantee.
    c.dp.target_epsilon, c.dp.noise_multiplier = TARGET, None  # σ calibrated.
    # RDP: a calibration of milliseconds (PLD's took 8 s a session); the σ a resumed
    # run keeps is the accountant's business alone (the PLD plans: the tests above).
    c.dp.accountant = "rdp"
    c.data.max_train_examples = 64
    c.train.expected_lot_size = 16  # 4 lots.
    c.train.checkpoint_every_steps = 1000  # Only where the session stops (CI time).
    return RunConfig.of(c)


def _saved_plan(workdir, run_id_offset: int = 0) -> dict:
    records = run_dir.RunDir(str(workdir))
    return checkpointing.saved_plan(
        checkpointing.make_manager(str(workdir)),
        records.noise_seed(_config(), True),
        records.run_id() + run_id_offset,
        str(workdir),
    )


@pytest.mark.slow
@needs_data  # configs/tiny.py's wmt16 sample: DPNMT_DATA_DIR, else the hub (offline here).
def test_a_run_resumed_on_code_that_calibrates_another_sigma_finishes_on_its_own(
    tmp_path, monkeypatch
):
    partial = loop.train_and_evaluate(_config(), str(tmp_path), stop_after_steps=2)
    assert not partial["finished"]
    started = _saved_plan(tmp_path)["noise_multiplier"]
    with pytest.raises(ValueError, match="run id differs"):  # A foreign checkpoint, said so.
        _saved_plan(tmp_path, run_id_offset=1)
    calibrate = privacy.core.calibrate_noise_multiplier
    # The lowered σ below is recorded as a hint: into a cache of this test's own.
    monkeypatch.setenv("DPNMT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(  # Newer code: a σ 0.03% smaller for the same target.
        privacy.core,
        "calibrate_noise_multiplier",
        lambda *a, **k: calibrate(*a, **k) * (1 - 3e-4),
    )
    from_plan, stepped = steps.StepPrivacy.from_plan, []
    monkeypatch.setattr(  # The σ the DP step draws its noise with, not only the reported one.
        steps.StepPrivacy,
        "from_plan",
        staticmethod(lambda plan: stepped.append(from_plan(plan)) or stepped[-1]),
    )
    resumed = loop.train_and_evaluate(_config(), str(tmp_path))
    assert resumed["finished"] and resumed["steps_done"] == 4
    assert [s.noise_multiplier for s in stepped] == [started]
    assert resumed["privacy"]["noise_multiplier"] == started
    assert _saved_plan(tmp_path)["noise_multiplier"] == started
