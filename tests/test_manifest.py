"""dpnmt.manifest: a folder's SHA256SUMS is `sha256sum -c`'s format and finds every change."""

import hashlib
import shutil
import subprocess

import pytest

from dpnmt import manifest


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(bytes(range(256)) * 10)
    (tmp_path / "dpnmt.json").write_text('{"private": false}\n')
    (tmp_path / ".hidden").write_text("not listed")
    return tmp_path


def test_written_manifest_lists_every_file_with_its_sha256(folder):
    hashes = manifest.write(str(folder))
    assert sorted(hashes) == ["dpnmt.json", "model.safetensors"]
    expected = hashlib.sha256(bytes(range(256)) * 10).hexdigest()
    assert hashes["model.safetensors"] == expected
    assert manifest.read(str(folder)) == hashes
    assert manifest.problems(str(folder)) == []


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="needs coreutils' sha256sum")
def test_coreutils_checks_the_same_file(folder):
    manifest.write(str(folder))
    done = subprocess.run(["sha256sum", "-c", manifest.FILE], cwd=folder, capture_output=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_changed_missing_or_added_file_is_named(folder):
    manifest.write(str(folder))
    with open(folder / "model.safetensors", "r+b") as f:
        f.truncate(100)
    (folder / "dpnmt.json").unlink()
    (folder / "extra.bin").write_bytes(b"x")
    found = manifest.problems(str(folder))
    assert found == [
        "dpnmt.json: listed in SHA256SUMS but missing",
        "extra.bin: not listed in SHA256SUMS (added after the export)",
        "model.safetensors: its sha256 differs from SHA256SUMS's (changed or truncated after"
        " the export)",
    ]


def test_no_manifest_is_no_problem_and_a_garbled_one_is_refused(folder):
    assert manifest.read(str(folder)) is None
    assert manifest.problems(str(folder)) == []
    (folder / manifest.FILE).write_text("abc model.safetensors\n")
    with pytest.raises(ValueError, match="line 1"):
        manifest.problems(str(folder))


def test_a_marked_export_without_its_manifest_is_refused(folder):
    """`export_record.problem` passed a marked export whose SHA256SUMS was left out (a copy
    of the files but that one): every marked export has one, like its dpnmt.json."""
    from dpnmt.models import export_record  # noqa: PLC0415

    (folder / "config.json").write_text('{"model_type": "t5"}\n')
    assert export_record.problem(str(folder), "--model") is None  # Not marked: not an export.
    export_record.mark(str(folder))
    line = export_record.problem(str(folder), "--model")
    assert line is not None and "without its SHA256SUMS" in line and "\n" not in line
    manifest.write(str(folder))
    assert export_record.problem(str(folder), "--model") is None
