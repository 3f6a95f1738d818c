"""dpnmt.publish: a workdir's published text files only, finished runs only, no local paths."""

import json
import os
import subprocess
import sys

import pytest

from dpnmt.errors import InputError
from dpnmt.training import publishing


def _write(path, text="{}"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _run(folder, finished=True):
    _write(f"{folder}/config.json", json.dumps({"seed": 0}))
    if finished is not None:
        _write(f"{folder}/results.json", json.dumps({"finished": finished}))
    _write(f"{folder}/metrics.jsonl", '{"step": 0}\n')
    _write(f"{folder}/pretrained.json")
    _write(f"{folder}/private/noise_seed", "123")
    _write(f"{folder}/private/preprocessing.json")
    _write(f"{folder}/checkpoints/100/_CHECKPOINT_METADATA.json")
    _write(f"{folder}/tensorboard/events.out.tfevents.session-0001", "x")
    _write(f"{folder}/tokenizer.model", "x")
    _write(f"{folder}/.sweep.lock", "")


@pytest.fixture
def sweep(tmp_path):
    root = tmp_path / "sweep"
    _write(f"{root}/sweep.json")
    _write(f"{root}/private/jax_cache/x-cache.json")
    _run(f"{root}/eps8-poisson/seed0")
    _run(f"{root}/eps1-poisson/seed0", finished=None)  # Still running: no results.json.
    _run(f"{root}/eps3-poisson/seed0", finished=False)  # Stopped.
    _write(f"{root}/eps8-poisson/seed0/decode_test/hypotheses.test.txt", "A man .\n")
    _write(f"{root}/report/table.md", "| a |\n")
    return root


def test_copies_finished_runs_published_text_only(sweep, tmp_path):
    out = tmp_path / "out"
    files, skipped = publishing.publish(str(sweep), str(out))
    run = "eps8-poisson/seed0"
    want = {
        "sweep.json",
        "report/table.md",
        f"{run}/config.json",
        f"{run}/results.json",
        f"{run}/metrics.jsonl",
        f"{run}/pretrained.json",
        f"{run}/decode_test/hypotheses.test.txt",
    }
    assert set(files) == want
    assert skipped == ["eps1-poisson/seed0", "eps3-poisson/seed0"]
    copied = {
        os.path.relpath(os.path.join(d, n), out) for d, _, names in os.walk(out) for n in names
    }
    assert copied == want
    assert (out / run / "metrics.jsonl").read_text() == '{"step": 0}\n'


def test_a_local_path_in_any_file_copies_nothing(sweep, tmp_path):
    _write(f"{sweep}/eps8-poisson/seed0/config.json", json.dumps({"workdir": str(sweep)}))
    out = tmp_path / "out"
    with pytest.raises(InputError, match="eps8-poisson/seed0/config.json names the local path"):
        publishing.publish(str(sweep), str(out))
    assert not out.exists()


def test_home_folder_is_a_local_path(sweep, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", "/home/somebody")
    _write(f"{sweep}/report/table.md", "made in /home/somebody/runs\n")
    with pytest.raises(InputError, match="report/table.md names the local path '/home/somebody'"):
        publishing.publish(str(sweep), str(tmp_path / "out"))


@pytest.mark.parametrize("problem", ["missing", "inside", "nothing"])
def test_bad_input_is_refused_before_writing(sweep, tmp_path, problem):
    workdir, out = str(sweep), str(tmp_path / "out")
    if problem == "missing":
        workdir, match = str(tmp_path / "nope"), "is not a folder"
    elif problem == "inside":
        out, match = str(sweep / "published"), "lies inside --workdir"
    else:
        workdir, match = str(sweep / "eps1-poisson"), r"no finished run.*unfinished: seed0"
    with pytest.raises(InputError, match=match):
        publishing.publish(workdir, out)
    assert not os.path.exists(out)


def test_app_prints_what_it_copied_and_skipped(sweep, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "dpnmt.publish", f"--workdir={sweep}", f"--out={tmp_path / 'o'}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Copied 7 file(s)" in done.stdout
    assert "Skipped eps3-poisson/seed0: not finished" in done.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "dpnmt.publish", f"--workdir={tmp_path / 'x'}", "--out=o"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "is not a folder" in bad.stderr


@pytest.mark.parametrize("below", ["private", "private/decode_validation", "checkpoints"])
def test_a_workdir_inside_a_never_published_folder_is_refused(sweep, tmp_path, below):
    workdir = sweep / "eps8-poisson" / "seed0" / below
    _write(f"{workdir}/hypotheses.validation.txt", "private sentence\n")
    _write(f"{workdir}/results.json")
    with pytest.raises(InputError, match=f"lies inside a {below.split('/')[0]}/ folder"):
        publishing.publish(str(workdir), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("target", ["private/preprocessing.json", "private"])
def test_symbolic_links_are_refused(sweep, tmp_path, target):
    run = sweep / "eps8-poisson" / "seed0"
    os.symlink(run / target, run / ("notes.json" if "." in target else "decode_test2"))
    with pytest.raises(InputError, match="is a symbolic link"):
        publishing.publish(str(sweep), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("value", "refused"),
    [
        ("files:/data/corpus", True),
        ("/scratch/models/t5", True),
        ("https://huggingface.co/t5-small", False),
        ("../exported/public_de_en", False),
        ("s / epoch", False),
    ],
)
def test_absolute_paths_in_json_strings(sweep, tmp_path, value, refused):
    _write(f"{sweep}/eps8-poisson/seed0/config.json", json.dumps({"data": {"corpus": value}}))
    if refused:
        with pytest.raises(InputError, match=f"config.json names the local path '{value}'"):
            publishing.publish(str(sweep), str(tmp_path / "out"))
    else:
        publishing.publish(str(sweep), str(tmp_path / "out"))


def test_validation_outputs_of_a_carved_private_validation_are_refused(sweep, tmp_path):
    run = sweep / "eps8-poisson" / "seed0"
    results = {"finished": True, "validation_is_private": True, "privacy": {"private": True}}
    _write(f"{run}/results.json", json.dumps(results))
    _write(f"{run}/noise_to_signal.json")
    _write(f"{run}/decode_validation/hypotheses.validation.txt", "private sentence\n")
    _write(f"{run}/decode_validation_norepeat3/hypotheses.validation.txt", "private sentence\n")
    _write(f"{run}/decode_validation_notes.txt", "a file, not a decode folder\n")
    with pytest.raises(InputError) as raised:
        publishing.publish(str(sweep), str(tmp_path / "out"))
    assert "noise_to_signal.json: measured on validation pairs carved" in str(raised.value)
    assert "decode_validation/hypotheses.validation.txt" in str(raised.value)
    assert "decode_validation_norepeat3/hypotheses.validation.txt" in str(raised.value)
    assert "decode_validation_notes.txt" not in str(raised.value)
    assert not (tmp_path / "out").exists()
    results["validation_is_private"] = False  # Its own public split: published.
    _write(f"{run}/results.json", json.dumps(results))
    files, _ = publishing.publish(str(sweep), str(tmp_path / "out"))
    assert "eps8-poisson/seed0/noise_to_signal.json" in files


def test_a_sweep_with_no_finished_run_leaves_its_manifest_behind(tmp_path):
    root = tmp_path / "grid"
    _write(f"{root}/done/sweep.json")
    _run(f"{root}/done/eps8-poisson/seed0")
    _write(f"{root}/running/sweep.json")
    _run(f"{root}/running/eps8-poisson/seed0", finished=None)
    files, skipped = publishing.publish(str(root), str(tmp_path / "out"))
    assert "done/sweep.json" in files and "running/sweep.json" not in files
    assert skipped == ["running/eps8-poisson/seed0"]
