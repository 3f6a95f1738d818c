"""Grid bookkeeping and the table's statistics, without training anything."""

import json
import math

import numpy as np
import pytest

from dpnmt import config_lib
from dpnmt.sweeps import grid, summary
from dpnmt.training.privacy_report import PrivacyReport, VocabularyClaim


def test_expand_orders_runs_and_names_their_folders():
    specs = grid.expand(["eps1", "nonprivate"], ["poisson", "shuffle"], 2)
    assert len(specs) == 8
    assert specs[0] == grid.RunSpec("eps1", "poisson", 0)
    assert [s.name for s in specs[:3]] == [
        "eps1-poisson/seed0",
        "eps1-poisson/seed1",
        "eps1-shuffle/seed0",
    ]
    assert specs[-1].variant == "nonprivate,shuffle"


@pytest.mark.parametrize(
    "privacy, sampling, seeds, match",
    [
        (["eps2"], ["poisson"], 1, "--grid has unknown names.*eps2"),
        (["eps1"], ["uniform"], 1, "--sampling has unknown names"),
        ([], ["poisson"], 1, "--grid is empty"),
        (["eps1", "eps1"], ["poisson"], 1, "repeats"),
        (["eps1"], ["poisson"], 0, "--seeds=0"),
    ],
)
def test_expand_rejects_bad_grids(privacy, sampling, seeds, match):
    with pytest.raises(ValueError, match=match):
        grid.expand(privacy, sampling, seeds)


@pytest.mark.parametrize(
    "override, match",
    [
        ("--config.seed=3", "grid varies"),
        ("--config.dp.sampling=shuffle", "grid varies"),
        ("--config.dp.noise_multiplier=1.0", "grid varies"),
        ("--config.train.num_epochs", "write --config"),
        ("--train.num_epochs=2", "write --config"),
    ],
)
def test_overrides_that_would_contradict_the_grid_are_refused(override, match):
    with pytest.raises(ValueError, match=match):
        grid.check_overrides([override])


def test_a_fixed_noise_seed_follows_the_trainers_one_rule():
    """Refused for private runs unless the test-only switch is set; never in sweep.json."""
    fixed = ["--config.noise_seed=7", "--config.train.num_epochs=2"]
    assert grid.check_overrides(fixed) == []
    specs = grid.expand(["eps5", "nonprivate"], ["shuffle"], 1)
    configs = {s: grid.resolve_config("configs/tiny.py", s, fixed) for s in specs}
    with pytest.raises(ValueError, match=r"eps5-shuffle.*config\.noise_seed"):
        grid.check_configs(configs)
    switched = [*fixed, "--config.testing_only_fixed_noise_seed_NO_PRIVACY=True"]
    warnings = grid.check_overrides(switched)
    assert len(warnings) == 1 and "no guarantee" in warnings[0]
    grid.check_configs({s: grid.resolve_config("configs/tiny.py", s, switched) for s in specs})
    assert "--config.noise_seed=7" not in grid.published_overrides(switched)
    assert "--config.noise_seed=<private>" in grid.published_overrides(switched)


def test_resolve_config_is_the_trainers_config_for_the_cell():
    spec = grid.RunSpec("eps5", "shuffle", 2)
    config = grid.resolve_config("configs/tiny.py", spec, ["--config.train.num_epochs=3"])
    assert config.seed == 2 and config.noise_seed is None
    assert config.dp.target_epsilon == 5.0 and config.dp.sampling == "shuffle"
    assert config.train.num_epochs == 3 and config.variant == "eps5,shuffle"
    with pytest.raises(ValueError, match="has no field 'train.nope'"):
        grid.resolve_config("configs/tiny.py", spec, ["--config.train.nope=1"])
    with pytest.raises(ValueError, match="does not parse"):
        grid.resolve_config("configs/tiny.py", spec, ["--config.train.num_epochs=many"])


def test_is_finished_needs_finished_results_and_the_same_config(tmp_path):
    config = grid.resolve_config("configs/tiny.py", grid.RunSpec("eps1", "poisson", 0), [])
    assert not grid.is_finished(str(tmp_path), config)
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    (tmp_path / "results.json").write_text(json.dumps({"finished": False}))
    assert not grid.is_finished(str(tmp_path), config)
    (tmp_path / "results.json").write_text(json.dumps({"finished": True}))
    assert grid.is_finished(str(tmp_path), config)
    other = grid.resolve_config("configs/tiny.py", grid.RunSpec("eps1", "poisson", 1), [])
    assert not grid.is_finished(str(tmp_path), other)


