r"""Multi30K's PUBLIC validation split cut in two, for a public in-domain stage (issue 27 lever).

    PYTHONPATH=. python docs/results/public_captions/make_files.py --out=$DPNMT_DATA_DIR

Writes two `files:` folders under --out (never into the repository):

  * `multi30k_val_a/`: half A of Multi30K's 1,014 validation pairs as its train
    split, half B as its validation and test splits: the data of a short
    non-private stage that shows the public model in-domain captions;
  * `multi30k_heldout/`: Multi30K's train and test splits (symbolic links to
    the originals: the private train split and the scored test are unchanged,
    N = 29,000) with half B as validation: the DP rows' held-out captions.

The cut (`cut`): pairs linked by a shared normalised sentence
(`dpnmt.data.overlap.normalised`, either side, transitively) stay in one half;
a group goes to A when its first pair lies in the first half of the lines and
none of it shares a sentence with the test split, else to B. So B holds no
sentence A trained on and the stage never trains on a tested sentence
(`check` verifies both before anything is written). Train is deliberately
never read: a cut that looked at the private split would make the public
stage a function of private data. Multi30K's splits are disjoint as pairs by
construction (split by image), not by any check here; a stock caption may
still appear in both as text. Validation is public, so neither half spends
privacy; the README must still say which public data the DP rows' start saw.
"""

import argparse
import os
import sys

from dpnmt.data.overlap import normalised, sentence_groups
from dpnmt.data.text_files import read_parallel_text

SIDES = ("de", "en")
STAGE_FOLDER, HELDOUT_FOLDER = "multi30k_val_a", "multi30k_heldout"  # The configs read these.


def read_pairs(folder: str, split: str) -> list[tuple[str, str]]:
    """(de, en) per line of `<split>.de` and `<split>.en` (line-aligned)."""
    paths = (os.path.join(folder, f"{split}.{language}") for language in SIDES)
    return read_parallel_text(*paths)


def _keys(pair: tuple[str, str]) -> set[tuple[str, str]]:
    return {(language, normalised(text)) for language, text in zip(SIDES, pair, strict=True)}


def cut(validation: list[tuple[str, str]], test: list[tuple[str, str]]) -> tuple[list, list]:
    """(half A, half B) of the validation pairs, in line order.

    Pairs linked by a shared normalised sentence (transitively) form a group,
    kept in one half: A when the group's first pair lies in the first half of
    the lines and no pair of the group shares a sentence with test, else B.
    So B holds no sentence of A, and A none of test.
    """
    tested = set().union(*map(_keys, test)) if test else set()
    roots = sentence_groups(validation)
    touches_test = {roots[i] for i, pair in enumerate(validation) if _keys(pair) & tested}
    half = len(validation) // 2
    in_a = [roots[i] < half and roots[i] not in touches_test for i in range(len(validation))]
    a = [pair for pair, keep in zip(validation, in_a, strict=True) if keep]
    b = [pair for pair, keep in zip(validation, in_a, strict=True) if not keep]
    return a, b


def check(a: list, b: list, test: list) -> None:
    """Raises SystemExit if A shares a normalised sentence with B or with test."""
    keys_a = set().union(*map(_keys, a)) if a else set()
    for name, other in (("the held-out half", b), ("the test split", test)):
        shared = keys_a & (set().union(*map(_keys, other)) if other else set())
        if shared:
            raise SystemExit(f"half A shares {len(shared)} sentence(s) with {name}: a bug.")


def _write(folder: str, split: str, pairs: list[tuple[str, str]]) -> None:
    for k, language in enumerate(SIDES):
        with open(os.path.join(folder, f"{split}.{language}"), "w", encoding="utf-8") as f:
            f.writelines(pair[k] + "\n" for pair in pairs)


def _link(folder: str, split: str, source: str) -> None:
    for language in SIDES:
        target = os.path.join(folder, f"{split}.{language}")
        if os.path.lexists(target):
            os.remove(target)
        os.symlink(os.path.abspath(os.path.join(source, f"{split}.{language}")), target)


def make(source: str, out: str) -> tuple[int, int]:
    """Writes both folders under `out`; returns (|A|, |B|)."""
    repository = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 3))
    if os.path.commonpath([repository, os.path.abspath(out)]) == repository:
        raise SystemExit(f"--out={out!r} lies inside the repository: data never go there.")
    test = read_pairs(source, "test")
    a, b = cut(read_pairs(source, "validation"), test)
    check(a, b, test)
    if os.path.realpath(source).startswith(os.path.realpath(out) + os.sep):
        raise SystemExit(f"--multi30k={source!r} lies inside --out: give the original folder.")
    stage, heldout = os.path.join(out, STAGE_FOLDER), os.path.join(out, HELDOUT_FOLDER)
    for folder in (stage, heldout):
        os.makedirs(folder, exist_ok=True)
    _write(stage, "train", a)
    _write(stage, "validation", b)
    _write(stage, "test", b)
    _link(heldout, "train", source)
    _write(heldout, "validation", b)
    _link(heldout, "test", source)
    return len(a), len(b)


def main():
    """Reads Multi30K, writes the two folders."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = os.environ.get("DPNMT_DATA_DIR", ".")
    parser.add_argument("--multi30k", default=os.path.join(root, "multi30k"), help="its folder")
    parser.add_argument("--out", required=True, help="Where the two folders go (created).")
    args = parser.parse_args()
    size_a, size_b = make(args.multi30k, args.out)
    print(f"half A (the stage's train): {size_a} pairs; B (held out): {size_b}", file=sys.stderr)


if __name__ == "__main__":
    main()
