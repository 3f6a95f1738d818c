"""Groups (privacy units) in the data: read from every format that names them, kept or refused."""

import json
import os

import pytest

from dpnmt.auditing.run import add_pairs_to_train
from dpnmt.data import corpora, groups
from dpnmt.errors import InputError

ROWS = [
    ("Guten Morgen .", "Good morning .", "u1"),
    ("Danke !", "Thanks !", "u1"),
    ("Ja", "Yes", "u2"),
]


def _tsv(path, rows, header="de\ten\tgroup"):
    path.write_text("\n".join([header] + ["\t".join(r) for r in rows]) + "\n", encoding="utf-8")


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def _folder(tmp_path, write):
    for split in ("train", "validation", "test"):
        write(tmp_path, split)
    return corpora.load_corpus(f"files:{tmp_path}", "de-en")


def test_a_tsv_group_column_becomes_each_pair_s_group_in_any_position(tmp_path):
    def write(folder, split):
        _tsv(folder / f"{split}.tsv", [(g, e, d) for d, e, g in ROWS], header="group\ten\tde")

    train = _folder(tmp_path, write)["train"]
    assert train["group"] == ["u1", "u1", "u2"]
    assert [(r["de"], r["en"]) for r in train["translation"]] == [r[:2] for r in ROWS]
    assert groups.summarize(train) == groups.GroupSizes(groups=2, smallest=1, median=1.5, largest=2)


def test_jsonl_groups_may_be_integers_and_sit_beside_a_nested_translation(tmp_path):
    def write(folder, split):
        _jsonl(
            folder / f"{split}.jsonl",
            [
                {"translation": {"de": d, "en": e}, "group": 7 if g == "u1" else "x"}
                for d, e, g in ROWS
            ],
        )

    assert _folder(tmp_path, write)["train"]["group"] == ["7", "7", "x"]


def test_a_corpus_without_groups_has_no_group_column(tmp_path):
    def write(folder, split):
        _tsv(folder / f"{split}.tsv", [r[:2] for r in ROWS], header="de\ten")

    train = _folder(tmp_path, write)["train"]
    assert "group" not in train.column_names and groups.summarize(train) is None


@pytest.mark.parametrize(
    "records, message",
    [
        ([{"de": "a", "en": "b", "group": "u"}, {"de": "c", "en": "d"}], "every line a group"),
        ([{"de": "a", "en": "b"}, {"de": "c", "en": "d", "group": "u"}], "every line a group"),
        ([{"de": "a", "en": "b", "group": ""}], "non-empty"),
        ([{"de": "a", "en": "b", "group": [1]}], "non-empty"),
        ([{"de": "a", "en": "b", "group": True}], "non-empty"),
    ],
)
def test_jsonl_groups_on_some_lines_or_malformed_are_refused_with_the_line(
    tmp_path, records, message
):
    _jsonl(tmp_path / "train.jsonl", records)
    _jsonl(tmp_path / "validation.jsonl", records)
    _jsonl(tmp_path / "test.jsonl", records)
    with pytest.raises(InputError, match=message) as error:
        corpora.load_corpus(f"files:{tmp_path}", "de-en")
    assert "train.jsonl:" in str(error.value)


def test_a_tsv_line_without_its_group_or_with_an_empty_one_is_refused(tmp_path):
    for line, message in (("Ja\tYes", "expected 3 tab-separated fields"), ("Ja\tYes\t ", "empty")):
        (tmp_path / "train.tsv").write_text(f"de\ten\tgroup\nA\tB\tu\n{line}\n", encoding="utf-8")
        _tsv(tmp_path / "validation.tsv", ROWS)
        _tsv(tmp_path / "test.tsv", ROWS)
        with pytest.raises(InputError, match=message):
            corpora.load_corpus(f"files:{tmp_path}", "de-en")


def test_a_mixture_drops_groups_and_a_detokenised_corpus_keeps_them(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        for split in ("train", "validation", "test"):
            _tsv(tmp_path / name / f"{split}.tsv", ROWS)
    mixed = corpora.load_corpora(f"files:{tmp_path / 'a'},files:{tmp_path / 'b'}", "de-en")
    assert "group" not in mixed["train"].column_names
    detok = corpora.load_corpora(f"detok:files:{tmp_path / 'a'}", "de-en")
    assert detok["train"]["group"] == ["u1", "u1", "u2"]


def test_canaries_added_to_a_grouped_train_split_are_groups_of_their_own(tmp_path):
    for split in ("train", "validation", "test"):
        _tsv(tmp_path / f"{split}.tsv", [*ROWS, ("x", "y", "dpnmt-canary-0")])
    corpus = corpora.load_corpus(f"files:{tmp_path}", "de-en")
    train = add_pairs_to_train([("c1", "d1"), ("c2", "d2")], "de-en")(corpus)["train"]
    added = train["group"][-2:]
    assert len(set(added)) == 2 and not set(added) & set(train["group"][:-2])


@pytest.mark.skipif(
    not os.path.isdir(os.path.join(os.environ.get("DPNMT_DATA_DIR", ""), "clinspen_es_en")),
    reason="needs $DPNMT_DATA_DIR/clinspen_es_en (../shared/data)",
)
def test_clinspen_s_groups_are_its_case_reports_and_bsd_s_its_dialogues():
    clinspen = groups.summarize(corpora.load_corpus("clinspen", "es-en")["train"])
    assert (clinspen.groups, clinspen.largest) == (42, 55)
    bsd = corpora.load_corpus("bsd", "ja-en", train_split="dev", validation_size=1)
    sizes = groups.summarize(bsd["test"])
    assert (sizes.groups, sizes.largest) == (69, 40)
