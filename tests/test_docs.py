"""The documentation site: it builds with warnings as errors, every page is in
its navigation, its code blocks are real, and a headless browser renders it.

One `mkdocs build --strict` per session (the `site` fixture) serves every test
that reads the built pages.
"""

import functools
import http.server
import importlib.util
import inspect
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading

import pytest
import yaml

from dpnmt import core
from tests.small_configs import load_config

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# Markdown under docs/ that is data the pages link to, not a page (mkdocs.yml's
# exclude_docs): the committed runs' tables and model card.
NOT_PAGES = ("results/",)
# A fenced block, possibly indented inside a list item; group 1 the comment line
# before it (if any), group 2 the language, group 3 its body.
FENCE = re.compile(
    r"(?:^[ \t]*(<!--[^\n]*-->)[ \t]*\n)?^([ \t]*)```(\w+)[^\n]*\n(.*?)^\2```", re.M | re.S
)


def _mkdocs_config() -> dict:
    # mkdocs.yml holds no Python tags, so safe_load reads it whole.
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def _nav_files(nav) -> list[str]:
    files = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        files += _nav_files(value) if isinstance(value, list) else [value]
    return files


def _pages() -> list[pathlib.Path]:
    return sorted(
        p for p in DOCS.rglob("*.md") if not p.relative_to(DOCS).as_posix().startswith(NOT_PAGES)
    )


def _blocks(language: str, paths=None):
    """(file, comment before the block or None, body) of each ```language block."""
    for path in paths or [ROOT / "README.md", *_pages()]:
        for comment, indent, lang, body in FENCE.findall(path.read_text()):
            if lang == language:
                body = "\n".join(line.removeprefix(indent) for line in body.splitlines())
                yield path, comment or None, body


