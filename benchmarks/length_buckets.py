"""Training examples/s on Multi30K with and without length buckets (`data.length_buckets`).

Builds a run of `configs/multi30k_dp_vocab.py:eps8` (its corpus, DP-SentencePiece
vocabulary, Poisson lots and DP lot step; a smaller model unless
`--model=config`), then feeds the same lots through the trainer's pipeline
(`bridge.device_lots`) and step (`add_microbatch` per micro-batch, then the
noisy release) once per mode: every micro-batch padded to the max lengths,
and grouped into length buckets ("auto" and the config's, or each
`--buckets`). The modes take turns lot by lot (ABC CBA ...), so machine load
hits all alike; every shape is compiled before timing.
It prints examples/s, the mean padded tokens per row, and the speed-up.
A benchmark, never a timed test; the fixed seed is for this measurement only.

Run: DPNMT_DATA_DIR=../shared/data python -m benchmarks.length_buckets [--lots=10]
  [--buckets=auto --buckets=24,32,40,48] [--model=config]
"""

import argparse
import logging
import tempfile
import time

import jax
import numpy as np

from configs import multi30k_dp_vocab as multi30k
from dpnmt import bridge, core
from dpnmt.bridge import buckets as bucket_lengths
from dpnmt.bridge.dataset import INPUT_IDS, LABELS
from dpnmt.training import setup

SMALL_MODEL = dict(d_model=128, d_kv=32, d_ff=256, num_heads=4, num_layers=2, num_decoder_layers=2)


def _config(args):
    config = multi30k.get_config("eps8")
    if args.model == "small":
        config.model.update(SMALL_MODEL)
    config.train.expected_lot_size = args.lot_size
    config.dp.target_epsilon, config.dp.noise_multiplier = None, 1.0  # σ does not change cost.
    config.noise_seed = 0  # This benchmark only: no privacy is claimed.
    config.testing_only_fixed_noise_seed_NO_PRIVACY = True
    return config


def _padding_microbatch(run, shape):
    """An all-masked micro-batch of `shape` (compiles that shape, adds nothing)."""
    b = run.config.train.physical_batch_size
    pad = run.data.train_examples.pad_values
    micro = {
        INPUT_IDS: np.full((b, shape[0]), pad[INPUT_IDS], np.int32),
        "input_length": np.zeros(b, np.int32),
        LABELS: np.full((b, shape[1]), pad[LABELS], np.int32),
        "label_length": np.zeros(b, np.int32),
        bridge.MASK: np.zeros(b, np.float32),
        bridge.EXAMPLE_INDEX: np.full(b, bridge.PADDING_INDEX, np.int32),
    }
    return bridge.shard_microbatch(micro, run.step.mesh)


def _lot_seconds(run, lot, buckets, trainable, frozen, key):
    """Wall seconds of one lot: host pipeline, every micro-batch, the release."""
    start = time.perf_counter()
    with bridge.device_lots(
        [lot],
        run.step.mesh,
        run.config.train.physical_batch_size,
        pad_values=run.data.train_examples.pad_values,
        rows_from=run.data.train_examples,
        length_buckets=buckets,
    ) as prefetched:
        microbatches = next(prefetched)
    acc = jax.device_put(
        core.init_accumulator(trainable), bridge.replicated_sharding(run.step.mesh)
    )
    for index, micro in enumerate(microbatches):
        acc, _ = run.step.step_fns.add_microbatch(
            acc, trainable, frozen, micro, jax.random.fold_in(key, index)
        )
    jax.block_until_ready(run.step.step_fns.release(acc, key))
    tokens = sum(m[INPUT_IDS].shape[1] + m[LABELS].shape[1] for m in microbatches)
    return time.perf_counter() - start, tokens, len(microbatches)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lots", type=int, default=10, help="Lots timed per mode.")
    parser.add_argument("--lot_size", type=int, default=256, help="L, expected rows per lot.")
    parser.add_argument("--model", choices=["small", "config"], default="small")
    parser.add_argument(
        "--buckets",
        action="append",
        help="data.length_buckets to time, repeatable (default: auto and the config's).",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    config = _config(args)
    with tempfile.TemporaryDirectory() as workdir:
        run = setup.build_run(config, workdir)
    full_shape = (config.data.max_source_length, config.data.max_target_length)
    modes = {"max lengths": None}
    for spec in dict.fromkeys(args.buckets or (bucket_lengths.AUTO, config.data.length_buckets)):
        buckets = bridge.resolve_length_buckets(spec, *full_shape, lengths_known=True)
        if buckets is None:
            raise SystemExit(f"--buckets={spec} gives no buckets; pass e.g. auto or 16,32,48.")
        lengths = ",".join(str(max(shape)) for shape in buckets.shapes)
        modes[f"buckets {spec}" + (f" ({lengths})" if lengths != spec else "")] = buckets
    shapes = dict.fromkeys(
        [shape for buckets in modes.values() if buckets for shape in buckets.shapes] + [full_shape]
    )
    trainable, frozen = jax.device_put(
        (run.model.trainable, run.model.frozen), bridge.replicated_sharding(run.step.mesh)
    )
    key = jax.random.key(0)
    compile_start = time.perf_counter()
    for shape in shapes:
        # The accumulator placed as the loop places it (one compile per shape).
        acc = jax.device_put(
            core.init_accumulator(trainable), bridge.replicated_sharding(run.step.mesh)
        )
        acc, _ = run.step.step_fns.add_microbatch(
            acc, trainable, frozen, _padding_microbatch(run, shape), key
        )
        jax.block_until_ready(run.step.step_fns.release(acc, key))
    compile_s = time.perf_counter() - compile_start

    totals = {mode: [0.0, 0, 0, 0] for mode in modes}  # seconds, examples, tokens, rows
    lots = iter(run.step.lots)
    for number in range(args.lots):
        lot = next(lots)
        order = list(modes) if number % 2 == 0 else list(modes)[::-1]  # ABC CBA ...
        for mode in order:
            seconds, tokens, count = _lot_seconds(run, lot, modes[mode], trainable, frozen, key)
            total = totals[mode]
            total[0] += seconds
            total[1] += len(lot.indices)
            total[2] += tokens * config.train.physical_batch_size
            total[3] += count * config.train.physical_batch_size

    model = "as configured"
    if args.model == "small":
        model = "small: " + ", ".join(f"{k}={v}" for k, v in SMALL_MODEL.items())
    print(
        f"Multi30K de-en, configs/multi30k_dp_vocab.py:eps8, model {model}, "
        f"L={args.lot_size}, b={config.train.physical_batch_size}, {args.lots} lots per mode "
        f"(alternating), {jax.device_count()} {jax.devices()[0].platform} device(s); "
        f"compiling {len(shapes)} shapes took {compile_s:.0f} s (not timed below)."
    )
    print("| mode | examples/s | s/lot | padded tokens per row (source + target) |")
    print("|---|---|---|---|")
    rates = {}
    for mode, (seconds, examples, tokens, rows) in totals.items():
        rates[mode] = examples / seconds
        print(
            f"| {mode} | {rates[mode]:.1f} | {seconds / args.lots:.2f} | "
            f"{tokens / max(rows, 1):.1f} |"
        )
    plain = rates.pop("max lengths")
    for mode, rate in rates.items():
        print(f"Speed-up with {mode}: {rate / plain:.2f}x")


if __name__ == "__main__":
    main()
