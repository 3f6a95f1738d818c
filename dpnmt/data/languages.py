"""Language pairs: parse a direction string and name its languages per model family."""

import dataclasses
from collections.abc import Iterable

# English names used in T5 task prefixes ("translate German to English: ").
LANGUAGE_NAMES: dict[str, str] = {
    "ar": "Arabic",
    "cs": "Czech",
    "de": "German",
    "en": "English",
    "es": "Spanish",
    "et": "Estonian",
    "fi": "Finnish",
    "fr": "French",
    "hi": "Hindi",
    "it": "Italian",
    "ja": "Japanese",
    "kk": "Kazakh",
    "ko": "Korean",
    "lt": "Lithuanian",
    "lv": "Latvian",
    "nl": "Dutch",
    "pl": "Polish",
    "pt": "Portuguese",
    "ro": "Romanian",
    "ru": "Russian",
    "tr": "Turkish",
    "uk": "Ukrainian",
    "vi": "Vietnamese",
    "zh": "Chinese",
}

# mBART (cc25 and mBART-50) language codes, set as tokenizer.src_lang/tgt_lang.
MBART_LANGUAGE_CODES: dict[str, str] = {
    "ar": "ar_AR",
    "cs": "cs_CZ",
    "de": "de_DE",
    "en": "en_XX",
    "es": "es_XX",
    "et": "et_EE",
    "fi": "fi_FI",
    "fr": "fr_XX",
    "hi": "hi_IN",
    "it": "it_IT",
    "ja": "ja_XX",
    "kk": "kk_KZ",
    "ko": "ko_KR",
    "lt": "lt_LT",
    "lv": "lv_LV",
    "nl": "nl_XX",
    "pl": "pl_PL",
    "pt": "pt_XX",
    "ro": "ro_RO",
    "ru": "ru_RU",
    "tr": "tr_TR",
    "uk": "uk_UA",
    "vi": "vi_VN",
    "zh": "zh_CN",
}


@dataclasses.dataclass(frozen=True)
class LanguagePair:
    """A translation direction.

    Attributes:
      source: language code translated from, e.g. "de".
      target: language code translated into, e.g. "en".
    """

    source: str
    target: str

    def __str__(self) -> str:
        return f"{self.source}-{self.target}"

    def reversed(self) -> "LanguagePair":
        """Returns the opposite direction."""
        return LanguagePair(self.target, self.source)

    @property
    def languages(self) -> frozenset[str]:
        """Both codes, without direction."""
        return frozenset((self.source, self.target))


def parse_pair(pair: "str | LanguagePair") -> LanguagePair:
    """Parses a direction string such as "de-en" (German into English).

    Args:
      pair: "<source>-<target>" with two distinct language codes, or a LanguagePair.

    Returns:
      The LanguagePair.

    Raises:
      ValueError: the string is not two distinct codes joined by "-".
    """
    if isinstance(pair, LanguagePair):
        return pair
    parts = str(pair).strip().split("-")
    if len(parts) != 2 or not all(parts) or parts[0] == parts[1]:
        raise ValueError(
            f"Language pair {pair!r} is not '<source>-<target>' with two different language "
            "codes; write it like 'de-en' (German into English) or 'en-de'."
        )
    return LanguagePair(parts[0], parts[1])


def check_pair_available(
    pair: LanguagePair, available: Iterable[str | LanguagePair], corpus: str
) -> None:
    """Raises if `pair` (either direction) is not among a corpus's pairs.

    Args:
      pair: the requested direction.
      available: the corpus's pairs, as strings like "de-en" or LanguagePairs; each
        counts in both directions.
      corpus: corpus name for the error message.

    Raises:
      ValueError: listing the pairs the corpus has.
    """
    parsed = [parse_pair(p) for p in available]
    if not any(p.languages == pair.languages for p in parsed):
        listed = ", ".join(sorted({f"{p}, {p.reversed()}" for p in parsed}))
        raise ValueError(
            f"Corpus {corpus!r} has no pair {pair}; it has: {listed}. Pick one of those."
        )


def t5_prefix(pair: LanguagePair) -> str:
    """Returns the T5 task prefix, e.g. "translate German to English: ".

    Raises:
      ValueError: a language has no English name here; pass the prefix explicitly.
    """
    missing = [code for code in (pair.source, pair.target) if code not in LANGUAGE_NAMES]
    if missing:
        raise ValueError(
            f"No English name known for language code(s) {missing} to build a T5 prefix; "
            "pass source_prefix='translate X to Y: ' explicitly."
        )
    return f"translate {LANGUAGE_NAMES[pair.source]} to {LANGUAGE_NAMES[pair.target]}: "


def mbart_codes(pair: LanguagePair) -> tuple[str, str]:
    """Returns the mBART (source, target) language codes, e.g. ("de_DE", "en_XX").

    Raises:
      ValueError: a language has no mBART code here; set the codes on the tokenizer.
    """
    missing = [code for code in (pair.source, pair.target) if code not in MBART_LANGUAGE_CODES]
    if missing:
        raise ValueError(
            f"No mBART language code known for {missing}; known: "
            f"{sorted(MBART_LANGUAGE_CODES)}. Pass src_lang/tgt_lang codes explicitly."
        )
    return MBART_LANGUAGE_CODES[pair.source], MBART_LANGUAGE_CODES[pair.target]
