"""`dpnmt.core`'s stability promise (issue 30 item 8).

`__all__` is the public API (docs/core_api.md renders exactly it:
tests/test_docs.py), `__version__` the package's, CHANGELOG.md names every
deprecated spelling, and `tests/core/public_api.txt` pins the public
signatures: a change to one fails here until the snapshot is regenerated
(`python -m tests.core.test_api`) and CHANGELOG.md says what changed.
"""

import configparser
import enum
import inspect
import pathlib
import re
import sys

import dpnmt
from dpnmt import core
from dpnmt.core import deprecation, dp_step

ROOT = pathlib.Path(__file__).resolve().parents[2]
SNAPSHOT = pathlib.Path(__file__).with_name("public_api.txt")


def _parameters(function) -> str:
    parts, star = [], False
    for p in inspect.signature(function).parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
        star = star or p.kind in (p.KEYWORD_ONLY, p.VAR_POSITIONAL)
        prefix = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        default = "" if p.default is p.empty else f"={p.default!r}"
        parts.append(f"{prefix}{p.name}{default}")
    return ", ".join(parts)


def _describe(name: str, obj) -> str:
    if isinstance(obj, type) and issubclass(obj, enum.Enum):
        return f"enum {name}: {', '.join(f'{m.name}={m.value!r}' for m in obj)}"
    if isinstance(obj, type) and hasattr(obj, "_fields"):
        return f"namedtuple {name}({', '.join(obj._fields)})"
    if isinstance(obj, type) and hasattr(obj, "__dataclass_fields__"):
        return f"dataclass {name}({', '.join(obj.__dataclass_fields__)})"
    if isinstance(obj, type):
        return f"class {name}({', '.join(b.__name__ for b in obj.__bases__)})"
    return f"def {name}({_parameters(obj)})"


def public_api() -> list[str]:
    """One line per public name: `core.__all__`, then `dp_step`'s public functions."""
    lines = [_describe(name, getattr(core, name)) for name in core.__all__]
    for name, obj in sorted(vars(dp_step).items()):
        if callable(obj) and not name.startswith("_") and obj.__module__ == dp_step.__name__:
            lines.append(_describe(f"dp_step.{name}", obj))
    return lines


def test_public_signatures_match_the_snapshot():
    want = SNAPSHOT.read_text().splitlines()
    got = public_api()
    changed = sorted(set(got) ^ set(want))
    assert got == want, (
        "dpnmt.core's public API changed:\n  "
        + "\n  ".join(changed)
        + "\nSay what changed in CHANGELOG.md (Unreleased; a removal or rename keeps the old "
        "spelling with a deprecation warning for a minor release), then regenerate the "
        "snapshot: python -m tests.core.test_api"
    )


def test_all_lists_existing_names_once_and_is_documented_as_the_api():
    assert len(core.__all__) == len(set(core.__all__))
    missing = [name for name in core.__all__ if not hasattr(core, name)]
    assert not missing, missing
    # Every public top-level function or class of the package is in __all__.
    exported = {
        name
        for name, obj in vars(core).items()
        if not name.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj))
    }
    assert exported <= set(core.__all__), sorted(exported - set(core.__all__))


def test_version_is_the_package_version():
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    assert core.__version__ == dpnmt.__version__ == setup["metadata"]["version"]


def _unreleased_bullets(section: str) -> list[str]:
    text = (ROOT / "CHANGELOG.md").read_text()
    unreleased = text.split("## [Unreleased]", 1)[1].split("\n## ", 1)[0]
    body = unreleased.split(f"### {section}\n", 1)[1].split("\n### ", 1)[0]
    bullets = re.split(r"\n- ", "\n" + body.strip())
    return [" ".join(b.split()) for b in bullets if b.strip()]


def test_every_deprecated_spelling_is_in_the_changelog():
    bullets = _unreleased_bullets("Deprecated")
    assert deprecation.DEPRECATED
    for spelling in deprecation.DEPRECATED:
        if spelling.old.startswith("positional "):
            needed = [f"{spelling.function}(", "positional", f"`{spelling.new}=`"]
        else:
            needed = [f"{spelling.function}({spelling.old}=)`", f"`{spelling.new}=`"]
        assert any(all(n in b for n in needed) for b in bullets), (
            f"CHANGELOG.md's Unreleased/Deprecated section does not name {spelling}: "
            f"add a bullet with {needed}"
        )


def test_the_changelog_follows_keep_a_changelog():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog\n")
    assert "keepachangelog.com" in text
    sections = re.findall(r"^### (\w+)", text, re.M)
    assert set(sections) <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
    versions = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d\d-\d\d))?$", text, re.M)
    assert versions[0][0] == "Unreleased", versions
    assert all(date for _, date in versions[1:]), versions


if __name__ == "__main__":
    SNAPSHOT.write_text("\n".join(public_api()) + "\n")
    print(f"wrote {SNAPSHOT.relative_to(ROOT)}", file=sys.stderr)
