"""`dpnmt.atomic_file`: whole files and folders or none, and a file created once."""

import os
import threading

import pytest

from dpnmt import atomic_file


def test_write_atomic_replaces_a_file_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "a.json"
    atomic_file.write_atomic(str(path), "old")
    atomic_file.write_atomic(str(path), "new")
    assert path.read_text() == "new"
    assert os.listdir(tmp_path) == ["a.json"]


def test_create_exclusive_lets_exactly_one_of_many_concurrent_writers_win(tmp_path):
    for trial in range(20):
        path = str(tmp_path / f"seed{trial}")
        start, won = threading.Barrier(8), []

        def create(value, path=path, start=start, won=won):
            start.wait()
            if atomic_file.create_exclusive(path, str(value) * 50):
                won.append(value)

        threads = [threading.Thread(target=create, args=(v,)) for v in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        (winner,) = won  # One creator; the others read what it wrote, never half of it.
        assert open(path).read() == str(winner) * 50
    assert all(not name.startswith(atomic_file.TEMPORARY_PREFIX) for name in os.listdir(tmp_path))


def test_a_folder_appears_whole_or_not_at_all(tmp_path):
    out = tmp_path / "model"
    with pytest.raises(RuntimeError), atomic_file.folder_built_beside(str(out)) as building:
        open(os.path.join(building, "weights"), "w").write("w")
        raise RuntimeError("killed half way")
    assert os.listdir(tmp_path) == []  # Neither the folder nor its temporary.
    out.mkdir()  # An empty folder given as --out is replaced.
    with atomic_file.folder_built_beside(str(out)) as building:
        assert not out.joinpath("weights").exists()
        open(os.path.join(building, "weights"), "w").write("w")
    assert os.listdir(out) == ["weights"] and os.listdir(tmp_path) == ["model"]
