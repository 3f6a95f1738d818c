"""The inspect app prints sizes, percentiles, counts and examples."""

import pathlib
import re
import sys

from absl import flags
from absl.testing import flagsaver

from dpnmt.data import inspect as inspect_app

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"


def test_inspect_prints_summary(tmp_path, spm_tokenizer, capsys):
    rows = [("Guten Morgen", "Good morning"), ("", "Empty source"), ("Ja", "Yes")]
    for split in ("train", "validation", "test"):
        (tmp_path / f"{split}.tsv").write_text(
            "de\ten\n" + "".join(f"{a}\t{b}\n" for a, b in rows), encoding="utf-8"
        )
    model = tmp_path / "m.model"
    spm_tokenizer.save(str(model))
    argv = [
        "inspect",
        f"--corpus=files:{tmp_path}",
        "--pair=de-en",
        f"--tokenizer=spm:{model}",
        "--family=t5",
        "--max_source_length=4",
    ]
    with flagsaver.flagsaver():
        flags.FLAGS.unparse_flags()
        flags.FLAGS(argv)
        inspect_app.main(["inspect"])
    out = capsys.readouterr().out
    assert re.search(r"train +3 pairs", out)
    assert "kept 2/3, dropped 1 (empty source 1, empty target 0)" in out
    assert "truncated source 2" in out  # the T5 prefix alone exceeds 4 ids
    assert "source tokens before truncation: p50=" in out
    assert "translate German to English:" in out


def test_inspect_takes_the_config_like_every_app(tmp_path, spm_tokenizer, capsys, monkeypatch):
    rows = [(f"Satz {i}", f"Sentence {i}") for i in range(6)]
    (tmp_path / "train.tsv").write_text(
        "en\tde\n" + "".join(f"{b}\t{a}\n" for a, b in rows), encoding="utf-8"
    )  # Either column order; no validation file: carved by data.validation_size.
    (tmp_path / "test.tsv").write_text("de\ten\nJa\tYes\n", encoding="utf-8")
    model = tmp_path / "m.model"
    spm_tokenizer.save(str(model))
    argv = [
        "inspect",
        f"--config={CONFIGS}/files.py",
        f"--config.data.corpus=files:{tmp_path}",
        "--config.data.validation_size=2",
        f"--tokenizer=spm:{model}",
        "--max_source_length=3",  # A plain flag overrides the config.
    ]
    monkeypatch.setattr(sys, "argv", argv)  # config_flags reads the overrides from it.
    with flagsaver.flagsaver():
        flags.FLAGS.unparse_flags()
        flags.FLAGS(argv)
        inspect_app.main(["inspect"])
    out = capsys.readouterr().out
    assert re.search(r"train +4 pairs", out) and re.search(r"validation +2 pairs", out)
    assert "kept 4/4" in out
    assert "truncated source 4" in out  # Only with the flag's 3, not the config's 64.


def test_inspect_without_a_tokenizer_counts_pairs_with_an_empty_side(tmp_path, capsys):
    rows = [("Guten Morgen", "Good morning"), ("", "Empty source"), ("Ja", " "), ("Nein", "No")]
    for split in ("train", "validation", "test"):
        (tmp_path / f"{split}.tsv").write_text(
            "de\ten\n" + "".join(f"{a}\t{b}\n" for a, b in rows), encoding="utf-8"
        )
    with flagsaver.flagsaver():
        flags.FLAGS.unparse_flags()
        flags.FLAGS(["inspect", f"--corpus=files:{tmp_path}", "--pair=de-en"])
        inspect_app.main(["inspect"])
    out = capsys.readouterr().out
    assert re.search(r"train +4 pairs, 2 with an empty side \(dropped\)", out), out