def test_mean_std_uses_the_sample_standard_deviation():
    values = [1.0, 2.0, 4.0]
    mean, std = summary.mean_std(values)
    assert mean == pytest.approx(7 / 3)
    assert std == pytest.approx(np.sqrt(np.sum((np.array(values) - 7 / 3) ** 2) / 2))
    assert math.isnan(summary.mean_std([3.0])[1])


def test_missing_manifest_names_the_folder(tmp_path):
    with pytest.raises(ValueError, match=f"{tmp_path} has no readable sweep.json"):
        grid.read_manifest(str(tmp_path))


def _fake_results(rng, private, sampling, epsilon):
    """A results.json shaped like the trainer's, with random scores."""
    steps = 10
    history = [
        {
            "step": s,
            "bleu": float(rng.uniform(0, 30)),
            "loss": float(rng.uniform(2, 7)),
            "epsilon": epsilon * s / steps if private else "inf",
        }
        for s in (0, 5)
    ]
    del history[0]["bleu"]  # Before training the loop scores the loss only.
    return {
        "finished": True,
        "steps_done": steps,
        "seconds_per_epoch": float(rng.uniform(1, 100)),
        "history": history,
        "validation": {"bleu": float(rng.uniform(0, 30)), "loss": float(rng.uniform(2, 7))},
        "test": {
            "bleu": float(rng.uniform(0, 30)),
            "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
            "chrf": float(rng.uniform(0, 60)),
            "bertscore": {"f1": float(rng.uniform(0, 1))},
        },
        "privacy": _fake_report(private, sampling, epsilon, steps),
    }


def _fake_report(private, sampling, epsilon, steps):
    """results.json's "privacy" object (inf as the string "inf", as write_json stores it)."""
    report = PrivacyReport(
        private=private,
        bound="test",
        sampling=sampling,
        adjacency="test",
        noise_multiplier=0.9 if private else 0.0,
        l2_clip=1.0,
        expected_lot_size=8,
        dataset_size=100,
        sampling_rate=0.08,
        assumed_public=("N",),
        steps_done=steps,
        steps_planned=steps,
        dp_sgd_epsilon=epsilon if private else math.inf,
        dp_sgd_epsilon_is_at="steps_planned",
        dp_sgd_delta=1e-5,
        validation_is_private=False,
        vocabulary=VocabularyClaim("pretrained", True, 0.0, 0.0, "test"),
        total_epsilon=epsilon + 1.5 if private else math.inf,
        composition="test",
    )
    return {k: "inf" if v == math.inf else v for k, v in report.to_json().items()}


