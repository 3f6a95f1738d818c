"""No public stage reads the private corpus, and none uses test 2016 (issue 58).

A public stage (a config built by `config_lib.public_stage_config`) trains
non-privately; its model is later the start of DP runs on Multi30K, whose
train split is the private corpus and whose test 2016 split scores them.
Checked here for every such config, with the data folders its docstrings'
scripts make (into a temporary data root, as a user would):

  * no file of a `files:` corpus it names (data.corpus and the public
    vocabulary's corpora) is Multi30K's train or test file (real paths, so a
    symbolic link counts);
  * no split of those corpora holds a sentence of test 2016 (normalised as
    `dpnmt.data.overlap` compares: case, spaces, escapes).
"""

import functools
import importlib.util
import os
import pathlib

import pytest

from dpnmt.data.corpora.files import resolve_folder
from dpnmt.data.corpora.mixture import load_one, parse_corpus_names
from dpnmt.data.overlap import normalised
from tests.markers import needs_data
from tests.small_configs import CONFIG_DIR, load_config

PUBLIC_STAGES = sorted(
    path.stem for path in CONFIG_DIR.glob("*.py") if "public_stage_config(" in path.read_text()
)
SCRIPTS = ("public_captions", "public_start")  # docs/results/<name>/make_files.py
REPOSITORY = pathlib.Path(__file__).resolve().parents[2]


def test_the_public_stages_are_found():
    assert {"public_de_en", "public_start", "public_de_en_captions"} <= set(PUBLIC_STAGES)


def _script(name: str):
    path = REPOSITORY / "docs" / "results" / name / "make_files.py"
    spec = importlib.util.spec_from_file_location(f"make_files_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    """The shared corpora (linked) plus the folders the public stages' scripts make."""
    shared = pathlib.Path(os.environ["DPNMT_DATA_DIR"]).resolve()
    root = tmp_path_factory.mktemp("data")
    for folder in shared.iterdir():
        (root / folder.name).symlink_to(folder)
    _script("public_start").make(
        str(shared / "multi30k"), str(shared / "multi30k_tests_2017_2018"), str(root)
    )
    return root


def _corpora(config) -> list[str]:
    names = [entry.name for entry in parse_corpus_names(config.data.corpus)]
    if config.tokenizer.public_corpora:  # A learnt public vocabulary's own corpora.
        names += [entry.name for entry in parse_corpus_names(config.tokenizer.public_corpora)]
    return sorted(set(names))


def leaks(names: list[str], pair: str, multi30k: pathlib.Path) -> list[str]:
    """What of corpora `names` is Multi30K's train or test file, or holds a test 2016 sentence."""
    guarded = {
        (multi30k / f"{split}.{language}").resolve()
        for split in ("train", "test")
        for language in ("de", "en", "fr", "cs")
    }
    test_2016 = {
        normalised(line)
        for language in ("de", "en")
        for line in (multi30k / f"test.{language}").read_text(encoding="utf-8").splitlines()
    }
    found = []
    for name in names:
        entry = parse_corpus_names(name)[0]
        if entry.registry_name.startswith("files:"):
            folder = pathlib.Path(resolve_folder(entry.registry_name[len("files:") :]))
            read = {path.resolve() for path in folder.iterdir()} & guarded
            found += [f"{name} reads {path}" for path in sorted(read)]
        for split, texts in _normalised_texts(name, pair, os.environ["DPNMT_DATA_DIR"]).items():
            found += [f"{name} {split} holds test 2016's {text!r}" for text in texts & test_2016]
    return found


@functools.cache
def _normalised_texts(name: str, pair: str, data_dir: str) -> dict[str, frozenset[str]]:
    """Split -> the normalised sentences of corpus `name` (read under `data_dir`, once)."""
    del data_dir  # A key only: the loaders read $DPNMT_DATA_DIR.
    corpus = load_one(parse_corpus_names(name)[0], pair)
    return {
        split: frozenset(normalised(text) for row in rows["translation"] for text in row.values())
        for split, rows in corpus.items()
    }


@needs_data
@pytest.mark.parametrize("stage", PUBLIC_STAGES)
def test_public_stage_reads_no_private_file_and_no_test_2016(stage, data_root, monkeypatch):
    monkeypatch.setenv("DPNMT_DATA_DIR", str(data_root))
    config = load_config(stage)
    assert leaks(_corpora(config), config.data.pair, data_root / "multi30k") == []


@needs_data
def test_the_check_finds_a_private_link_and_a_test_sentence(data_root, monkeypatch):
    """`leaks` can fail: a folder linking Multi30K's train, a split holding a test caption."""
    monkeypatch.setenv("DPNMT_DATA_DIR", str(data_root))
    multi30k = data_root / "multi30k"
    leaky = data_root / "leaky"
    leaky.mkdir()
    for language in ("de", "en"):
        (leaky / f"train.{language}").symlink_to(multi30k / f"train.{language}")
        lines = (multi30k / f"validation.{language}").read_text(encoding="utf-8").splitlines()
        test = (multi30k / f"test.{language}").read_text(encoding="utf-8").splitlines()
        (leaky / f"validation.{language}").write_text("\n".join(lines[:5]) + "\n")
        (leaky / f"test.{language}").write_text(test[3].upper() + "\n")
    found = leaks(["files:leaky"], "de-en", multi30k)
    assert any("reads" in line and "train.de" in line for line in found)
    assert any(line.startswith("files:leaky test holds test 2016") for line in found)
    assert leaks(["files:captions_public"], "de-en", multi30k) == []


def test_the_captions_script_leaves_out_a_held_out_sentence():
    later = _script("public_start")
    pairs = [("ein Hund", "A dog ."), ("eine Katze", "a cat")]
    kept, left_out = later.train_pairs(pairs, [], [("x", "A CAT")])
    assert (kept, left_out) == ([("ein Hund", "A dog .")], 1)
