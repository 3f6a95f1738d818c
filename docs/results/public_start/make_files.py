r"""The public in-domain captions of the shipped public start (issue 58), as a `files:` folder.

    PYTHONPATH=. python docs/results/public_start/make_files.py --out=$DPNMT_DATA_DIR

Writes `captions_public/` under --out (never into the repository) and, like
docs/results/public_captions/make_files.py (whose cut it reuses), the DP
rows' `multi30k_heldout/`:

  * train: Multi30K's later test sets (`multi30k_tests_2017_2018`: 2017
    Flickr, 2017 MSCOCO, 2018 Flickr; images not in Multi30K) plus half A of
    Multi30K's validation split; pairs sharing a normalised sentence (either
    side) with test 2016 or with half B are left out and counted;
  * validation and test: half B of Multi30K's validation split (507 pairs),
    the public in-domain captions every choice of the public start is made on.

All of it is PUBLIC. Multi30K's train split (the private corpus) is never
read. Test 2016 is read only to keep its sentences out of the public stage's
train (a guard, no choice is made on it).
"""

import argparse
import importlib.util
import os
import sys

from dpnmt.data.overlap import normalised

FOLDER = "captions_public"  # configs/public_start.py reads this.
LATER_TESTS = ("test_2017_flickr", "test_2017_mscoco", "test_2018_flickr")


def _captions_cut():
    path = os.path.join(os.path.dirname(__file__), os.pardir, "public_captions", "make_files.py")
    spec = importlib.util.spec_from_file_location("public_captions_make_files", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _keys(pair: tuple[str, str]) -> set[tuple[int, str]]:
    return {(side, normalised(text)) for side, text in enumerate(pair)}


def later_tests(folder: str) -> list[tuple[str, str]]:
    """(de, en) pairs of the three later test sets, in file order."""
    cut = _captions_cut()
    return [pair for name in LATER_TESTS for pair in cut.read_pairs(folder, name)]


def train_pairs(later, half_a, held_out):
    """(later + half A minus pairs sharing a sentence with `held_out`, number left out)."""
    banned = set().union(*map(_keys, held_out))
    kept = [pair for pair in later + half_a if not _keys(pair) & banned]
    return kept, len(later) + len(half_a) - len(kept)


def make(multi30k: str, later_folder: str, out: str) -> tuple[int, int, int]:
    """Writes the folders under `out`; returns (train pairs, left out, validation pairs)."""
    cut = _captions_cut()
    repository = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 3))
    if os.path.commonpath([repository, os.path.abspath(out)]) == repository:
        raise SystemExit(f"--out={out!r} lies inside the repository: data never go there.")
    test = cut.read_pairs(multi30k, "test")
    half_a, half_b = cut.cut(cut.read_pairs(multi30k, "validation"), test)
    cut.check(half_a, half_b, test)
    train, left_out = train_pairs(later_tests(later_folder), half_a, test + half_b)
    folder = os.path.join(out, FOLDER)
    os.makedirs(folder, exist_ok=True)
    cut._write(folder, "train", train)
    cut._write(folder, "validation", half_b)
    cut._write(folder, "test", half_b)
    cut.make(multi30k, out)  # multi30k_heldout/ (and multi30k_val_a/), as before.
    return len(train), left_out, len(half_b)


def main():
    """Reads the public captions, writes the folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = os.environ.get("DPNMT_DATA_DIR", ".")
    parser.add_argument("--multi30k", default=os.path.join(root, "multi30k"), help="its folder")
    parser.add_argument(
        "--later", default=os.path.join(root, "multi30k_tests_2017_2018"), help="its folder"
    )
    parser.add_argument("--out", required=True, help="Where the folders go (created).")
    args = parser.parse_args()
    train, left_out, validation = make(args.multi30k, args.later, args.out)
    print(
        f"{FOLDER}: train {train} public captions ({left_out} left out: a sentence shared with"
        f" test 2016 or half B); validation/test {validation} (half B)",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
