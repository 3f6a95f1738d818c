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
