r"""BSD ja-en as a `files:` folder with whole dialogues as groups, for dp.unit=group.

    python docs/results/groups_bsd/make_files.py --out=$DATA/bsd_groups

The shared offline BSD copy has no train.json: runs train on dev.json and
carve validation off its end pair by pair, which `dp.unit=group` refuses
(part of a dialogue would sit in the unnoised validation split). This writes
train.tsv = all of dev.json (2,051 turns, 69 dialogues: the private split),
validation.tsv = the first 7 dialogues of test.json and test.tsv = its other
62 (public, scored), each with a `group` column (the scenario id). Both rows of
the groups table (per pair and per group) train on this same folder.
"""

import argparse
import json
import os

VALIDATION_DIALOGUES = 7


def rows(scenarios):
    """(ja, en, scenario id) per turn; refuses text holding a tab or newline."""
    out = []
    for scenario in scenarios:
        for turn in scenario["conversation"]:
            ja, en = turn["ja_sentence"], turn["en_sentence"]
            if any(c in t for t in (ja, en) for c in "\t\n\r"):
                raise ValueError(f"{scenario['id']}: a turn holds a tab or newline.")
            out.append((ja, en, scenario["id"]))
    return out


def write(path, pairs):
    """A TSV of (ja, en, group) rows under its header."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("ja\ten\tgroup\n")
        f.writelines(f"{ja}\t{en}\t{group}\n" for ja, en, group in pairs)


def main():
    """Writes the three splits."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = os.environ.get("DPNMT_DATA_DIR", ".")
    parser.add_argument("--bsd", default=os.path.join(root, "bsd_ja_en"), help="dev/test.json")
    parser.add_argument("--out", required=True, help="The folder to write (created).")
    args = parser.parse_args()
    with open(os.path.join(args.bsd, "dev.json"), encoding="utf-8") as f:
        dev = json.load(f)
    with open(os.path.join(args.bsd, "test.json"), encoding="utf-8") as f:
        test = json.load(f)
    os.makedirs(args.out, exist_ok=True)
    write(os.path.join(args.out, "train.tsv"), rows(dev))
    write(os.path.join(args.out, "validation.tsv"), rows(test[:VALIDATION_DIALOGUES]))
    write(os.path.join(args.out, "test.tsv"), rows(test[VALIDATION_DIALOGUES:]))


if __name__ == "__main__":
    main()
