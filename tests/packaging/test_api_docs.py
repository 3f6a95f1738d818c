"""The API reference of dpnmt.core renders from its docstrings, warnings as errors."""

import pkgutil
import warnings

import pdoc  # requirements.lock and the [test] extra install it.

from dpnmt import core

# The package page (its `__all__`) and one page per module, for the module docs.
API_MODULES = ["dpnmt.core"] + [
    f"dpnmt.core.{module.name}" for module in pkgutil.iter_modules(core.__path__)
]


def test_core_api_reference_builds_without_warnings(tmp_path):
    pdoc.render.configure(docformat="google", search=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # chex.ArrayTree is a recursive alias (ForwardRef('ArrayTree')) that pdoc
        # cannot evaluate; pdoc then prints the alias as written. Every other
        # warning fails the build.
        warnings.filterwarnings(
            "ignore", message=r"Error parsing type annotation .* Import of ArrayTree failed"
        )
        pdoc.pdoc(*API_MODULES, output_directory=tmp_path)
    index = (tmp_path / "dpnmt" / "core.html").read_text()
    for name in core.__all__:
        assert f'id="{name}"' in index, f"{name} missing from the API reference"
    sampling = (tmp_path / "dpnmt" / "core" / "sampling.html").read_text()
    assert "Padding rows point to index 0" in sampling
