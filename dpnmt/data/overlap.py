"""How much of a private corpus's text a "public" text holds, sentence by sentence.

A vocabulary learnt from public text costs no ε only if that text is not the
run's private data. Folder names and file digests miss a renamed copy, a
reordered one or a partial one; this compares the sentences themselves, as
sets of normalised lines (XML escapes undone, Moses `@-@` and subword-nmt
`@@ ` marks undone, NFKC, case-folded, all whitespace removed, so a
Moses-detokenised or re-cased copy still matches). A line of a public text
file also counts by its tab-separated fields and, when it is a JSON object, by
its string values, so a TSV or JSONL copy (both sides on one line) matches.
Only sentences long enough to be evidence count (`is_evidence`): stock phrases
("Thank you.", "はい。") are shared by any two corpora by chance.
Hash sets: linear in the text, a fraction of a second for Multi30K against
Tatoeba and the WMT sample.
"""

import dataclasses
import html
import json
import re
import unicodedata
from collections.abc import Iterable, Iterator

# A private side sharing more than this share of its distinct evidence
# sentences with "public" text is refused: chance overlap of real public corpora
# with a private one is far below it (Multi30K train vs Tatoeba de-en + the WMT
# sample: 0; BSD train and its carved validation vs Tatoeba ja-en: at most 0.6%).
OVERLAP_LIMIT = 0.01

# Normalised characters a sentence needs to count as evidence: 20, or 10 for
# one mostly in CJK script (more information a character).
MIN_CHARACTERS = 20
MIN_CJK_CHARACTERS = 10
# A side with fewer evidence sentences than this counts all its sentences (a
# corpus of short sentences is still checked; a handful is no share).
MIN_EVIDENCE_SENTENCES = 100

_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")


def normalised(line: str) -> str:
    """`line` as compared: XML escapes and BPE/Moses marks undone, NFKC, case-folded, no spaces."""
    text = html.unescape(line).replace(" @-@ ", "-").replace("@@ ", "")
    text = unicodedata.normalize("NFKC", text).casefold()
    return "".join(text.split())


def sentence_groups(pairs: list[tuple[str, ...]]) -> list[int]:
    """For each pair, the index of the first pair of its group.

    Pairs are grouped when they share a `normalised` sentence on the same side
    (position in the tuple), transitively: a cut that keeps each group in one
    part leaves no sentence in two parts.
    """
    parent = list(range(len(pairs)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first_of: dict[tuple[int, str], int] = {}
    for i, pair in enumerate(pairs):
        for side, text in enumerate(pair):
            key = (side, normalised(text))
            if key in first_of:
                a, b = root(first_of[key]), root(i)
                parent[max(a, b)] = min(a, b)  # The root is the group's first pair.
            else:
                first_of[key] = i
    return [root(i) for i in range(len(pairs))]


def is_evidence(sentence: str) -> bool:
    """Whether a normalised sentence is long enough that sharing it is not chance.

    At least `MIN_CHARACTERS` characters, or `MIN_CJK_CHARACTERS` when most of
    them are CJK ideographs, kana or Hangul.
    """
    cjk = len(_CJK.findall(sentence))
    return len(sentence) >= (MIN_CJK_CHARACTERS if 2 * cjk > len(sentence) else MIN_CHARACTERS)


def _strings(value) -> Iterator[str]:
    """The strings nested in a parsed JSON value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def text_items(lines: Iterable[str]) -> Iterator[str]:
    """Each line of a text file, then its tab-separated fields and its JSON object's strings."""
    for line in lines:
        yield line
        if "\t" in line:
            yield from line.split("\t")
        stripped = line.strip()
        if stripped.startswith("{"):
            try:
                parsed = json.loads(stripped)
            except ValueError:
                continue
            if isinstance(parsed, dict):
                yield from _strings(parsed)


def text_sentence_set(lines: Iterable[str]) -> set[str]:
    """`sentence_set` of a public text file's `text_items` (TSV and JSONL copies match)."""
    return sentence_set(text_items(lines))


def sentence_set(lines: Iterable[str]) -> set[str]:
    """The distinct normalised non-blank lines of `lines`."""
    return {text for line in lines if (text := normalised(line))}


@dataclasses.dataclass(frozen=True)
class Overlap:
    """Distinct sentences of one private split side also found in public text.

    Secret: `shared` and `total` are exact private counts; print `describe()`.

    Attributes:
      split: the private split ("train", or a validation carved from it).
      language: the side's language code.
      shared: how many of its distinct evidence sentences the public text holds.
      total: its distinct evidence sentences.
    """

    split: str
    language: str
    shared: int
    total: int

    def describe(self) -> str:
        """E.g. "about 100% of the distinct de sentences of the train split": no count.

        The share is rounded to 10% above 10% ("more than 1%" below): a private
        split's exact size is not published.
        """
        share = self.shared / self.total
        rounded = f"about {round(share * 10) * 10}%" if share >= 0.1 else "more than 1%"
        return f"{rounded} of the distinct {self.language} sentences of the {self.split} split"


def evidence(sentences: set[str]) -> set[str]:
    """The sentences of one side that count (`is_evidence`; all when too few of them do)."""
    kept = {s for s in sentences if is_evidence(s)}
    return kept if len(kept) >= MIN_EVIDENCE_SENTENCES else sentences


def private_sides(corpus, splits: Iterable[str]) -> list[tuple[str, str, set[str]]]:
    """(split, language, evidence sentence set) for each language side of `splits` of `corpus`."""
    sides = []
    for split in splits:
        rows = corpus[split]["translation"]
        for language in rows[0] if len(rows) else ():
            sentences = evidence(sentence_set(row[language] for row in rows))
            sides.append((split, language, sentences))
    return sides


def large_overlaps(public: set[str], sides, limit: float = OVERLAP_LIMIT) -> list[Overlap]:
    """The private sides (`private_sides`) of which `public` holds more than `limit`."""
    found = []
    for split, language, sentences in sides:
        shared = len(sentences & public)
        if sentences and shared > limit * len(sentences):
            found.append(Overlap(split, language, shared, len(sentences)))
    return found
