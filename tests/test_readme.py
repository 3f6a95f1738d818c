"""The README stays short and true; the measured tables (README and docs pages)
are the committed runs' own. The docs' code blocks: tests/test_docs.py."""

import json
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
# The README and every docs page: the measured tables' markers may sit in any.
MARKDOWN = [README, *sorted((README.parent / "docs").glob("*.md"))]


def _text() -> str:
    return "\n".join(path.read_text() for path in MARKDOWN)


def test_readme_is_short():
    """A five-minute read; the rest lives in the docs pages (mkdocs.yml)."""
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move sections into docs/"


def test_readme_states_the_test_command_ci_runs():
    ci = (README.parent / ".ci" / "run").read_text()
    command = ".venv/bin/python -m pytest -q -n 2 --dist loadfile --durations=20 tests"
    assert f"```bash\n{command}\n```" in README.read_text()
    assert ci.rstrip().splitlines()[-1] == command


def test_readme_result_tables_are_the_committed_runs_results():
    # Each `<!-- results table: DIR -->` marker is followed by the table that
    # `dpnmt.report` makes from DIR (a sweep's sweep.json and its runs' results.json).
    from dpnmt.sweeps import summary

    text = _text()
    markers = re.findall(r"<!-- results table: (\S+) -->\n((?:\|.*\n)+)", text)
    # Three sweeps' tables (Multi30K's first grid in docs/results.md; two in fine_tuning.md).
    assert len({folder for folder, _ in markers}) >= 3, "the measured tables lost their markers"
    for folder, table in markers:
        runs, _ = summary.load_runs(str(README.parent / folder))
        assert runs, folder
        expected = summary.to_markdown(summary.cell_rows(runs), {}).split("\n\n")[0]
        assert table.strip() == expected.strip(), folder


# The first line of a hand-written lab note under docs/results (a run's README.md, HISTORY.md):
# its run logs and scripts name the project machine's /work/ and /tmp/ folders, nothing else.
NOTES_MARK = "<!-- notes: lab notes, not a published run file (tests/test_readme.py) -->"
LOCAL_PATH = re.compile(r"(?<![\w.])/(?:work|home|root|tmp|usr|opt|Users|var)/|site-packages")
NOTES_LOCAL_PATH = re.compile(r"(?<![\w.])/(?:home|root|usr|opt|Users|var)/|site-packages")


def local_path_in(text: str) -> str | None:
    """The local path a committed results file names (a lab note: outside the lab's folders)."""
    notes = text.startswith(NOTES_MARK + "\n")
    match = (NOTES_LOCAL_PATH if notes else LOCAL_PATH).search(text)
    return match.group(0) if match else None


def test_committed_results_hold_no_local_path():
    """The published files under docs/results name local files, never locate them
    (results.json once held the BERTScore encoder's site-packages folder)."""
    results = README.parent / "docs" / "results"
    texts = [p for p in results.rglob("*") if p.suffix in (".json", ".md", ".jsonl", ".csv")]
    assert texts, "docs/results should hold the committed runs' files"
    for path in texts:
        found = local_path_in(path.read_text(errors="replace"))
        assert not found, f"{path} holds a local path near {found!r}"


def test_only_lab_notes_name_the_lab_machines_folders():
    note = f"{NOTES_MARK}\n# A run\nStarted by `/work/runs/chain.sh`; log in /tmp/x.log.\n"
    assert local_path_in(note) is None
    assert local_path_in(note + "the encoder in /home/me/.cache\n") == "/home/"
    assert local_path_in(note.replace(NOTES_MARK, "# model card")) == "/work/"
    assert local_path_in("{}\n" + note) == "/work/"  # The mark counts only as the first line.


def test_readme_runs_tables_are_the_committed_runs_results():
    # Each `<!-- runs table: FOLDER,FOLDER [starts=FOLDER] [decodings=TAG,TAG] -->` marker is
    # followed by the table that `dpnmt.report --runs=FOLDER,FOLDER [--starts=FOLDER]
    # [--decodings=TAG,TAG]` makes.
    from dpnmt.sweeps import runs_table

    text = _text()
    markers = re.findall(
        r"<!-- runs table: (\S+)(?: starts=(\S+))?(?: decodings=(\S+))? -->\n((?:\|.*\n)+)", text
    )
    assert markers, "the measured runs tables lost their markers"
    for folders, starts, tags, table in markers:
        paths = [str(README.parent / f) for f in folders.split(",")]
        runs, not_finished = runs_table.load_runs(paths)
        assert runs and not not_finished, folders
        tags = tags.split(",") if tags else []
        start_paths = [str(README.parent / f) for f in starts.split(",")] if starts else []
        rows = runs_table.table_rows(runs, tags, start_paths)
        expected = runs_table.to_markdown(rows, []).split("\n\n")[0]
        assert table.strip() == expected.strip(), folders


