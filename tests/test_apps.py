"""The absl apps: importable without side effects, strict when run."""

import errno
import json
import os
import subprocess
import sys

import pytest

from dpnmt import cli
from dpnmt.errors import ConfigError

APPS = (
    "dpnmt.train",
    "dpnmt.decode",
    "dpnmt.sweep",
    "dpnmt.report",
    "dpnmt.audit",
    "dpnmt.memorization",
    "dpnmt.noise_to_signal",
    "dpnmt.public_vocab",
)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code_or_args, env=None, **kwargs):
    env = env or dict(os.environ, PYTHONPATH=REPO)
    return subprocess.run(
        [sys.executable, *code_or_args], capture_output=True, text=True, env=env, cwd=REPO, **kwargs
    )


@pytest.mark.parametrize("module", APPS)
def test_importing_an_app_leaves_other_apps_flags_parseable(module):
    # A test (or library) importing an app must not make its flags required
    # for every other absl app parsed in the same process.
    code = f"import {module}; from absl import flags; flags.FLAGS(['x']); print('parsed')"
    result = _python(["-c", code])
    assert result.returncode == 0, result.stderr[-2000:]
    assert "parsed" in result.stdout


@pytest.mark.parametrize("module", ["dpnmt.train", "dpnmt.sweep"])
def test_running_an_app_without_workdir_is_refused_naming_the_flag(module):
    result = _python(["-m", module], timeout=300)
    assert result.returncode != 0
    assert "--workdir" in result.stderr


def test_bad_config_value_is_one_line_without_traceback_and_writes_nothing(tmp_path):
    workdir = tmp_path / "run"
    command = ["-m", "dpnmt.train", "--config=configs/tiny.py", f"--workdir={workdir}"]
    result = _python([*command, "--config.train.optimizer=adamm"], timeout=300)
    assert result.returncode == cli.USAGE_EXIT_CODE, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("dpnmt.train:")]
    assert len(errors) == 1, result.stderr[-2000:]
    assert "train.optimizer='adamm' is unknown (did you mean 'adam'?)" in errors[0]
    assert "Traceback" not in result.stderr
    assert not workdir.exists()


def test_unknown_config_field_is_one_line_with_the_closest_field(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.parse_flags(["dpnmt.train", "--config=configs/tiny.py", "--config.dp.epsilon=1"])
    assert exit_info.value.code == cli.USAGE_EXIT_CODE
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].endswith(
        "--config.dp.epsilon: no field dp.epsilon; did you mean dp.target_epsilon?"
    )


def test_an_input_error_in_an_app_exits_2_in_one_line(capsys):
    def main(argv):
        raise ConfigError("train.optimizer='adamm' is unknown; use one of [...]")

    with pytest.raises(SystemExit) as exit_info:
        cli.guard(main)(["dpnmt.train"])
    assert exit_info.value.code == cli.USAGE_EXIT_CODE
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(": train.optimizer='adamm' is unknown; use one of [...]")
    )


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_disk_is_one_line_naming_the_file_and_the_fix(tmp_path, capsys):
    from dpnmt.training.metrics import MetricsWriter  # noqa: PLC0415 - tensorboardX.

    os.symlink("/dev/full", tmp_path / "metrics.jsonl")  # Every write: ENOSPC from the OS.

    def main(argv):
        MetricsWriter(str(tmp_path)).write(1, {"privacy/epsilon_spent": 0.5})

    with pytest.raises(SystemExit) as exit_info:
        cli.guard(main)(["dpnmt.train"])
    assert exit_info.value.code == cli.USAGE_EXIT_CODE
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "No space left on device; free space there" in line
    assert "rerun the same command" in line

    def wrapped(argv):  # As tensorstore reports it under orbax: the OS error's text only.
        raise ValueError('Error writing "state/x/0": [UNKNOWN: No space left on device]')

    with pytest.raises(SystemExit):
        cli.guard(wrapped)(["dpnmt.train"])
    assert capsys.readouterr().err.strip().count("No space left on device") == 2


