"""How much of a private corpus's text a "public" text holds, sentence by sentence.

A vocabulary learnt from public text costs no ε only if that text is not the
run's private data. Folder names and file digests miss a renamed copy, a
reordered one or a partial one; this compares the sentences themselves, as
sets of normalised lines (XML escapes undone, NFKC, case-folded, all
whitespace removed, so a Moses-detokenised or re-cased copy still matches).
Hash sets: linear in the text, a fraction of a second for Multi30K against
Tatoeba and the WMT sample.
"""

import dataclasses
import html
import unicodedata
from collections.abc import Iterable

# A private side sharing more than this share of its distinct sentences with
# "public" text is refused: chance overlap of real public corpora with a private
# one is far below it (Multi30K train vs Tatoeba de-en + the WMT sample: 0).
OVERLAP_LIMIT = 0.01


def normalised(line: str) -> str:
    """`line` as compared: XML escapes undone, NFKC, case-folded, without whitespace."""
    text = unicodedata.normalize("NFKC", html.unescape(line)).casefold()
    return "".join(text.split())


def sentence_set(lines: Iterable[str]) -> set[str]:
    """The distinct normalised non-blank lines of `lines`."""
    return {text for line in lines if (text := normalised(line))}


@dataclasses.dataclass(frozen=True)
class Overlap:
    """Distinct sentences of one private split side also found in public text.

    Attributes:
      split: the private split ("train", or a validation carved from it).
      language: the side's language code.
      shared: how many of its distinct sentences the public text holds.
      total: its distinct sentences.
    """

    split: str
    language: str
    shared: int
    total: int

    def describe(self) -> str:
        """E.g. "12 of the 580 distinct de sentences (2.1%) of the train split"."""
        return (
            f"{self.shared} of the {self.total} distinct {self.language} sentences "
            f"({self.shared / self.total:.1%}) of the {self.split} split"
        )


def private_sides(corpus, splits: Iterable[str]) -> list[tuple[str, str, set[str]]]:
    """(split, language, sentence set) for each language side of `splits` of `corpus`."""
    sides = []
    for split in splits:
        rows = corpus[split]["translation"]
        for language in rows[0] if len(rows) else ():
            sides.append((split, language, sentence_set(row[language] for row in rows)))
    return sides


def large_overlaps(public: set[str], sides, limit: float = OVERLAP_LIMIT) -> list[Overlap]:
    """The private sides (`private_sides`) of which `public` holds more than `limit`."""
    found = []
    for split, language, sentences in sides:
        shared = len(sentences & public)
        if sentences and shared > limit * len(sentences):
            found.append(Overlap(split, language, shared, len(sentences)))
    return found