def test_groups_tables_are_the_committed_runs_results():
    # Each `<!-- groups table: FOLDER,FOLDER -->` marker is followed by the table
    # that `dpnmt.report --groups --runs=FOLDER,FOLDER` makes from those runs.
    from dpnmt.sweeps import groups_table, runs_table

    markers = re.findall(r"<!-- groups table: (\S+) -->\n((?:\|.*\n)+)", _text())
    assert markers, "the groups table lost its marker"
    for folders, table in markers:
        paths = [str(README.parent / f) for f in folders.split(",")]
        runs, not_finished = runs_table.load_runs(paths)
        assert runs and not not_finished, folders
        expected = groups_table.to_markdown([groups_table.row(r) for r in runs]).split("\n\n")[0]
        assert table.strip() == expected.strip(), folders


def test_tuning_tables_are_the_committed_runs_results():
    # Each `<!-- tuning table: FOLDER,FOLDER -->` marker is followed by the table (and the
    # winners) that `dpnmt.report --tuning --runs=FOLDER,FOLDER` makes from those runs.
    from dpnmt.sweeps import runs_table, tuning_table

    markers = re.findall(r"<!-- tuning table: (\S+) -->\n((?:\|.*\n)+)", _text())
    assert markers, "the stand-in grid's tuning table lost its marker"
    for folders, table in markers:
        paths = runs_table.expand([str(README.parent / f) for f in folders.split(",")])
        runs, not_finished = runs_table.load_runs(paths)
        assert runs and not not_finished, folders
        expected = tuning_table.to_markdown([tuning_table.row(r) for r in runs]).split("\n\n")[0]
        assert table.strip() == expected.strip(), folders


def memorization_table(folder: pathlib.Path) -> str:
    """The memorization table of docs/results.md from each cell's published
    memorization.json and results.json (one folder a cell under `folder`)."""
    head = "| objective | privacy | ε (one text) | σ | lots | set | texts | EM | TA | MED |"
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for cell in sorted(p for p in folder.iterdir() if p.is_dir()):
        memo = json.loads((cell / "memorization.json").read_text())
        privacy = json.loads((cell / "results.json").read_text())["privacy"]
        eps = privacy["dp_sgd_epsilon"]
        eps = "∞" if eps == "inf" else f"{float(eps):.2f}"
        for name, s in memo["sets"].items():
            lines.append(
                f"| {memo['objective']} | {'DP-SGD' if privacy['private'] else 'non-private'} | "
                f"{eps} | {privacy['noise_multiplier']:.3f} | {privacy['steps_done']} | {name} | "
                f"{s['texts']} | {s['exact_match']:.3f} | {s['token_accuracy']:.3f} | "
                f"{s['edit_distance']:.3f} |"
            )
    return "\n".join(lines)


def test_memorization_table_is_the_committed_runs_results():
    # `<!-- memorization table: FOLDER -->` is followed by memorization_table(FOLDER).
    markers = re.findall(r"<!-- memorization table: (\S+) -->\n((?:\|.*\n)+)", _text())
    assert markers, "the memorization table lost its marker"
    for folder, table in markers:
        assert table.strip() == memorization_table(README.parent / folder), folder


def test_gpu_table_is_the_committed_rows():
    """Each GPU row's step time and tokens/s (docs/performance.md, and the README's
    speed table) are a row of docs/results/gpu_h100/step_table.json, and its MFU is
    6ND / step / peak."""
    results = json.loads((README.parent / "docs/results/gpu_h100/step_table.json").read_text())
    measured = {}
    for section in results["sections"]:
        analytic = {}
        for row in section["rows"]:
            if row.get("gflop_analytic"):
                analytic[(row["model"], row["batch"], row["source"])] = row["gflop_analytic"]
        for row in section["rows"]:
            flops = analytic[(row["model"], row["batch"], row["source"])]
            peak = section["peaks_gflops"][row["dtype"]]
            mfu = 100 * flops / (row["step_ms"] / 1e3) / peak
            measured[round(row["tokens_per_s"])] = (row["step_ms"], mfu)
    performance = (README.parent / "docs/performance.md").read_text()
    section = performance.split("**Measured on one NVIDIA H100")[1].split("What the lease")[0]
    rows = [line.split(" | ") for line in section.splitlines() if " ms | " in line]
    assert len(rows) == 5
    for cells in rows:
        step_ms, mfu = measured[int(cells[3].replace(",", ""))]
        digits = len(cells[2].removesuffix(" ms").split(".")[1])
        assert float(cells[2].removesuffix(" ms")) == round(step_ms, digits), cells
        assert float(cells[5].split("%")[0]) == round(mfu, 1), cells
    speed = README.read_text().split("## Speed")[1].split("\n## ")[0]
    gpu_row = next(line for line in speed.splitlines() if "(`benchmarks/gpu.sh`) |" in line)
    quoted = re.findall(r"(\d{1,3}(?:,\d{3})+) tokens/s|(\d{1,3}(?:,\d{3})+) ghost", gpu_row)
    figures = [int((a or b).replace(",", "")) for a, b in quoted]
    assert figures and all(figure in measured for figure in figures), gpu_row