def test_a_full_disk_names_a_relative_workdir_as_given(tmp_path, monkeypatch):
    """Orbax writes `checkpoints/` by its absolute path: the one line named the user's
    folders in a private run's log. A relative --workdir is now named as given."""
    monkeypatch.chdir(tmp_path)
    full = OSError(errno.ENOSPC, "No space left on device", f"{tmp_path}/run/checkpoints/8/x")
    line = cli.disk_problem(full, "run")
    assert line.startswith("run/checkpoints/8/x: No space left on device;")
    assert str(tmp_path) not in line
    assert cli.disk_problem(full, str(tmp_path / "run")).startswith(str(tmp_path))  # As given.


def test_an_unwritable_folder_is_one_line_and_other_errors_keep_their_traceback(capsys):
    def main(argv):
        raise PermissionError(13, "Permission denied", "/data/run/results.json")

    with pytest.raises(SystemExit):
        cli.guard(main)(["dpnmt.train"])
    line = capsys.readouterr().err.strip()
    assert line.endswith(
        ": /data/run/results.json: Permission denied; make it writable (or give another folder) "
        "and rerun the same command."
    )

    def bug(argv):
        raise FileNotFoundError(2, "No such file or directory", "x")

    with pytest.raises(FileNotFoundError):
        cli.guard(bug)(["dpnmt.train"])


def test_decode_warns_when_the_run_has_not_finished(tmp_path, caplog):
    from dpnmt.evaluation import decode as decode_lib

    assert not decode_lib.warn_if_unfinished(str(tmp_path))
    assert "has not finished" in caplog.text
    (tmp_path / "results.json").write_text('{"finished": true}')
    assert decode_lib.warn_if_unfinished(str(tmp_path))


def test_unknown_variant_is_one_line_naming_the_valid_ones():
    # In a child: importing dpnmt.data.inspect here would define --config in this process,
    # as dpnmt.plan (imported by tests/test_plan.py, maybe on this xdist worker) does too.
    code = (
        "import sys; from dpnmt import cli; from dpnmt.data import inspect; "
        "cli.parse_flags(['dpnmt.data.inspect', '--config=configs/tiny.py:eps2'])"
    )
    result = _python(["-c", code], timeout=300)
    assert result.returncode == cli.USAGE_EXIT_CODE, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Unknown config variant 'eps2'" in lines[0]
    assert "Traceback" not in lines[0]


FAST_HELP_APPS = (
    "dpnmt.train",
    "dpnmt.translate",
    "dpnmt.decode",
    "dpnmt.report",
    "dpnmt.plan",
    "dpnmt.memorization",
)
HEAVY = ("jax", "torch", "transformers", "datasets", "dp_accounting", "matplotlib", "orbax")


