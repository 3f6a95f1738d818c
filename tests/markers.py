"""Markers shared by test modules."""

import os

import pytest

needs_data = pytest.mark.skipif(
    not os.environ.get("DPNMT_DATA_DIR"),
    reason="needs the shared corpora: set DPNMT_DATA_DIR (e.g. ../shared/data)",
)
