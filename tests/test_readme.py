"""The README's `dpnmt.core` example runs as written, outside the project's code."""

import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_core_example_runs(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    example = next(b for b in blocks if "from dpnmt import core" in b)
    assert len(example.strip().splitlines()) <= 25
    script = tmp_path / "example.py"
    script.write_text(example)
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert result.returncode == 0, result.stderr
    match = re.search(r"σ=([\d.]+), ε=([\d.]+)", result.stdout)
    assert match, result.stdout
    assert 0 < float(match.group(2)) <= 2.0


def test_readme_result_tables_are_the_committed_runs_results():
    # Each `<!-- results table: DIR -->` marker is followed by the table that
    # `dpnmt.report` makes from DIR (a sweep's sweep.json and its runs' results.json).
    from dpnmt.sweeps import summary

    text = README.read_text()
    markers = re.findall(r"<!-- results table: (\S+) -->\n((?:\|.*\n)+)", text)
    assert len(markers) >= 2, "the README's measured tables lost their markers"
    for folder, table in markers:
        runs, _ = summary.load_runs(str(README.parent / folder))
        assert runs, folder
        expected = summary.to_markdown(summary.cell_rows(runs), {}).split("\n\n")[0]
        assert table.strip() == expected.strip(), folder


def test_committed_results_hold_no_local_path():
    """The published files under docs/results name local files, never locate them
    (results.json once held the BERTScore encoder's site-packages folder)."""
    results = README.parent / "docs" / "results"
    texts = [p for p in results.rglob("*") if p.suffix in (".json", ".md", ".jsonl", ".csv")]
    assert texts, "docs/results should hold the committed runs' files"
    absolute = re.compile(r"(?<![\w.])/(?:work|home|root|tmp|usr|opt|Users|var)/|site-packages")
    for path in texts:
        match = absolute.search(path.read_text(errors="replace"))
        assert not match, f"{path} holds a local path near {match.group(0)!r}"


def test_readme_runs_tables_are_the_committed_runs_results():
    # Each `<!-- runs table: FOLDER,FOLDER -->` marker is followed by the table
    # that `dpnmt.report --runs=FOLDER,FOLDER` makes from those runs' results.json.
    from dpnmt.sweeps import runs_table

    text = README.read_text()
    markers = re.findall(r"<!-- runs table: (\S+) -->\n((?:\|.*\n)+)", text)
    assert markers, "the README's measured runs tables lost their markers"
    for folders, table in markers:
        paths = [str(README.parent / f) for f in folders.split(",")]
        runs, not_finished = runs_table.load_runs(paths)
        assert runs and not not_finished, folders
        expected = runs_table.to_markdown([runs_table.row(r) for r in runs], []).split("\n\n")[0]
        assert table.strip() == expected.strip(), folders
