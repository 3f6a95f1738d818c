"""`dpnmt.translate`'s bad inputs: one line naming the input and the fix, no help dump."""

import os
import subprocess
import sys

import pytest

from dpnmt import cli, release
from dpnmt.errors import InputError, MissingInputError, ModelUnavailableError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_missing_workdir_says_the_folder_does_not_exist(tmp_path):
    with pytest.raises(MissingInputError, match="no such folder"):
        release.load_translator(workdir=str(tmp_path / "nope"))


def test_a_missing_model_path_is_named_as_a_missing_folder(tmp_path):
    with pytest.raises(MissingInputError, match=r"--model=.*nope: no such folder"):
        release.load_translator(model_dir=str(tmp_path / "nope"))


def test_a_hub_id_that_cannot_be_downloaded_says_so(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # "exported/none" is then no local folder.

    def offline(name_or_path):
        raise OSError("We couldn't connect to 'https://huggingface.co' (a long hub message)")

    monkeypatch.setattr("dpnmt.models.load_pretrained", offline)
    with pytest.raises(ModelUnavailableError) as error:
        release.load_translator(model_dir="exported/none")
    message = str(error.value)
    assert "no such local folder" in message and "hub id" in message
    assert "huggingface.co" not in message  # One line of ours, not the hub's.


def test_a_missing_input_file_is_named_with_the_fix(tmp_path):
    with pytest.raises(MissingInputError, match=r"--input=.*missing.txt: no such file"):
        release.read_lines(str(tmp_path / "missing.txt"))


def test_a_latin1_input_file_is_named_with_the_fix(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("Café au lait\n".encode("latin-1"))
    with pytest.raises(InputError, match=r"latin1.txt is not UTF-8 text .*iconv"):
        release.read_lines(str(path))
    path.write_text("Café\n\nau lait\n", encoding="utf-8")
    assert release.read_lines(str(path)) == ["Café", "", "au lait"]


def test_empty_translations_of_non_blank_lines_are_counted():
    lines = ["Ein Hund.", "", "Eine Katze.", "Ein Haus."]
    assert release.empty_translation_warning(lines, ["A dog.", "", "A cat.", "A house."]) is None
    warning = release.empty_translation_warning(lines, ["", "", " ", "A house."])
    assert warning.startswith("2 of 3 non-blank lines were translated to empty text")
    assert "undertrained" in warning and "vocabulary" in warning


@pytest.mark.slow
def test_the_app_prints_one_line_without_the_help(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO, HF_HUB_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, "-m", "dpnmt.translate", f"--workdir={tmp_path / 'nope'}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        input="Ein Hund.\n",
        timeout=300,
    )
    assert result.returncode == cli.USAGE_EXIT_CODE, result.stderr[-2000:]
    (error,) = result.stderr.strip().splitlines()  # No help, no library INFO line.
    assert error.startswith("dpnmt.translate: --workdir=") and "no such folder" in error


def test_a_hub_id_the_hub_cannot_give_is_refused_before_any_download(monkeypatch, tmp_path):
    """A mistyped --model that looks like a hub id cost 33 s of hub retries before its line."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tried = []
    monkeypatch.setattr("dpnmt.models.load_pretrained", lambda name: tried.append(name))
    with pytest.raises(ModelUnavailableError, match=r"--model=exportd/none: no such local folder"):
        release.load_translator(model_dir="exportd/none")
    assert tried == []  # Asked once (models.hub: one short request, or the cache), no retries.
