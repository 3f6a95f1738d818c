"""Noise cost: `noise_mode="float"` (float32 Gaussian) vs `"secure"` (discrete Gaussian on a grid).

One `core.noisy_average` release (noise once on the accumulated sum, ÷ L) of a
flat parameter vector of each size, both modes compiled once and then taking
turns release by release (`benchmarks.timing.time_interleaved`), so that load
on the machine hits both alike. Printed per size: median seconds per release
and the secure/float ratio; `--json` writes the same numbers.

    python -m benchmarks.secure_noise                       # 1M, 16M, 60M (t5-small) parameters
    python -m benchmarks.secure_noise --sizes=1000000 --steps=3
"""

import json
import statistics

import jax
import jax.numpy as jnp
from absl import app, flags

from benchmarks.timing import time_interleaved
from dpnmt import core

_SIZES = flags.DEFINE_list("sizes", ["1000000", "16000000", "60000000"], "Parameters per release.")
_STEPS = flags.DEFINE_integer("steps", 3, "Timed releases per mode (after 2 warm-up ones).")
_JSON = flags.DEFINE_string("json", "", "Where to write the results (empty: print only).")
SIGMA, L2_CLIP, LOT = 1.0, 1.0, 512.0


def _release(size: int, mode: str):
    state = core.init_accumulator({"w": jnp.zeros((size,), jnp.float32)})
    fn = jax.jit(
        lambda st, k: core.noisy_average(
            st, k, noise_multiplier=SIGMA, l2_clip=L2_CLIP, expected_lot_size=LOT, noise_mode=mode
        )["w"]
    )
    keys = iter(jax.random.split(jax.random.key(0), 1000))
    return lambda: fn(state, next(keys)).block_until_ready()


def main(argv):
    del argv
    rows = []
    print("| parameters | float (s) | secure (s) | secure / float |")
    print("|---:|---:|---:|---:|")
    for size in map(int, _SIZES.value):
        times = time_interleaved({m: _release(size, m) for m in ("float", "secure")}, _STEPS.value)
        median = {mode: statistics.median(t) for mode, t in times.items()}
        rows.append({"parameters": size, **{f"{m}_s": v for m, v in median.items()}})
        ratio = median["secure"] / median["float"]
        print(f"| {size:,} | {median['float']:.3f} | {median['secure']:.2f} | {ratio:.0f}× |")
    if _JSON.value:
        with open(_JSON.value, "w") as f:
            json.dump({"sigma": SIGMA, "l2_clip": L2_CLIP, "lot": LOT, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    app.run(main)
