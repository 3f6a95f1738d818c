"""Read parallel text from local TSV, JSONL and line-aligned text files.

Every reader returns a list of (source, target) string tuples in file order and
raises ValueError naming the file, the 1-based line number and the fix for a
malformed line; nothing is skipped silently.
"""

import json
import os
import re

# The optional column (TSV header) or key (JSONL) naming each pair's group: its
# privacy unit, e.g. a user or document id (`dpnmt.data.groups`).
GROUP_KEY = "group"
_LANGUAGE_CODE = re.compile(r"^[A-Za-z]{2,3}([_-][A-Za-z0-9]+)?$")


def is_language_code(text: str) -> bool:
    """Whether `text` reads as a language code (de, en, pt_BR, zh-Hans), as a header names one."""
    return bool(_LANGUAGE_CODE.match(text))


class MissingLanguageError(ValueError):
    """A file does not hold a requested language; `available` lists the ones it holds."""

    def __init__(self, message: str, available: tuple[str, ...]):
        super().__init__(message)
        self.available = available


def _read_lines(path: str) -> list[str]:
    """Returns the file's lines without their newline (and a trailing carriage return).

    Lines are split on LF only, so a stray CR or U+2028 inside a sentence
    never shifts the alignment of parallel files. A final newline does not add an
    empty line.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path} does not exist; create it or point the loader at the folder that has it."
        )
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line_number = data[: e.start].count(b"\n") + 1
        raise ValueError(
            f"{path}:{line_number}: not valid UTF-8 ({e.reason}); re-encode the file as UTF-8."
        ) from e
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_tsv(path: str, source: str, target: str) -> list[tuple[str, ...]]:
    """Reads a two-column TSV whose first line names the columns' languages.

    Example file (tab-separated)::

        de<TAB>en
        Guten Morgen .<TAB>Good morning .

    A third column headed `group` names each pair's group (its privacy unit)::

        de<TAB>en<TAB>group
        Guten Morgen .<TAB>Good morning .<TAB>user-17

    Args:
      path: the .tsv file.
      source: language code of the source side, e.g. "de"; must be a header column.
      target: language code of the target side, e.g. "en".

    Returns:
      (source text, target text[, group]) per data line, in file order.

    Raises:
      FileNotFoundError: the file is missing.
      MissingLanguageError: the header lacks `source` or `target`.
      ValueError: no header, a line whose field count is not the header's, or
        an empty group.
    """
    lines = _read_lines(path)
    if not lines:
        return []
    header = [h.strip() for h in lines[0].split("\t")]
    languages = [h for h in header if h != GROUP_KEY]
    if (
        len(header) not in (2, 3)
        or len(languages) != 2
        or not all(_LANGUAGE_CODE.match(h) for h in languages)
    ):
        raise ValueError(
            f"{path}:1: the first line must name the two columns' languages, e.g. "
            f"'de<TAB>en' (and optionally a '{GROUP_KEY}' column: 'de<TAB>en<TAB>{GROUP_KEY}'), "
            f"but it is {lines[0][:80]!r}; add such a header line."
        )
    if source not in languages or target not in languages:
        raise MissingLanguageError(
            f"{path} holds languages {languages[0]} and {languages[1]} (its header), "
            f"not {source}-{target}.",
            tuple(languages),
        )
    columns = [header.index(source), header.index(target)]
    if GROUP_KEY in header:
        columns.append(header.index(GROUP_KEY))
    pairs = []
    for line_number, line in enumerate(lines[1:], start=2):
        fields = line.split("\t")
        if len(fields) != len(header):
            raise ValueError(
                f"{path}:{line_number}: expected {len(header)} tab-separated fields "
                f"({'<TAB>'.join(header)}), found {len(fields)}; remove tabs inside the "
                "text or the blank line, or fix the line."
            )
        row = tuple(fields[c] for c in columns)
        if len(row) == 3 and not row[2].strip():
            raise ValueError(
                f"{path}:{line_number}: the {GROUP_KEY} field is empty; name the pair's "
                "group (e.g. a user or document id)."
            )
        pairs.append(row)
    return pairs


def read_jsonl(path: str, source: str, target: str) -> list[tuple[str, ...]]:
    """Reads JSON Lines with one object per line holding both languages.

    Each line is {"de": "...", "en": "..."} or {"translation": {"de": ..., "en": ...}};
    other keys are ignored, but for "group" (next to "translation" in the second
    form): a string or integer naming the pair's group (its privacy unit), on
    every line or on none.

    Args:
      path: the .jsonl file.
      source: key of the source side, e.g. "de".
      target: key of the target side, e.g. "en".

    Returns:
      (source text, target text[, group]) per line, in file order.

    Raises:
      FileNotFoundError: the file is missing.
      MissingLanguageError: the first record lacks `source` or `target`.
      ValueError: a line is not a JSON object, lacks a language, or has a non-string
        value; a group on some lines only, or an empty or non-scalar one.
    """
    pairs = []
    grouped = None
    for line_number, line in enumerate(_read_lines(path), start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{path}:{line_number}: not valid JSON ({e.msg} at column {e.colno}); write "
                f'one object per line, like {{"{source}": "...", "{target}": "..."}}, and no '
                "blank lines."
            ) from e
        group = record.get(GROUP_KEY) if isinstance(record, dict) else None
        if isinstance(record, dict) and isinstance(record.get("translation"), dict):
            record = record["translation"]
        if not isinstance(record, dict):
            raise ValueError(
                f"{path}:{line_number}: expected a JSON object, found "
                f"{type(record).__name__}; write one object per line."
            )
        missing = [key for key in (source, target) if key not in record]
        if missing and line_number == 1:
            available = tuple(k for k, v in record.items() if isinstance(v, str))
            raise MissingLanguageError(
                f"{path} has no {'/'.join(missing)} text; its records have keys {sorted(record)}.",
                available,
            )
        if missing:
            raise ValueError(
                f"{path}:{line_number}: record lacks key(s) {missing}; every line needs "
                f'both, like {{"{source}": "...", "{target}": "..."}}.'
            )
        values = (record[source], record[target])
        if not all(isinstance(v, str) for v in values):
            raise ValueError(
                f"{path}:{line_number}: the {source}/{target} values must be strings, found "
                f"{type(values[0]).__name__}/{type(values[1]).__name__}; quote the text."
            )
        if grouped is None:
            grouped = group is not None
        if (group is not None) != grouped:
            raise ValueError(
                f"{path}:{line_number}: {'no' if grouped else 'a'} {GROUP_KEY!r} key, unlike "
                f"line 1; give every line a {GROUP_KEY}, or none."
            )
        if grouped:
            if isinstance(group, bool) or not isinstance(group, str | int) or not str(group):
                raise ValueError(
                    f"{path}:{line_number}: {GROUP_KEY!r} must be a non-empty string or an "
                    f"integer (a user or document id), found {group!r}."
                )
            values = (*values, str(group))
        pairs.append(values)
    return pairs


def read_parallel_text(source_path: str, target_path: str) -> list[tuple[str, str]]:
    """Reads two line-aligned text files (e.g. train.de and train.en), one sentence a line.

    Args:
      source_path: file of source sentences.
      target_path: file of target sentences, line i translating line i of the source.

    Returns:
      (source line, target line) per line, in file order.

    Raises:
      FileNotFoundError: a file is missing.
      ValueError: the files have different line counts.
    """
    source_lines = _read_lines(source_path)
    target_lines = _read_lines(target_path)
    if len(source_lines) != len(target_lines):
        raise ValueError(
            f"{source_path} has {len(source_lines)} lines but {target_path} has "
            f"{len(target_lines)}; parallel files need one sentence per line, line i of one "
            "translating line i of the other. Check for a missing or extra line."
        )
    return list(zip(source_lines, target_lines, strict=True))
