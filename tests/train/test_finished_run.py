"""`python -m dpnmt.train` again on a finished run, and the resume line Ctrl-C prints."""

import json
import os
import pathlib
import subprocess
import sys

from dpnmt.config import RunConfig
from dpnmt.data.tokenizers import VocabularyRecord
from dpnmt.training.privacy_report import privacy_report
from dpnmt.training.run_dir import RunDir
from tests.markers import needs_data
from tests.small_configs import load_config, small_plan

REPO = pathlib.Path(__file__).resolve().parents[2]


def _python(args, cwd=REPO, env=None):
    env = env or dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600
    )


def test_the_resume_line_names_this_interpreter_and_the_data_folder_it_read(tmp_path):
    code = (
        "from dpnmt.train import resume_command\n"
        "argv = ['/x/dpnmt/train.py', '--workdir=my run', '--config=c.py:eps8']\n"
        "print(resume_command(argv, '/venv/bin/python', 'data'))\n"
        "print(resume_command(argv, '/venv/bin/python', None))\n"
    )
    result = _python(["-c", code], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    with_data, without = result.stdout.splitlines()
    tail = "/venv/bin/python -m dpnmt.train '--workdir=my run' --config=c.py:eps8"
    assert with_data == f"DPNMT_DATA_DIR={tmp_path / 'data'} {tail}"  # Absolute: pasted anywhere.
    assert without == tail


@needs_data
def test_a_finished_run_run_again_says_so_and_writes_nothing(tmp_path):
    workdir = tmp_path / "run"
    RunDir(str(workdir)).bind_config(RunConfig.parse(load_config("tiny", "eps8")))
    vocabulary = VocabularyRecord("sentencepiece_public", True, None, None, "public vocabulary")
    report = privacy_report(small_plan(), 10, vocabulary).to_json()
    test = {"bleu": 12.34, "bleu_signature": "nrefs:1", "chrf": 40.12, "num_sentences": 1000}
    results = {"finished": True, "test": test, "privacy": report, "steps_done": 10}
    (workdir / "results.json").write_text(json.dumps(results))
    before = {p.name: p.read_bytes() for p in workdir.iterdir()}

    done = _python(["-m", "dpnmt.train", f"--workdir={workdir}"])
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"{workdir} has already finished" in done.stderr, done.stderr[-4000:]
    assert "Test: BLEU 12.3, chrF 40.1 on 1000 sentences." in done.stderr  # Its summary again.
    assert "Compiling" not in done.stderr and "Decoding" not in done.stderr
    assert {p.name: p.read_bytes() for p in workdir.iterdir()} == before  # Nothing written.