def test_report_of_a_grid_with_a_non_private_cell(tmp_path):
    from dpnmt.sweeps import report

    rng = np.random.default_rng(0)
    specs = grid.expand(["eps1", "eps5", "nonprivate"], ["poisson", "shuffle"], 2)
    manifest = {"config": "configs/tiny.py", "overrides": [], "runs": {}}
    for spec in specs:
        private = spec.privacy != "nonprivate"
        results = _fake_results(
            rng, private, spec.sampling, config_lib.PRIVACY_VARIANTS[spec.privacy] or 0.0
        )
        (tmp_path / spec.name).mkdir(parents=True)
        (tmp_path / spec.name / "results.json").write_text(json.dumps(results))
        manifest["runs"][spec.name] = {
            "privacy": spec.privacy,
            "sampling": spec.sampling,
            "seed": spec.seed,
            "state": grid.FINISHED,
        }
    manifest["runs"]["eps1-poisson/seed9"] = {
        "privacy": "eps1",
        "sampling": "poisson",
        "seed": 9,
        "state": grid.FAILED,
    }
    grid.write_manifest(str(tmp_path), manifest)
    markdown = report.write_report(str(tmp_path), str(tmp_path / "report"))
    rows = summary.cell_rows(summary.load_runs(str(tmp_path))[0])
    assert len(rows) == 6 and all(row["n"] == 2 for row in rows)
    non_private = [row for row in rows if row["privacy"] == "nonprivate"]
    assert all(
        math.isinf(row["epsilon"]) and row["epsilon_bound"] == "no DP" for row in non_private
    )
    for row in rows:
        members = [
            json.loads((tmp_path / s.name / "results.json").read_text())
            for s in specs
            if (s.privacy, s.sampling) == (row["privacy"], row["sampling"])
        ]
        f1 = [m["test"]["bertscore"]["f1"] for m in members]
        assert row["bertscore_f1_mean"] == pytest.approx(np.mean(f1))
        assert row["bertscore_f1_std"] == pytest.approx(np.std(f1, ddof=1))
        chrf = [m["test"]["chrf"] for m in members]
        assert row["chrf_mean"] == pytest.approx(np.mean(chrf))
        assert row["chrf_std"] == pytest.approx(np.std(chrf, ddof=1))
        assert f"{row['chrf_mean']:.1f} ({row['chrf_std']:.1f})" in markdown
    assert "sacreBLEU signature: `nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0`" in (
        markdown
    )
    assert "| nonprivate | shuffle | 2 |" in markdown and "∞" in markdown
    assert "eps1-poisson/seed9 (failed)" in markdown
    for name in report.FIGURES:
        assert (tmp_path / "report" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_cache_is_private_and_nojax_cache_turns_every_cache_off(tmp_path, monkeypatch):
    from dpnmt.sweeps import runner
    from dpnmt.training import compilation_cache

    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.delenv(compilation_cache.ENV_VAR, raising=False)
    on = runner.child_env(str(tmp_path), jax_cache=True)
    # Which shapes compile can depend on private lots: the cache is under private/.
    assert on["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "private" / "jax_cache")
    assert compilation_cache.resolve("auto", on) == on["JAX_COMPILATION_CACHE_DIR"]
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/elsewhere")
    off = runner.child_env(str(tmp_path), jax_cache=False)
    assert "JAX_COMPILATION_CACHE_DIR" not in off
    assert compilation_cache.resolve("auto", off) is None


def test_log_tails_of_an_older_sweep_json_move_to_private(tmp_path):
    from dpnmt.sweeps import runner

    manifest = {
        "config": "c.py",
        "overrides": [],
        "runs": {"eps8-poisson/seed0": {"state": grid.FINISHED, "error_tail": "line 7: Ein Hund"}},
    }
    runner._move_old_error_tails(str(tmp_path), manifest)
    assert "Ein Hund" not in (tmp_path / grid.MANIFEST_FILE).read_text()
    tail = tmp_path / "eps8-poisson" / "seed0" / grid.ERROR_TAIL
    assert tail.read_text() == "line 7: Ein Hund"


def test_a_run_stopped_by_its_own_ctrl_c_is_interrupted_not_failed_and_stops_the_sweep(
    tmp_path, monkeypatch
):
    from dpnmt.sweeps import runner

    calls = []

    def interrupted(command, run_dir, env):
        calls.append(run_dir)
        return grid.TRAIN_INTERRUPTED_EXIT, "Interrupted at lot 3 of 8"

    monkeypatch.setattr(runner, "train_one", interrupted)
    specs = grid.expand(["eps8", "nonprivate"], ["poisson"], 1)
    with pytest.raises(KeyboardInterrupt):
        runner.run_sweep("configs/tiny.py", str(tmp_path), specs, [])
    manifest = grid.read_manifest(str(tmp_path))
    assert len(calls) == 1, "the sweep went on to the next run after a Ctrl-C"
    assert manifest["runs"][specs[0].name]["state"] == grid.INTERRUPTED


def test_expand_names_every_bad_flag_at_once():
    """The sweep reported only the first of two typos."""
    with pytest.raises(ValueError) as error:
        grid.expand(["eps1", "epz5"], ["poison"], 0)
    message = str(error.value)
    assert "--grid has unknown names ['epz5']" in message
    assert "--sampling has unknown names ['poison']" in message
    assert "--seeds=0 must be >= 1" in message


def test_the_sweep_app_names_an_override_typo_and_a_grid_typo_together(tmp_path):
    import os
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    flags = ["--config=configs/tiny.py", "--grid=eps1,epz5", "--sampling=poison"]
    flags += ["--config.train.num_epoch=2", f"--workdir={tmp_path / 'sweep'}"]
    result = subprocess.run(
        [sys.executable, "-m", "dpnmt.sweep", *flags],
        capture_output=True,
        text=True,
        cwd=repo,
        env=dict(os.environ, PYTHONPATH=repo),
        timeout=300,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    for typo in ("train.num_epoch", "['epz5']", "['poison']"):
        assert typo in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and not (tmp_path / "sweep").exists()
