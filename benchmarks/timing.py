"""Side-by-side timing shared by the benchmarks."""

import time


def time_interleaved(runs: dict, steps: int) -> dict[str, list[float]]:
    """Step times per mode, the modes taking turns so that load hits all alike."""
    for run in runs.values():
        for _ in range(2):  # Compile and warm up.
            run()
    times = {mode: [] for mode in runs}
    for _ in range(steps):
        for mode, run in runs.items():
            start = time.perf_counter()
            run()
            times[mode].append(time.perf_counter() - start)
    return times