def build_site(site_dir: pathlib.Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> pathlib.Path:
    site_dir = tmp_path_factory.mktemp("site")
    result = build_site(site_dir)
    # --strict aborts on a warning; any WARNING line that slipped through fails too.
    warnings = [line for line in result.stderr.splitlines() if "WARNING" in line]
    assert result.returncode == 0 and not warnings, "\n".join(warnings) or result.stderr
    return site_dir


def test_site_builds_with_warnings_as_errors(site):
    for page in _nav_files(_mkdocs_config()["nav"]):
        name = page.removesuffix(".md")
        html = site / ("index.html" if name == "index" else f"{name}/index.html")
        assert html.is_file(), f"{page} in the nav was not built"


def test_every_page_is_in_the_navigation():
    nav = _nav_files(_mkdocs_config()["nav"])
    pages = {p.relative_to(DOCS).as_posix() for p in _pages()}
    assert not pages - set(nav), f"pages missing from mkdocs.yml's nav: {sorted(pages - set(nav))}"
    assert not set(nav) - pages, f"nav entries with no page: {sorted(set(nav) - pages)}"
    assert len(nav) == len(set(nav)), "a page is twice in the nav"


def _commands(body: str) -> list[str]:
    """The block's commands, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", body)
    lines = [line.strip() for line in text.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_bash_blocks_name_real_modules_and_configs():
    checked = 0
    for path, _, body in _blocks("bash"):
        for command in _commands(body):
            where = f"{path.name}: {command.strip()[:120]}"
            for module in re.findall(r"python -m (dpnmt(?:\.\w+)*)", command):
                assert importlib.util.find_spec(module), f"no module {module} ({where})"
                checked += 1
            for spec in re.findall(r"--config=([^\s\"']+)", command):
                file, _, variant = spec.partition(":")
                if not file.endswith(".py"):
                    continue  # e.g. a "--config=..." placeholder in prose-like blocks
                config = ROOT / file
                assert config.is_file(), f"no config file {file} ({where})"
                load_config(config, variant or None)  # an unknown variant raises, naming it
                checked += 1
    assert checked >= 20, "the docs' commands were not found"


def _python_examples():
    return [(p, c, b) for p, c, b in _blocks("python") if not (c and c.startswith("<!-- needs:"))]


@pytest.mark.slow
def test_python_blocks_run_or_say_what_they_need(tmp_path):
    """Every ```python block runs as written, outside the project, or is marked
    `<!-- needs: REASON -->` (a GPU, the hub, a trained run's export)."""
    examples = _python_examples()
    assert any("from dpnmt import core" in body for _, _, body in examples)
    for number, (path, _, body) in enumerate(examples):
        script = tmp_path / f"example{number}.py"
        script.write_text(body)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        result = subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=300,
            env=env,
        )
        assert result.returncode == 0, f"{path.name}:\n{body}\n{result.stderr}"
        if "from dpnmt import core" in body:
            # The core guide's example: short, and it reports a small ε.
            assert len(body.strip().splitlines()) <= 25
            match = re.search(r"σ=([\d.]+), ε=([\d.]+)", result.stdout)
            assert match, result.stdout
            assert 0 < float(match.group(2)) <= 2.0
    for path, comment, _ in _blocks("python"):
        if comment and comment.startswith("<!-- needs:"):
            assert re.match(r"<!-- needs: \S.* -->", comment), f"{path.name}: {comment}"


def test_core_api_reference_is_generated_from_the_docstrings(site):
    page = (site / "core_api" / "index.html").read_text()
    for name in core.__all__:
        assert f'id="dpnmt.core.{name}"' in page, f"{name} missing from the API reference"
    assert "Padding rows point to index 0" in page  # dpnmt.core.sampling's module docstring
    # The package's section renders exactly __all__ (the public API); the other
    # top-level anchors are the modules' own sections.
    top = set(re.findall(r'id="dpnmt\.core\.(\w+)"', page))
    modules = {name for name in top if inspect.ismodule(getattr(core, name, None))}
    assert top - modules == set(core.__all__), sorted((top - modules) ^ set(core.__all__))


class _Server(http.server.ThreadingHTTPServer):
    requests: list[tuple[str, int]]


class _Handler(http.server.SimpleHTTPRequestHandler):
    def log_request(self, code="-", size="-"):
        self.server.requests.append((self.path, int(code)))

    def log_message(self, *args):  # the test reports what failed; no server log
        pass


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
HEADLESS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)  # fmt: skip


@pytest.mark.skipif(
    not CHROMIUM, reason="needs Debian's chromium (apt-get install chromium; .ci/run does)"
)
def test_a_headless_browser_renders_the_navigation_and_figures(site, tmp_path):
    server = _Server(("127.0.0.1", 0), functools.partial(_Handler, directory=str(site)))
    server.requests = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    titles = [next(iter(e)) for e in _mkdocs_config()["nav"]]
    try:
        for page in ("", "results/"):
            profile = tmp_path / f"profile{len(server.requests)}"
            result = subprocess.run(
                [CHROMIUM, *HEADLESS, f"--user-data-dir={profile}", "--virtual-time-budget=10000",
                 "--dump-dom", f"{base}/{page}"],
                capture_output=True, text=True, timeout=180,
            )  # fmt: skip
            dom = result.stdout
            assert 'class="md-nav' in dom, f"/{page}: no navigation\n{result.stderr[-2000:]}"
            for title in titles:
                assert title in dom, f"/{page}: the navigation lacks {title!r}"
            images = re.findall(r'<img[^>]* src="([^"]+\.png)"', dom)
            assert images, f"/{page}: no figure"
            for src in images:
                name = src.lstrip("./")
                fetched = [code for path, code in server.requests if path.endswith(name)]
                assert fetched and set(fetched) == {200}, f"/{page}: figure {src} not loaded"
    finally:
        server.shutdown()
    loaded = {path for path, code in server.requests if code == 200}
    for figure in sorted((DOCS / "sweep").glob("*.png")):
        assert f"/sweep/{figure.name}" in loaded, f"{figure.name} never loaded by the results page"