@pytest.mark.parametrize("module", FAST_HELP_APPS)
def test_an_app_imports_no_heavy_library_before_parsing_flags(module):
    # --help and a flag typo answer before JAX, torch and the rest load: they
    # took 20-50 s on a loaded machine (issue 33). Libraries load in main().
    code = (
        f"import sys, {module}\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))\n"
    )
    result = _python(["-c", code], timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_decode_refuses_a_length_penalty_that_is_not_finite_before_loading_anything(
    tmp_path, value
):
    result = _python(
        ["-m", "dpnmt.decode", f"--workdir={tmp_path}", f"--length_penalty={value}"], timeout=300
    )
    assert result.returncode == cli.USAGE_EXIT_CODE, result.stderr[-2000:]
    assert "--length_penalty=" in result.stderr and "Traceback" not in result.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("tag", ["../up", "a/b", "", "norepeat 3"])
def test_decode_refuses_a_tag_that_is_not_a_folder_name_before_loading_anything(tmp_path, tag):
    result = _python(["-m", "dpnmt.decode", f"--workdir={tmp_path}", f"--tag={tag}"], timeout=300)
    assert result.returncode == cli.USAGE_EXIT_CODE, result.stderr[-2000:]
    assert "--tag=" in result.stderr and "Traceback" not in result.stderr
    assert not list(tmp_path.iterdir())  # Nothing written.


@pytest.mark.parametrize("module", FAST_HELP_APPS)
def test_a_flag_typo_is_refused_without_a_traceback(module):
    result = _python(["-m", module, "--wrkdir=x"], timeout=300)
    assert result.returncode == cli.USAGE_EXIT_CODE, result.stderr[-2000:]
    assert "Unknown command line flag 'wrkdir'" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "variant, fix",
    [
        ("eps2", "--config.dp.target_epsilon=2 "),
        ("eps0.5", "--config.dp.target_epsilon=0.5 "),
        ("eps0", "':nonprivate' trains without DP"),
        ("big", "Any other ε: --config.dp.target_epsilon=<ε>"),
    ],
)
def test_an_unknown_variant_names_the_variants_and_the_flag_for_any_epsilon(variant, fix):
    from dpnmt import config_lib

    with pytest.raises(ValueError) as error:
        config_lib.parse_variants(f"{variant},shuffle")
    message = str(error.value)
    assert f"Unknown config variant {variant!r}" in message and "'nonprivate'" in message
    assert fix in message


def test_epsilon_zero_points_to_the_nonprivate_variant():
    from dpnmt.config import PrivacyConfig

    problems = PrivacyConfig(target_epsilon=0.0).problems()
    assert len(problems) == 1 and problems[0].startswith("dp.target_epsilon=0.0 must be > 0")
    assert ":nonprivate" in problems[0]


def test_a_workdirs_config_json_reads_back_as_the_config_it_was_written_from():
    from dpnmt import config_lib
    from dpnmt.config import RunConfig
    from tests.small_configs import load_config

    run = RunConfig.parse(load_config("multi30k_from_public", "eps3,lora"))
    config = config_lib.config_from_json(config_lib.published_config(run))
    assert RunConfig.parse(config) == run
    # Typed fields stay typed: `--config.dp.noise_multiplier=1.1` still parses onto None.
    config.update_from_flattened_dict({"dp.noise_multiplier": 1.1})
    assert RunConfig.parse(config).dp.noise_multiplier == 1.1


def test_train_with_the_workdir_alone_reads_its_config_json_and_checks_overrides(tmp_path):
    from dpnmt import config_lib
    from dpnmt.config import RunConfig
    from tests.small_configs import load_config

    fresh = _python(["-m", "dpnmt.train", f"--workdir={tmp_path / 'new'}"], timeout=300)
    assert fresh.returncode == cli.USAGE_EXIT_CODE, fresh.stderr[-2000:]
    assert "--config is required for a new run" in fresh.stderr and "Traceback" not in fresh.stderr
    run = RunConfig.parse(load_config("tiny", "eps8"))
    (tmp_path / "config.json").write_text(json.dumps(config_lib.published_config(run)))
    (tmp_path / "checkpoints" / "3").mkdir(parents=True)  # Bound: it has trained.
    command = ["-m", "dpnmt.train", f"--workdir={tmp_path}", "--config.train.learning_rate=0.5"]
    result = _python(command, timeout=300)
    assert result.returncode == cli.USAGE_EXIT_CODE, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("dpnmt.train:")]
    assert len(errors) == 1, result.stderr[-2000:]
    assert "holds a run with a different config" in errors[0]
    assert "--config.train.learning_rate=0.003" in errors[0]  # The run's own value: read back.


