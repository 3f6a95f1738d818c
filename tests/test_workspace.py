"""WORKSPACE.md stays a short map of the code (issue 62): its length, and every
repository path it names in backticks exists, so the map cannot drift from the tree."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKSPACE = ROOT / "WORKSPACE.md"
MAX_LINES = 300
# A backticked repository path: under one of these folders, no spaces.
PATH = re.compile(r"`((?:dpnmt|tests|configs|docs|benchmarks|examples|third_party|\.ci)/[^`\s]*)`")
# A placeholder (`docs/results/<run>/`) ends the part that must exist.
PLACEHOLDER = re.compile(r"[<{*]")


def named_paths(markdown: str) -> list[str]:
    """The repository paths named in inline backticks, fenced code blocks left out."""
    prose = re.sub(r"^```.*?^```", "", markdown, flags=re.DOTALL | re.MULTILINE)
    return PATH.findall(prose)


def existing_part(path: str) -> str:
    """`path` without a config variant (`:eps8`), up to its first placeholder, cut back to
    a whole folder when one was cut."""
    path = path.split(":", 1)[0]
    cut = PLACEHOLDER.search(path)
    return path if cut is None else path[: cut.start()].rsplit("/", 1)[0]


def test_workspace_is_short():
    lines = WORKSPACE.read_text().splitlines()
    assert len(lines) <= MAX_LINES, (
        f"WORKSPACE.md has {len(lines)} lines (at most {MAX_LINES}): move run logs beside their "
        "results (docs/results/<run>/README.md) and statuses to docs/results/HISTORY.md"
    )


def test_workspace_paths_exist():
    paths = named_paths(WORKSPACE.read_text())
    assert len(paths) >= 50, "WORKSPACE.md's layout table lost its paths"
    missing = sorted({p for p in paths if not (ROOT / existing_part(p)).exists()})
    assert not missing, f"WORKSPACE.md names paths that do not exist: {missing}"


def test_placeholders_keep_the_folder_before_them():
    assert existing_part("docs/results/<run>/README.md") == "docs/results"
    assert existing_part("configs/tiny.py:eps8") == "configs/tiny.py"
    assert existing_part("dpnmt/<app>.py") == "dpnmt"
    assert named_paths("`dpnmt/x.py` and\n```bash\ncat `tests/y.py`\n```\n") == ["dpnmt/x.py"]
