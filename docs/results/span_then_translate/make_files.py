r"""Multi30K de-en's train split cut into two disjoint halves, for configs/span_then_translate.py.

    PYTHONPATH=. python docs/results/span_then_translate/make_files.py --out=$DPNMT_DATA_DIR

Writes two `files:` folders under --out (never into the repository):

  * `multi30k_half_a/`: half A of the 29,000 train pairs (train.de, train.en),
    the PRIVATE parallel data of the DP fine-tuning stage;
  * `multi30k_half_b/`: half B (train.de, train.en), whose German side alone is
    the PRIVATE in-domain monolingual text of the DP pre-training stage (the
    objective reads `data.objective_language`'s side only). Its English side is
    written too so that the stage-composition check can compare B's whole text
    with A's (`corpus_record.same_text_problems`: a declared-disjoint export
    whose recorded corpus shares text with the run's is refused).

Both get Multi30K's validation and test splits (public, scored) unchanged.
The cut: pair i goes to A when i is even, to B when odd, except that pairs
sharing a normalised sentence (either side, `dpnmt.data.overlap.normalised`:
case, spacing, escapes) are kept together, in the half of the first of them.
So no sentence of one half appears in the other (Multi30K repeats some
captions), and a person's caption is in one half only: parallel composition
(`model.pretrained_data_disjoint=True`) holds for A and B as two given
datasets. Not for Multi30K's training split as one private corpus: the cut
looks at other records (adding or removing one pair can move others between
halves), so the split itself is not a DP release.
"""

import argparse
import os
import shutil
import sys

from dpnmt.data.overlap import sentence_groups

SIDES = ("de", "en")


def read_pairs(folder: str, split: str) -> list[tuple[str, str]]:
    """(de, en) per line of `<split>.de` and `<split>.en` (line-aligned)."""
    sides = []
    for language in SIDES:
        with open(os.path.join(folder, f"{split}.{language}"), encoding="utf-8") as f:
            sides.append(f.read().splitlines())
    if len(sides[0]) != len(sides[1]):
        raise ValueError(f"{folder}/{split}.de and .en differ in length.")
    return list(zip(*sides, strict=True))


def halves(pairs: list[tuple[str, str]]) -> tuple[list[int], list[int]]:
    """(indices of half A, of half B): even/odd, pairs sharing a normalised sentence together."""
    roots = sentence_groups(pairs)
    a = [i for i in range(len(pairs)) if roots[i] % 2 == 0]
    b = [i for i in range(len(pairs)) if roots[i] % 2 == 1]
    return a, b


def write(folder: str, pairs: list[tuple[str, str]], source: str) -> None:
    """train.{de,en} from `pairs`; validation and test copied from `source`."""
    os.makedirs(folder, exist_ok=True)
    for k, language in enumerate(SIDES):
        with open(os.path.join(folder, f"train.{language}"), "w", encoding="utf-8") as f:
            f.writelines(pair[k] + "\n" for pair in pairs)
        for split in ("validation", "test"):
            name = f"{split}.{language}"
            shutil.copyfile(os.path.join(source, name), os.path.join(folder, name))


def make(source: str, out: str) -> tuple[int, int]:
    """Writes both folders under `out`; returns (|A|, |B|)."""
    pairs = read_pairs(source, "train")
    a, b = halves(pairs)
    write(os.path.join(out, "multi30k_half_a"), [pairs[i] for i in a], source)
    write(os.path.join(out, "multi30k_half_b"), [pairs[i] for i in b], source)
    return len(a), len(b)


def main():
    """Reads Multi30K, writes the two halves."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = os.environ.get("DPNMT_DATA_DIR", ".")
    parser.add_argument("--multi30k", default=os.path.join(root, "multi30k"), help="train.de/en")
    parser.add_argument("--out", required=True, help="Where the two folders go (created).")
    args = parser.parse_args()
    size_a, size_b = make(args.multi30k, args.out)
    print(f"half A: {size_a} pairs, half B: {size_b} pairs", file=sys.stderr)


if __name__ == "__main__":
    main()
