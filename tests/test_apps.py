"""The absl apps: importable without side effects, strict when run."""

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
    "dpnmt.noise_to_signal",
    "dpnmt.public_vocab",
)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code_or_args, **kwargs):
    env = dict(os.environ, PYTHONPATH=REPO)
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


def test_decode_warns_when_the_run_has_not_finished(tmp_path, caplog):
    from dpnmt.evaluation import decode as decode_lib

    assert not decode_lib.warn_if_unfinished(str(tmp_path))
    assert "has not finished" in caplog.text
    (tmp_path / "results.json").write_text('{"finished": true}')
    assert decode_lib.warn_if_unfinished(str(tmp_path))


def test_unknown_variant_is_one_line_naming_the_valid_ones(capsys):
    from absl.testing import flagsaver

    from dpnmt.data import inspect  # noqa: F401 - defines --config in this process.

    with flagsaver.flagsaver(), pytest.raises(SystemExit) as exit_info:
        cli.parse_flags(["dpnmt.data.inspect", "--config=configs/tiny.py:eps2"])
    assert exit_info.value.code == cli.USAGE_EXIT_CODE
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "Unknown config variant 'eps2'" in lines[0]
    assert "Traceback" not in lines[0]


FAST_HELP_APPS = ("dpnmt.train", "dpnmt.translate", "dpnmt.decode", "dpnmt.report", "dpnmt.plan")
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


@pytest.mark.parametrize("module", FAST_HELP_APPS)
def test_a_flag_typo_is_refused_without_a_traceback(module):
    result = _python(["-m", module, "--wrkdir=x"], timeout=300)
    assert result.returncode == cli.USAGE_EXIT_CODE, result.stderr[-2000:]
    assert "Unknown command line flag 'wrkdir'" in result.stderr
    assert "Traceback" not in result.stderr
