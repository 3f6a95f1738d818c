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
# `python -m dpnmt.train` children: no compilation cache in the user's home
# (dpnmt.training.compilation_cache); a sweep's own jax_cache still applies.
os.environ.setdefault("DPNMT_COMPILATION_CACHE", "off")
# Public vocabularies (dpnmt.data.public_vocab) built by tests go to a temporary
# folder, not the user's ~/.cache; removed when the session ends.
if "DPNMT_CACHE_DIR" not in os.environ:
    import atexit  # noqa: E402
    import shutil  # noqa: E402
    import tempfile  # noqa: E402

    os.environ["DPNMT_CACHE_DIR"] = tempfile.mkdtemp(prefix="dpnmt-test-cache-")
    atexit.register(shutil.rmtree, os.environ["DPNMT_CACHE_DIR"], ignore_errors=True)

import hypothesis  # noqa: E402

# Derandomized: the same examples every run, so CI failures reproduce.
hypothesis.settings.register_profile(
    "dpnmt", max_examples=25, deadline=None, derandomize=True, print_blob=True
)
hypothesis.settings.load_profile("dpnmt")