@pytest.mark.parametrize("module", ["dpnmt.memorization", "dpnmt.audit"])
def test_a_single_process_app_refuses_a_multi_process_launch_before_writing(module, tmp_path):
    """Each process would draw its own secret texts or canaries and write the same workdir."""
    workdir = tmp_path / "run"
    env = {"DPNMT_COORDINATOR_ADDRESS": "localhost:1", "DPNMT_NUM_PROCESSES": "2"}
    env["DPNMT_PROCESS_ID"] = "1"
    command = ["-m", module, "--config=configs/tiny.py", f"--workdir={workdir}"]
    result = _python(command, timeout=300, env=dict(os.environ, PYTHONPATH=REPO, **env))
    assert result.returncode == cli.USAGE_EXIT_CODE, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if "runs on one process" in line]
    assert len(errors) == 1 and "unset DPNMT_COORDINATOR_ADDRESS" in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not workdir.exists()


def test_the_decode_library_refuses_a_tag_that_leaves_the_run_folder(tmp_path):
    from dpnmt.evaluation import decode as decode_lib

    with pytest.raises(ConfigError, match="tag='../up'"):
        decode_lib.decode_and_score(None, str(tmp_path), split="validation", tag="../up")
    assert not list(tmp_path.iterdir())


def _app_modules() -> list[str]:
    """Every dpnmt module that ends in an `if __name__ == "__main__":` block (an app)."""
    import ast  # noqa: PLC0415
    import pathlib  # noqa: PLC0415

    apps = []
    for path in sorted(pathlib.Path(REPO, "dpnmt").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
                apps.append((str(path.relative_to(REPO)), ast.unparse(node)))
    return apps


def test_no_app_emits_timed_log_lines():
    """dpnmt.memorization and dpnmt.audit train private runs, and their log lines were
    stamped to the microsecond (dpnmt.train's and dpnmt.sweep's were not): a few lots timed.
    Every app starts through `cli.run` (`cli.guard`), whose logging is untimed, and an app
    that sets logging up again keeps it so."""
    import logging  # noqa: PLC0415
    import re  # noqa: PLC0415

    from absl import logging as absl_logging  # noqa: PLC0415

    apps = _app_modules()
    assert {"dpnmt/memorization.py", "dpnmt/audit.py", "dpnmt/noise_to_signal.py"} <= {
        path for path, _ in apps
    }
    for path, main_block in apps:
        assert "cli.run(" in main_block, f"{path} starts without cli.run: {main_block}"
    handler = absl_logging.get_absl_handler()
    before, lines = handler.formatter, []
    record = logging.LogRecord("dpnmt", logging.INFO, __file__, 7, "step 10/71", None, None)

    def main(argv):
        cli.setup_logging()  # As dpnmt.memorization and dpnmt.audit do first.
        lines.append(handler.format(record))

    try:
        handler.setFormatter(absl_logging.PythonFormatter())  # absl's stamped default.
        cli.guard(main)(["app"])
    finally:
        handler.setFormatter(before)
    (line,) = lines
    assert line.endswith("step 10/71") and not re.search(r"\d\d:\d\d:\d\d", line), line


@pytest.mark.parametrize("module", ["dpnmt.train", "dpnmt.sweep", "dpnmt.audit", "dpnmt.plan"])
@pytest.mark.parametrize("config", ["configs/tinyy.py", "configs/tinyy.py:eps8"])
def test_a_mistyped_config_path_is_one_line_naming_it(module, config, tmp_path):
    """It was a 48-line traceback from ml_collections."""
    args = [f"--config={config}", f"--workdir={tmp_path / 'run'}"]
    result = _python(["-m", module, *args], timeout=300)
    assert result.returncode == cli.USAGE_EXIT_CODE, result.stderr[-2000:]
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"{module}: --config={config}: no such file configs/tinyy.py"), line
    assert "configs/tiny.py" in line  # The closest config file.
    assert not (tmp_path / "run").exists()


def test_train_without_flags_shows_a_usage_example():
    result = _python(["-m", "dpnmt.train"], timeout=300)
    assert result.returncode == cli.USAGE_EXIT_CODE, result.stderr[-2000:]
    (line,) = result.stderr.strip().splitlines()
    assert "--workdir" in line and "e.g. " in line and "--config=configs/" in line, line
