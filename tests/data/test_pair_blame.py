"""A wrong `data.pair` is blamed on the user's own files, not on the vocabulary's corpora.

configs/files.py learns its vocabulary from public de-en text; a pair the user's
folder lacks (fr-en on a de/en folder, an unknown code) is one problem naming
that folder and the languages it holds. A pair the folder has but the public
text lacks is one problem naming the vocabulary and the fixes, not WMT16's pairs.
"""

import pytest

from dpnmt.config import RunConfig
from dpnmt.data.corpora import files
from dpnmt.data.languages import parse_pair
from dpnmt.training import preflight
from tests.small_configs import load_config

ROWS = [("Ein Hund läuft.", "A dog runs.", "Un chien court.")] * 12


def _folder(path, languages, kind):
    """A train/validation/test folder of `languages` as parallel text files or TSV."""
    path.mkdir()
    for split in ("train", "validation", "test"):
        columns = {lang: [row[i] for row in ROWS] for i, lang in enumerate(("de", "en", "fr"))}
        if kind == "text":
            for lang in languages:
                (path / f"{split}.{lang}").write_text("\n".join(columns[lang]) + "\n")
        else:
            lines = ["\t".join(languages)] + [
                "\t".join(columns[lang][i] for lang in languages) for i in range(len(ROWS))
            ]
            (path / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    return path


def _problems(tmp_path, private_languages, kind, pair):
    private = _folder(tmp_path / "mine", private_languages, kind)
    public = _folder(tmp_path / "public_de_en", ("de", "en"), "tsv")
    c = load_config("files")
    c.data.corpus, c.data.pair = f"files:{private}", pair
    c.tokenizer.public_corpora = f"files:{public},detok:wmt16"  # As configs/multi30k.py's.
    return preflight.config_problems(RunConfig.of(c), device_count=8)


@pytest.mark.parametrize("kind", ["text", "tsv"])
@pytest.mark.parametrize(("pair", "missing"), [("fr-en", "fr"), ("xx-en", "xx"), ("en-fr", "fr")])
def test_a_pair_the_folder_lacks_is_one_problem_naming_the_folder(tmp_path, kind, pair, missing):
    (problem,) = _problems(tmp_path, ("de", "en"), kind, pair)
    assert problem.startswith(f"data.pair={pair!r}: "), problem
    assert str(tmp_path / "mine") in problem and "de and en" in problem, problem
    assert f"no {missing}" in problem and "de-en" in problem, problem  # The pair it could be.
    assert "wmt16" not in problem and "public" not in problem


@pytest.mark.parametrize("kind", ["text", "tsv"])
def test_a_pair_the_public_text_lacks_names_the_vocabulary_and_its_fixes(tmp_path, kind):
    (problem,) = _problems(tmp_path, ("fr", "en"), kind, "fr-en")
    assert problem.startswith("tokenizer.public_corpora="), problem
    assert "has no fr-en text" in problem and "de-en" in problem, problem
    for fix in ("tokenizer.public_text_paths", "model.name_or_path", "dp_sentencepiece"):
        assert fix in problem, problem
    assert "pick that pair (data.pair)" not in problem and "ro-en" not in problem, problem


def test_the_right_pair_has_no_problem(tmp_path):
    assert _problems(tmp_path, ("de", "en"), "text", "en-de") == []


def test_a_headerless_tsv_is_never_quoted_in_the_pair_problem(tmp_path):
    """Its first line is a private pair, not a header: the problem names no text of it."""
    folder = tmp_path / "clinic"
    folder.mkdir()
    pair_text = "Patient Maria Schmidt hat Diabetes .\tPatient Maria Schmidt has diabetes ."
    (folder / "train.tsv").write_text(pair_text + "\nein Hund\ta dog\n", encoding="utf-8")
    assert files.folder_languages(str(folder)) == []
    problem = files.pair_problem(str(folder), parse_pair("de-en")) or ""
    assert "Schmidt" not in problem and "Diabetes" not in problem
