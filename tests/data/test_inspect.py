"""The inspect app prints sizes, percentiles, counts and examples."""

import re

from absl import flags
from absl.testing import flagsaver

from dpnmt.data import inspect as inspect_app


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
