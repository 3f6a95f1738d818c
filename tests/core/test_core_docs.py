"""Issue 64 item 5: the core's documentation pages run and recommend the current API.

`tests/test_docs.py` runs every ```python block of the site that is not marked
`<!-- needs: ... -->`; here, every block of the core pages (docs/core*.md) must
be among those it runs, and the comparison with jax_privacy must recommend
`dp_multi_steps`, naming `dp_accumulate_aggregate` only as deprecated.
"""

import pathlib
import re

from tests import test_docs

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
CORE_PAGES = sorted(DOCS.glob("core*.md"))


def test_every_python_block_of_the_core_pages_runs_in_test_docs():
    assert {p.name for p in CORE_PAGES} >= {"core.md", "core_api.md", "core_vs_jax_privacy.md"}
    run = {(path.name, body) for path, _, body in test_docs._python_examples()}
    blocks = list(test_docs._blocks("python", CORE_PAGES))
    assert len(blocks) >= 3, blocks  # the MLP, the NNX LM and the Flax LM of core.md
    skipped = [f"{p.name}: {comment}" for p, comment, body in blocks if (p.name, body) not in run]
    assert not skipped, f"core docs blocks that tests/test_docs.py does not run: {skipped}"


def test_the_comparison_recommends_dp_multi_steps_not_the_deprecated_form():
    text = (DOCS / "core_vs_jax_privacy.md").read_text()
    assert "dp_multi_steps" in text
    for sentence in re.split(r"(?<=[.;|])\s", text):
        if "dp_accumulate_aggregate" in sentence:
            assert "deprecated" in sentence, sentence
