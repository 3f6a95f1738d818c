"""Test-only: kill the process with SIGKILL at a named point, to test what a kill leaves.

The fault-injection tests (`tests/train/test_faults.py`) start an app with
`DPNMT_TESTING_ONLY_KILL_AT=<point>`; when the app reaches that point it kills
itself as `kill -9` would (no handler, no cleanup, no flush), and the test
checks that what is left on disk is whole and that a rerun is exact and never
under-counts ε. Unset (always, outside those tests) `reached` does nothing.
"""

import os
import signal

ENV_VAR = "DPNMT_TESTING_ONLY_KILL_AT"

# The points, each named where it is reached.
EXPORT_WEIGHTS_WRITTEN = "export_weights_written"  # Weights and tokenizer, not yet dpnmt.json.
CHECKPOINT_COMMITTED = "checkpoint_committed"  # Orbax committed a step, not yet scrubbed.


def reached(point: str, step: int | None = None) -> None:
    """SIGKILLs this process if `$DPNMT_TESTING_ONLY_KILL_AT` names `point`; else nothing.

    Args:
      point: where the caller is (one of the names above).
      step: the lot the point is reached at, if any: `<point>@<step>` kills only there.
    """
    wanted = os.environ.get(ENV_VAR)
    if wanted is not None and wanted in (point, f"{point}@{step}"):
        os.kill(os.getpid(), signal.SIGKILL)
