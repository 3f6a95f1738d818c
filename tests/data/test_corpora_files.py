"""Loaders on small files the tests write: formats, errors, direction, env var."""

import json

import pytest

from dpnmt.data import corpora
from dpnmt.errors import InputError

PAIRS = [("Guten Morgen .", "Good morning ."), ("Danke !", "Thanks !"), ("Ja", "Yes")]


def _write_tsv(path, rows, header="de\ten"):
    lines = ([header] if header is not None else []) + [f"{a}\t{b}" for a, b in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _write_parallel(folder, stem, rows):
    (folder / f"{stem}.de").write_text("".join(a + "\n" for a, _ in rows), encoding="utf-8")
    (folder / f"{stem}.en").write_text("".join(b + "\n" for _, b in rows), encoding="utf-8")


def _write_jsonl(path, rows, nested=False):
    records = [
        {"translation": {"de": a, "en": b}} if nested else {"de": a, "en": b} for a, b in rows
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def _pairs(split, pair=("de", "en")):
    return [(row[pair[0]], row[pair[1]]) for row in split["translation"]]


def test_tsv_folder_counts_pairs_and_swap(tmp_path):
    for split, rows in (("train", PAIRS), ("dev", PAIRS[:2]), ("test", PAIRS[:1])):
        _write_tsv(tmp_path / f"{split}.tsv", rows)
    corpus = corpora.load_corpus(f"files:{tmp_path}", "de-en")
    assert {k: len(v) for k, v in corpus.items()} == {"train": 3, "validation": 2, "test": 1}
    assert _pairs(corpus["train"]) == PAIRS
    swapped = corpora.load_corpus(f"files:{tmp_path}", "en-de")
    assert _pairs(swapped["train"], ("en", "de")) == [(b, a) for a, b in PAIRS]
    assert str(corpora.corpus_pair(swapped)) == "en-de"


def test_tsv_header_order_does_not_matter(tmp_path):
    for split in ("train", "validation", "test"):
        _write_tsv(tmp_path / f"{split}.tsv", [(b, a) for a, b in PAIRS], header="en\tde")
    corpus = corpora.load_files(str(tmp_path), "de-en")
    assert _pairs(corpus["test"]) == PAIRS


@pytest.mark.parametrize("nested", [False, True])
def test_jsonl_folder(tmp_path, nested):
    for split in ("train", "valid", "test"):
        _write_jsonl(tmp_path / f"{split}.jsonl", PAIRS, nested=nested)
    corpus = corpora.load_files(str(tmp_path), "en-de")
    assert _pairs(corpus["validation"], ("en", "de")) == [(b, a) for a, b in PAIRS]


def test_parallel_text_folder_keeps_alignment_with_odd_characters(tmp_path):
    rows = [("a\rb", "x"), ("c\u2028d", "y"), ("e", "z")]
    for split in ("train", "validation", "test"):
        _write_parallel(tmp_path, split, rows)
    corpus = corpora.load_files(str(tmp_path), "de-en")
    assert _pairs(corpus["train"]) == rows


def test_validation_carved_from_train_only_when_asked(tmp_path):
    rows = [(f"de {i}", f"en {i}") for i in range(10)]
    _write_parallel(tmp_path, "train", rows)
    _write_parallel(tmp_path, "test", rows[:2])
    with pytest.raises(FileNotFoundError, match="validation_size"):
        corpora.load_files(str(tmp_path), "de-en")
    corpus = corpora.load_files(str(tmp_path), "de-en", validation_size=3)
    assert _pairs(corpus["train"]) == rows[:7]
    assert _pairs(corpus["validation"]) == rows[7:]


def test_malformed_tsv_line_names_file_line_and_fix(tmp_path):
    _write_tsv(tmp_path / "train.tsv", PAIRS)
    _write_tsv(tmp_path / "validation.tsv", PAIRS)
    bad = tmp_path / "test.tsv"
    bad.write_text("de\ten\nA\tB\nC\tD\tE\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{bad}:3: expected 2 tab-separated fields.*found 3"):
        corpora.load_files(str(tmp_path), "de-en")


def test_tsv_without_header_says_to_add_one(tmp_path):
    path = tmp_path / "train.tsv"
    _write_tsv(path, PAIRS, header=None)
    with pytest.raises(ValueError, match=rf"{path}:1: the first line must name"):
        corpora.load_files(str(tmp_path), "de-en")


def test_malformed_jsonl_line_names_file_and_line(tmp_path):
    path = tmp_path / "train.jsonl"
    _write_jsonl(path, PAIRS)
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"de": "kaputt", "en": \n')
    with pytest.raises(ValueError, match=rf"{path}:4: not valid JSON"):
        corpora.load_files(str(tmp_path), "de-en")


def test_jsonl_record_missing_language_names_line(tmp_path):
    path = tmp_path / "train.jsonl"
    _write_jsonl(path, PAIRS)
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"de": "nur deutsch"}\n')
    with pytest.raises(ValueError, match=rf"{path}:4: record lacks key\(s\) \['en'\]"):
        corpora.load_files(str(tmp_path), "de-en")


def test_wrong_pair_lists_the_files_pair(tmp_path):
    for split in ("train", "validation", "test"):
        _write_tsv(tmp_path / f"{split}.tsv", PAIRS)
        _write_jsonl(tmp_path / f"{split}.jsonl", PAIRS)
    (tmp_path / "train.jsonl").unlink()
    with pytest.raises(ValueError, match="pair de-en"):
        corpora.load_files(str(tmp_path), "fr-en")


def test_wrong_pair_for_parallel_text_lists_languages(tmp_path):
    for split in ("train", "validation", "test"):
        _write_parallel(tmp_path, split, PAIRS)
    with pytest.raises(FileNotFoundError, match=r"languages \['de', 'en'\]"):
        corpora.load_files(str(tmp_path), "fr-en")


def test_mismatched_parallel_files_name_both(tmp_path):
    _write_parallel(tmp_path, "train", PAIRS)
    (tmp_path / "train.en").write_text("only one\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"train\.de has 3 lines but .*train\.en has 1"):
        corpora.load_files(str(tmp_path), "de-en")


def test_empty_split_is_an_error(tmp_path):
    _write_tsv(tmp_path / "train.tsv", PAIRS)
    _write_tsv(tmp_path / "validation.tsv", PAIRS)
    _write_tsv(tmp_path / "test.tsv", [])
    with pytest.raises(ValueError, match=r"test split is empty \(from .*test\.tsv\)"):
        corpora.load_files(str(tmp_path), "de-en")


def test_missing_folder_and_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        corpora.load_files(str(tmp_path / "nope"), "de-en")
    _write_tsv(tmp_path / "train.tsv", PAIRS)
    _write_tsv(tmp_path / "validation.tsv", PAIRS)
    with pytest.raises(FileNotFoundError, match=rf"No test file in {tmp_path}"):
        corpora.load_files(str(tmp_path), "de-en")


def test_several_formats_for_one_split_is_ambiguous(tmp_path):
    for split in ("train", "validation", "test"):
        _write_tsv(tmp_path / f"{split}.tsv", PAIRS)
    _write_jsonl(tmp_path / "train.jsonl", PAIRS)
    with pytest.raises(ValueError, match="keep one format"):
        corpora.load_files(str(tmp_path), "de-en")


def test_wmt16_reads_folder_under_env_root(tmp_path, monkeypatch):
    folder = tmp_path / "wmt_sample_de_en"
    folder.mkdir()
    rows = [(f"satz {i}", f"sentence {i}") for i in range(8)]
    _write_parallel(folder, "train", rows)
    _write_parallel(folder, "newstest", rows[:2])
    monkeypatch.setenv(corpora.DATA_DIR_ENV, str(tmp_path))
    corpus = corpora.load_wmt16("en-de", validation_size=2)
    assert _pairs(corpus["train"], ("en", "de")) == [(b, a) for a, b in rows[:6]]
    assert _pairs(corpus["validation"], ("en", "de")) == [(b, a) for a, b in rows[6:]]
    assert _pairs(corpus["test"], ("en", "de")) == [(b, a) for a, b in rows[:2]]


def test_bad_data_dirs(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        corpora.load_wmt16("de-en", data_dir=str(tmp_path / "missing"))
    monkeypatch.setenv(corpora.DATA_DIR_ENV, str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="DPNMT_DATA_DIR"):
        corpora.load_clinspen("es-en")


def test_bsd_json_error_names_file_and_line(tmp_path):
    for name in ("dev", "test"):
        (tmp_path / f"{name}.json").write_text('[\n  {"conversation": [}\n]\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"dev\.json:2: not valid JSON"):
        corpora.load_bsd("ja-en", data_dir=str(tmp_path), train_split="dev")


def test_hub_offline_gives_actionable_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="network"):
        corpora.load_corpus("hub:someone/some-translations", "de-en")


def test_hub_reads_a_saved_copy(tmp_path):
    local = corpora.make_corpus(
        corpora.parse_pair("en-de"),
        {s: [(b, a) for a, b in PAIRS] for s in corpora.SPLITS},
        {s: "memory" for s in corpora.SPLITS},
    )
    local.save_to_disk(str(tmp_path / "saved"))
    corpus = corpora.load_corpus("hub:local", "de-en", data_dir=str(tmp_path / "saved"))
    assert _pairs(corpus["test"]) == PAIRS
    with pytest.raises(ValueError, match=r"not the pair fr-en"):
        corpora.load_corpus("hub:local", "fr-en", data_dir=str(tmp_path / "saved"))


@pytest.mark.parametrize("pair", ["de", "de-de", "de-en-fr", ""])
def test_bad_pair_strings(pair):
    with pytest.raises(ValueError, match="'de-en'"):
        corpora.load_corpus("wmt16", pair)


def test_unknown_corpus_lists_known():
    with pytest.raises(ValueError, match="wmt16"):
        corpora.load_corpus("europarl", "de-en")


def test_invalid_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "train.de"
    path.write_bytes(b"gut\nauch gut\nkaputt \xff\n")
    (tmp_path / "train.en").write_text("good\nalso good\nbroken\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{path}:3: not valid UTF-8"):
        corpora.load_files(str(tmp_path), "de-en")


def test_registry_lists_each_loaders_options_and_refuses_others(tmp_path):
    assert corpora.accepted_options("clinspen") == ("data_dir",)
    assert corpora.accepted_options(f"files:{tmp_path}") == (
        "validation_size",
        "monolingual_language",
    )
    assert set(corpora.accepted_options("bsd")) == {"data_dir", "train_split", "validation_size"}
    # Refused before any file is read (the folder does not even exist).
    with pytest.raises(InputError, match=r"does not take \['validation_size'\].*\['data_dir'\]"):
        corpora.load_corpus("clinspen", "es-en", validation_size=3, data_dir=str(tmp_path / "x"))


def test_unknown_corpus_suggests_the_closest_name():
    with pytest.raises(InputError, match="did you mean 'wmt16'"):
        corpora.load_corpus("wmt61", "de-en")


def test_hub_fallback_names_the_data_dir_variable_and_what_it_holds(tmp_path, monkeypatch):
    (tmp_path / "bsd_ja_en").mkdir()
    monkeypatch.setenv(corpora.DATA_DIR_ENV, str(tmp_path))  # Has no WMT folder.
    with pytest.raises(InputError) as error:
        corpora.load_corpus("wmt16", "de-en")  # The hub is offline in tests.
    message = str(error.value)
    assert f"$DPNMT_DATA_DIR={tmp_path} holds ['bsd_ja_en']" in message
    assert "wmt16_de_en or wmt_sample_de_en" in message


def test_relative_folder_is_read_under_the_data_root(tmp_path, monkeypatch):
    root = tmp_path / "root"
    (root / "mine").mkdir(parents=True)
    for split in ("train", "validation", "test"):
        _write_parallel(root / "mine", split, [("ein hund", "a dog"), ("eine katze", "a cat")])
    monkeypatch.chdir(tmp_path)  # No ./mine here.
    monkeypatch.setenv(corpora.DATA_DIR_ENV, str(root))
    corpus = corpora.load_corpus("files:mine", "de-en")
    assert corpus["train"].num_rows == 2
    monkeypatch.delenv(corpora.DATA_DIR_ENV)
    with pytest.raises(InputError, match="under \\$DPNMT_DATA_DIR"):
        corpora.load_corpus("files:mine", "de-en")
