"""`train.profile`: the phase timer's accounting, and the compilation cache's folder."""

import os

import jax
import jax.numpy as jnp
import pytest

from dpnmt import config_lib
from dpnmt.config import RunConfig
from dpnmt.errors import ConfigError
from dpnmt.training import compilation_cache, run_dir
from dpnmt.training.profile import PhaseTimer, format_table


class _Clock:
    """A fake clock that reads `now` (seconds), set by the test."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _rows(summary):
    return {row["phase"]: row for row in summary["phases"]}


def test_phases_are_exclusive_and_sum_to_the_session():
    clock = _Clock()
    timer = PhaseTimer(enabled=True, clock=clock)
    try:
        clock.now = 1.0  # 1 s in no phase.
        with timer.phase("evaluation"):
            clock.now = 3.0  # 2 s in evaluation itself...
            with timer.phase("decoding"):
                clock.now = 10.0  # ...7 s decoding inside it...
            clock.now = 11.0  # ...and 1 s more in evaluation.
        with timer.phase("evaluation"):
            clock.now = 12.0
        summary = timer.summary()
    finally:
        timer.close()
    rows = _rows(summary)
    assert summary["total_seconds"] == 12.0
    assert rows["evaluation"]["seconds"] == 4.0 and rows["evaluation"]["count"] == 2
    assert rows["evaluation / decoding"]["seconds"] == 7.0
    assert rows["other"]["seconds"] == 1.0
    assert sum(row["fraction"] for row in summary["phases"]) == pytest.approx(1.0)
    assert "| evaluation / decoding | 7.0 | 58.3 |" in format_table(summary)


def test_compile_time_is_charged_to_the_phase_that_compiled():
    timer = PhaseTimer(enabled=True)

    @jax.jit
    def f(x):
        return jnp.tanh(x) @ x.T

    x = jnp.ones((101, 5))  # A fresh function: its first call traces and compiles.
    try:
        with timer.phase("first call"):
            timer.sync(f(x))
        with timer.phase("second call"):
            timer.sync(f(x))  # Same shapes: no tracing, no compile.
        summary = timer.summary()
    finally:
        timer.close()
    rows = _rows(summary)
    assert rows["first call"]["compile_seconds"] > 0
    assert rows["second call"]["compile_seconds"] == 0
    assert summary["compile_seconds"] >= rows["first call"]["compile_seconds"]
    assert summary["compile_seconds_by_step"]["xla"] > 0


def test_a_disabled_timer_records_nothing():
    timer = PhaseTimer(enabled=False)
    with timer.phase("device steps"):
        value = timer.sync(jnp.ones(3))
    assert value.shape == (3,)
    assert [row["phase"] for row in timer.summary()["phases"]] == ["other"]


def test_a_private_runs_profile_goes_under_private(tmp_path):
    folder = run_dir.RunDir(str(tmp_path))
    private_path = folder.write_profile({"total_seconds": 1.0}, private=True)
    assert private_path == str(tmp_path / run_dir.PRIVATE_DIR / run_dir.PROFILE_FILE)
    assert not (tmp_path / run_dir.PROFILE_FILE).exists()
    public_path = folder.write_profile({"total_seconds": 1.0}, private=False)
    assert public_path == str(tmp_path / run_dir.PROFILE_FILE)


def test_the_cache_folder_defaults_outside_the_workdir():
    assert compilation_cache.default_dir({"XDG_CACHE_HOME": "/c"}) == "/c/dpnmt/jax"
    home = os.path.join(os.path.expanduser("~"), ".cache", "dpnmt", "jax")
    assert compilation_cache.default_dir({}) == home
    sweep = {"JAX_COMPILATION_CACHE_DIR": "/sweep/jax_cache", "XDG_CACHE_HOME": "/c"}
    assert compilation_cache.resolve("auto", sweep) == "/sweep/jax_cache"
    assert compilation_cache.resolve("off", sweep) is None
    assert compilation_cache.resolve("/mine", sweep) == "/mine"
    assert compilation_cache.resolve("auto", {"DPNMT_COMPILATION_CACHE": "off", **sweep}) is None
    # Tests never cache in $HOME: their children share the session's temporary folder.
    children = compilation_cache.resolve("auto")
    assert children is not None and children.startswith(os.environ["DPNMT_CACHE_DIR"])


def test_enable_points_jax_at_the_folder(tmp_path):
    before = jax.config.jax_compilation_cache_dir
    minimum = jax.config.jax_persistent_cache_min_compile_time_secs
    try:
        assert compilation_cache.enable(str(tmp_path / "jax")) == str(tmp_path / "jax")
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "jax")
        assert compilation_cache.enable("off") is None
        with pytest.raises(ConfigError, match="train.compilation_cache"):
            compilation_cache.enable("")
    finally:  # Nothing compiled meanwhile: no program went to tmp_path.
        jax.config.update("jax_compilation_cache_dir", before)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", minimum)


def test_enable_keeps_a_minimum_compile_time_jax_was_given(tmp_path, monkeypatch):
    before = jax.config.jax_compilation_cache_dir
    minimum = jax.config.jax_persistent_cache_min_compile_time_secs
    try:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.25)
        monkeypatch.setenv(compilation_cache.MIN_COMPILE_ENV_VAR, "0.25")
        compilation_cache.enable(str(tmp_path / "jax"))
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.25
        monkeypatch.delenv(compilation_cache.MIN_COMPILE_ENV_VAR)
        compilation_cache.enable(str(tmp_path / "jax"))
        assert (
            jax.config.jax_persistent_cache_min_compile_time_secs
            == compilation_cache.MIN_COMPILE_SECONDS
        )
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", minimum)


def test_a_file_as_the_cache_folder_is_a_config_problem(tmp_path):
    path = tmp_path / "a_file"
    path.write_text("")
    problems = compilation_cache.problems(str(path))
    assert len(problems) == 1 and "is the file" in problems[0]
    assert compilation_cache.problems("auto") == [] and compilation_cache.problems("off") == []


def test_profile_and_cache_do_not_bind_a_workdir(tmp_path):
    """A trained workdir resumes with profiling or the cache switched; other changes are refused."""
    config = config_lib.make_config("eps8")
    folder = run_dir.RunDir(str(tmp_path))
    folder.bind_config(RunConfig.of(config))
    (tmp_path / run_dir.CHECKPOINT_DIR).mkdir()
    (tmp_path / run_dir.CHECKPOINT_DIR / "5").mkdir()  # A checkpoint binds every other field.
    config.train.profile = True
    config.train.compilation_cache = "off"
    folder.bind_config(RunConfig.of(config))
    config.train.log_every_steps += 1
    with pytest.raises(ValueError, match=r"fields differ: train.log_every_steps: run "):
        folder.bind_config(RunConfig.of(config))


def test_a_cache_inside_the_published_workdir_is_refused(tmp_path):
    from dpnmt import config_lib
    from dpnmt.training import compilation_cache

    config = config_lib.base_config()
    workdir = tmp_path / "run"
    for folder, refused in (
        (workdir / "cache", True),
        (workdir / "private" / "cache", False),
        (tmp_path / "elsewhere", False),
    ):
        config.train.compilation_cache = str(folder)
        problems = compilation_cache.in_workdir_problems(
            config.train.compilation_cache, str(workdir)
        )
        assert bool(problems) == refused, (folder, problems)
        if refused:
            assert "inside --workdir" in problems[0] and "private/" in problems[0]
