"""One process of a multi-process test run, started by `test_multiprocess.py`.

    python multiprocess_worker.py MODE PORT NUM_PROCESSES PROCESS_ID WORKDIR [STOP_AFTER]

MODE `train`: a DP training of the shrunken tiny config (`small_config`) in
WORKDIR, stopping after STOP_AFTER steps if given. MODE `release`: one sharded
DP lot gradient (`training.make_lot_step`, the step training runs) of a linear
loss, whose result process 0 saves to WORKDIR/release.npz. MODE `die`: the last
process exits right after joining,
the others wait in a collective (they must fail, not hang). The caller sets
XLA_FLAGS (devices per process) and PYTHONPATH (this worktree).
"""

import sys

from dpnmt import distributed
from dpnmt.config import RunConfig
from dpnmt.training import loop


def small_config():
    """`configs/tiny.py:eps8` shrunk to a few seconds of work (as the test shrinks it)."""
    from tests.small_configs import smaller_config

    c = smaller_config("eps8")
    c.data.max_train_examples = 200
    # Per-lot tokenization (the split runs) has no length buckets: none here either,
    # so the one-process reference feeds the same micro-batches.
    c.data.length_buckets = "none"
    c.train.expected_lot_size = 32
    c.train.checkpoint_every_steps = 2
    c.train.log_every_steps = 100
    return c


def release(workdir: str):
    """The lot gradient of fixed per-example vectors, rows split over all processes."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from dpnmt import bridge, core, training

    dim, rows = RELEASE_DIM, RELEASE_ROWS
    examples = release_examples()
    mesh = bridge.make_data_mesh()
    step = training.make_lot_step(  # The step dpnmt.train runs.
        lambda params, example, _: jnp.dot(params["w"], example["x"]),
        optax.identity(),
        training.StepPrivacy(True, RELEASE_CLIP, RELEASE_SIGMA, RELEASE_LOT),
        mesh,
    )
    micro = {
        "x": examples,
        bridge.MASK: np.ones(rows, np.float32),
        bridge.EXAMPLE_INDEX: np.arange(rows, dtype=np.int32),
    }
    params = jax.device_put({"w": jnp.zeros(dim)}, bridge.replicated_sharding(mesh))
    key = core.noise_key_for_step(
        core.key_from_seed(RELEASE_SEED, allow_fixed_seed_for_testing=True), 0
    )
    grad = training.lot_gradient(step, params, [bridge.shard_microbatch(micro, mesh)], key)
    local = np.asarray(grad["w"].addressable_data(0))
    if distributed.is_primary():
        np.savez(f"{workdir}/release.npz", w=local)


RELEASE_DIM, RELEASE_ROWS, RELEASE_LOT = 4096, 16, 16
RELEASE_CLIP, RELEASE_SIGMA, RELEASE_SEED = 2.0, 1.5, 11


def release_examples():
    """`[rows, dim]` per-example gradients, each of norm 1 < C (never clipped)."""
    import numpy as np

    x = np.random.default_rng(0).normal(size=(RELEASE_ROWS, RELEASE_DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def main(argv):
    mode, port, num_processes, process_id, workdir = argv[1:6]
    stop_after = int(argv[6]) if len(argv) > 6 else None
    launch = None  # One process: no jax.distributed at all (the reference run).
    if int(num_processes) > 1:
        launch = distributed.resolve_launch(
            f"127.0.0.1:{port}", int(num_processes), int(process_id)
        )
    distributed.initialize(launch, initialization_timeout_s=60, heartbeat_timeout_s=10)
    if mode == "release":
        release(workdir)
        return
    if mode == "die":
        import os

        if int(process_id) == int(num_processes) - 1:
            os._exit(3)  # A crash: no clean shutdown of jax.distributed.
        release(workdir)  # Blocks in its all-reduce until the runtime gives up.
        return
    import jax

    # Compiles in about half the time; every training run of the test (the
    # one-process reference too) uses it, so results compare like for like.
    jax.config.update("jax_disable_most_optimizations", True)
    _record_encoded_train_rows(workdir, int(process_id))
    loop.train_and_evaluate(RunConfig.of(small_config()), workdir, stop_after_steps=stop_after)


ENCODED_ROWS = "encoded_train_rows_{}.txt"


def _record_encoded_train_rows(workdir: str, process_id: int):
    """Appends every train row this process tokenizes on demand to a file in `workdir`."""
    from dpnmt.data import preprocess

    encode = preprocess.OnDemandSplit.encode
    path = f"{workdir}/{ENCODED_ROWS.format(process_id)}"

    def recording(self, indices):
        with open(path, "a") as f:  # One line per call, i.e. per micro-batch.
            f.write(" ".join(str(int(i)) for i in indices) + "\n")
        return encode(self, indices)

    preprocess.OnDemandSplit.encode = recording


def encoded_train_rows(workdir, process_id: int) -> list[list[int]]:
    """The train rows process `process_id` tokenized, per micro-batch (one list per call)."""
    with open(f"{workdir}/{ENCODED_ROWS.format(process_id)}") as f:
        return [[int(i) for i in line.split()] for line in f]


if __name__ == "__main__":
    main(sys.argv)
