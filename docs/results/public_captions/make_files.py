r"""Multi30K's PUBLIC validation split cut in two, for a public in-domain stage (issue 27 lever).

    PYTHONPATH=. python docs/results/public_captions/make_files.py --out=$DPNMT_DATA_DIR

Writes two `files:` folders under --out (never into the repository):

  * `multi30k_val_a/`: half A of Multi30K's 1,014 validation pairs as its train
    split, half B as its validation and test splits: the data of a short
    non-private stage that shows the public model in-domain captions;
  * `multi30k_heldout/`: Multi30K's train and test splits (symbolic links to
    the originals: the private train split and the scored test are unchanged,
    N = 29,000) with half B as validation: the DP rows' held-out captions.

The cut: the first half of the validation pairs by line go to A, the rest to
B, except that a pair sharing a normalised sentence (`dpnmt.data.overlap.
normalised`, either side) with a pair of A joins A (B holds no sentence A
trained on), and a pair of A sharing one with the test split moves to B (the
stage never trains on a tested sentence). Validation is public, so neither
half spends privacy; the README must still say which public data the DP rows'
start saw.
"""

import argparse
import os

from dpnmt.data.overlap import normalised
from dpnmt.data.text_files import read_parallel_text

SIDES = ("de", "en")
STAGE_FOLDER = "multi30k_val_a"  # configs/public_de_en_captions.py's corpus.
HELDOUT_FOLDER = "multi30k_heldout"  # configs/multi30k_from_captions.py's corpus.


def read_pairs(folder: str, split: str) -> list[tuple[str, str]]:
    """(de, en) per line of `<split>.de` and `<split>.en` (line-aligned)."""
    paths = (os.path.join(folder, f"{split}.{language}") for language in SIDES)
    return read_parallel_text(*paths)


def _keys(pair: tuple[str, str]) -> set[tuple[str, str]]:
    return {(language, normalised(text)) for language, text in zip(SIDES, pair, strict=True)}


def cut(validation: list[tuple[str, str]], test: list[tuple[str, str]]) -> tuple[list, list]:
    """(half A, half B) of the validation pairs, by the module's rule, in line order."""
    tested = set().union(*map(_keys, test)) if test else set()
    first = set(range(len(validation) // 2))
    in_a = {i for i in first if not _keys(validation[i]) & tested}
    seen = set().union(*(_keys(validation[i]) for i in in_a)) if in_a else set()
    for i in range(len(validation)):
        if i not in in_a and i not in first and _keys(validation[i]) & seen:
            if not _keys(validation[i]) & tested:
                in_a.add(i)
    a = [validation[i] for i in sorted(in_a)]
    b = [validation[i] for i in range(len(validation)) if i not in in_a]
    return a, b


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
    repository = os.path.realpath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 3))
    if os.path.commonpath([repository, os.path.realpath(out)]) == repository:
        raise SystemExit(f"--out={out!r} lies inside the repository: data never go there.")
    a, b = cut(read_pairs(source, "validation"), read_pairs(source, "test"))
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
    stage, heldout = (os.path.join(args.out, f) for f in (STAGE_FOLDER, HELDOUT_FOLDER))
    print(f"{stage}: train {size_a} pairs (half A), validation and test {size_b} (half B)")
    print(f"{heldout}: train and test linked to {args.multi30k}, validation {size_b} (half B)")


if __name__ == "__main__":
    main()
