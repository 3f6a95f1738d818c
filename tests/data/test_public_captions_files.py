"""docs/results/public_captions/make_files.py: Multi30K's public validation cut in two."""

import os
import pathlib

import pytest

from dpnmt.data.overlap import normalised
from tests.small_configs import config_module

ROOT = pathlib.Path(__file__).resolve().parents[2]
MAKE_FILES = ROOT / "docs" / "results" / "public_captions" / "make_files.py"


def _module():
    return config_module(MAKE_FILES)  # Any .py file, freshly executed.


def _corpus(folder, splits):
    folder.mkdir()
    for split, pairs in splits.items():
        for k, language in enumerate(("de", "en")):
            (folder / f"{split}.{language}").write_text("".join(p[k] + "\n" for p in pairs))


def test_halves_share_no_sentence_and_a_never_trains_on_a_tested_one(tmp_path):
    validation = [(f"de {i}", f"en {i}") for i in range(8)]
    validation[5] = ("DE 1", "other")  # Shares (normalised) its German with A's pair 1: joins A.
    validation[2] = ("de 2", "tested")  # Its English is in test: moves to B.
    test = [("x", "Tested"), ("y", "z")]
    source = tmp_path / "multi30k"
    _corpus(source, {"train": [("t", "u")] * 3, "validation": validation, "test": test})
    size_a, size_b = _module().make(str(source), str(tmp_path / "out"))
    stage, heldout = tmp_path / "out" / "multi30k_val_a", tmp_path / "out" / "multi30k_heldout"
    a = (stage / "train.de").read_text().splitlines()
    b = (heldout / "validation.de").read_text().splitlines()
    assert a == ["de 0", "de 1", "de 3", "DE 1"] and (size_a, size_b) == (4, 4)
    assert b == ["de 2", "de 4", "de 6", "de 7"]
    assert not {normalised(s) for s in a} & {normalised(s) for s in b}
    assert (stage / "validation.de").read_text() == (heldout / "validation.de").read_text()
    assert (stage / "test.en").read_text() == (heldout / "validation.en").read_text()
    for split in ("train", "test"):  # The private train split and the scored test: linked.
        assert os.path.islink(heldout / f"{split}.de")
        assert (heldout / f"{split}.de").read_text() == (source / f"{split}.de").read_text()


def test_out_inside_the_repository_is_refused(tmp_path):
    source = tmp_path / "multi30k"
    _corpus(source, {"validation": [("a", "b")] * 2, "test": [("c", "d")]})
    inside = ROOT / "never_written_by_this_test"
    with pytest.raises(SystemExit, match="inside the repository"):
        _module().make(str(source), str(inside))
    assert not inside.exists()


def test_distinct_pairs_are_cut_into_exact_halves_and_train_is_only_linked(tmp_path):
    """Multi30K's case (no sentence shared): A = the first half by line, B = the rest."""
    validation = [(f"de {i}", f"en {i}") for i in range(6)]
    source = tmp_path / "multi30k"
    _corpus(source, {"train": [("t", "u"), ("v", "w")], "validation": validation, "test": []})
    before = {p.name: p.read_bytes() for p in source.iterdir()}
    module = _module()
    assert module.make(str(source), str(tmp_path / "out")) == (3, 3)
    stage = tmp_path / "out" / module.STAGE_FOLDER
    heldout = tmp_path / "out" / module.HELDOUT_FOLDER
    for language, k in (("de", 0), ("en", 1)):
        assert (stage / f"train.{language}").read_text().splitlines() == [
            p[k] for p in validation[:3]
        ]
        b = (heldout / f"validation.{language}").read_text().splitlines()
        assert b == [p[k] for p in validation[3:]]
        assert (stage / f"validation.{language}").read_text().splitlines() == b
        assert (stage / f"test.{language}").read_text().splitlines() == b
        link = heldout / f"train.{language}"
        assert os.path.islink(link) and os.path.samefile(link, source / f"train.{language}")
    assert {p.name: p.read_bytes() for p in source.iterdir()} == before  # Source untouched.
