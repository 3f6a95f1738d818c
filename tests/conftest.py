"""Test-wide setup: 8 host CPU devices for sharding tests, hypothesis profile.

XLA reads XLA_FLAGS once, when the first JAX backend starts, so the flag is set
here, before any test module imports jax.
"""

import os

# 8 host devices; and a patient CPU collective rendezvous: its default aborts the
# whole process when 8 device threads on a loaded 2-core machine join an
# all-reduce more than 40 s apart (seen here while other jobs ran).
COLLECTIVE_TIMEOUT_FLAGS = (
    "--xla_cpu_collective_timeout_seconds=1200",
    "--xla_cpu_collective_call_terminate_timeout_seconds=1200",
)
for _flag in ("--xla_force_host_platform_device_count=8", *COLLECTIVE_TIMEOUT_FLAGS):
    if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tests run children in other folders (tmp_path): a relative data root such as
# .ci/run's ../shared/data would not resolve there.
if os.environ.get("DPNMT_DATA_DIR"):
    os.environ["DPNMT_DATA_DIR"] = os.path.abspath(os.environ["DPNMT_DATA_DIR"])
# Public vocabularies (dpnmt.data.public_vocab) and the compiled programs of
# `python -m dpnmt.train` children (dpnmt.training.compilation_cache, "auto") go
# to one temporary folder for the session, never the user's ~/.cache; removed
# when the session ends. pytest-xdist workers inherit the controller's folder.
# Children of the same tiny configs then load programs an earlier test compiled
# (CI time); a loaded program is the one compiled, so results do not change.
if "DPNMT_CACHE_DIR" not in os.environ:
    import atexit  # noqa: E402
    import shutil  # noqa: E402
    import tempfile  # noqa: E402

    os.environ["DPNMT_CACHE_DIR"] = tempfile.mkdtemp(prefix="dpnmt-test-cache-")
    atexit.register(shutil.rmtree, os.environ["DPNMT_CACHE_DIR"], ignore_errors=True)
    # The σ of every calibration the suite makes (tests/sigma_hints.json, from a
    # run with a kept DPNMT_CACHE_DIR; WORKSPACE.md says how to refresh it): each
    # calibration then proves its hint in two ε evaluations instead of searching
    # (CI time; the same σ, see dpnmt.sigma_hints).
    from dpnmt import sigma_hints  # noqa: E402 - imports no jax.

    os.makedirs(os.path.dirname(sigma_hints.path()))
    shutil.copyfile(os.path.join(os.path.dirname(__file__), sigma_hints.FILE), sigma_hints.path())
os.environ.setdefault("DPNMT_COMPILATION_CACHE", os.path.join(os.environ["DPNMT_CACHE_DIR"], "jax"))
# Every program is cached however fast it compiled (JAX's own variable, read when
# jax is imported; `compilation_cache.enable` leaves it as set): the suite
# compiles thousands of sub-second programs that later tests load (CI time).
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import hypothesis  # noqa: E402

# Derandomized: the same examples every run, so CI failures reproduce.
hypothesis.settings.register_profile(
    "dpnmt", max_examples=25, deadline=None, derandomize=True, print_blob=True
)
hypothesis.settings.load_profile("dpnmt")


import pytest  # noqa: E402

from dpnmt.training import compilation_cache  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _shared_compilation_cache():
    """JAX's persistent compilation cache on for in-process tests: the children's folder.

    In-process runs rebuild their jitted functions, so each would compile its
    programs again; with the cache, a program of the same shapes, constants and
    flags that an earlier test or child (either xdist worker) compiled is loaded
    instead (CI time). A loaded program is the one compiled: results do not
    change. Tracing and lowering still happen (`train.profile` counts them as
    compile time). `DPNMT_COMPILATION_CACHE=off` leaves it off.
    """
    folder = compilation_cache.resolve(compilation_cache.AUTO)
    if folder is None:
        yield
        return
    import jax
    from jax.experimental.compilation_cache import compilation_cache as jax_cache

    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", folder)
    jax_cache.reset_cache()  # JAX decides once whether the cache is on; ask again.
    yield
    jax.config.update("jax_compilation_cache_dir", before)
    jax_cache.reset_cache()


def pytest_configure(config):
    # pytest-xdist would sort files by their number of tests, putting the long files with
    # few tests last: keep the order pytest_collection_modifyitems gives (tests/file_seconds.txt).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def _listed(name):
    """The non-comment lines of tests/`name`, stripped."""
    import pathlib

    lines = pathlib.Path(__file__).with_name(name).read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def pytest_collection_modifyitems(config, items):
    """Marks the measured heavy tests (tests/fast_lane_heavy.txt) slow: the fast lane ≤ 5 min;
    puts the longest files (tests/file_seconds.txt) first, longest first (CI time)."""
    whole_suite = len(items) > 1000 and not config.getoption("-k")
    seconds = {
        path: float(value) for value, path in (line.split() for line in _listed("file_seconds.txt"))
    }
    files = {item.nodeid.split("::")[0] for item in items}
    if whole_suite and set(seconds) - files:
        gone = sorted(set(seconds) - files)[:3]
        raise pytest.UsageError(f"tests/file_seconds.txt names files that do not exist: {gone}")
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], 0.0))  # Stable.

    heavy = set(_listed("fast_lane_heavy.txt"))
    found = set()
    for item in items:
        if item.nodeid in heavy:
            item.add_marker(pytest.mark.slow)
            found.add(item.nodeid)
    # A renamed test must leave the list too (only checked when the whole suite is collected).
    if whole_suite and heavy - found:
        raise pytest.UsageError(
            f"tests/fast_lane_heavy.txt names tests that do not exist: {sorted(heavy - found)[:3]}"
        )
