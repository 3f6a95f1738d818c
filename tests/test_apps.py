"""The absl apps: importable without side effects, strict when run."""

import os
import subprocess
import sys

import pytest

APPS = ("dpnmt.train", "dpnmt.decode", "dpnmt.sweep", "dpnmt.report", "dpnmt.audit")
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
