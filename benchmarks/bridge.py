"""Throughput of the Opacus -> JAX bridge alone (no model).

N = 100k synthetic tokenized pairs, L = 4096, b = 32. Prints lots/s and
micro-batches/s per stage. Realised Poisson lot sizes are private, so only
rates aggregated over many lots are printed. The ratio bridge time / DP step
time needs a model step; divide the "prefetched pipeline" seconds-per-lot by
the trainer's step time once one exists. `--with_dp_step` times one DP lot
gradient of a randomly initialised T5-small (`dpnmt.models`) on the same lots
and prints the ratio; use it on an accelerator (it is slow on CPU).

Run: python -m benchmarks.bridge [--num_examples=100000 --lot_size=4096 ...]
"""

import argparse
import itertools
import time

import jax
import numpy as np

from dpnmt.bridge import (
    PoissonLots,
    ShuffledLots,
    TokenizedExamples,
    device_lots,
    make_data_mesh,
    shard_microbatch,
    to_microbatches,
)


def synthetic_pairs(num_examples, max_length, vocab_size, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(max_length // 4, max_length + 1, size=(2, num_examples))
    tokens = rng.integers(4, vocab_size, size=(2, num_examples, max_length), dtype=np.int32)
    source = [tokens[0, i, : lengths[0, i]] for i in range(num_examples)]
    target = [tokens[1, i, : lengths[1, i]] for i in range(num_examples)]
    return source, target


def timed_map(function, inputs):
    """(seconds, outputs) of `function` applied to each input in turn."""
    start = time.perf_counter()
    outputs = [function(x) for x in inputs]
    return time.perf_counter() - start, outputs


def time_dp_step(dataset, lot_microbatches, mesh, lot_size):
    """Seconds for one DP lot gradient of a random T5-small over `lot_microbatches`."""
    import jax.numpy as jnp  # noqa: PLC0415
    import optax  # noqa: PLC0415

    from dpnmt import (
        models,  # noqa: PLC0415 - optional: only with --with_dp_step
        training,  # noqa: PLC0415
    )
    from dpnmt.bridge import replicated_sharding  # noqa: PLC0415

    config = models.T5Config(dropout_rate=0.0, pad_token_id=dataset.pad_id)
    model = models.create_model(config)
    params = jax.device_put(models.init_params(model, jax.random.key(0)), replicated_sharding(mesh))

    def loss_fn(params, example):
        """Mean token cross-entropy of ONE example (its own target tokens only)."""
        source_len = example["input_ids"].shape[0]
        target_len = example["labels"].shape[0]
        source_mask = (jnp.arange(source_len) < example["input_length"]).astype(jnp.int32)
        target_mask = (jnp.arange(target_len) < example["label_length"]).astype(jnp.int32)
        start = jnp.full((1,), config.decoder_start_token_id, jnp.int32)
        decoder_input_ids = jnp.concatenate([start, example["labels"][:-1]])
        logits = model.apply(
            {"params": params},
            example["input_ids"][None],
            source_mask[None],
            decoder_input_ids[None],
            target_mask[None],
        )[0]
        log_probs = jax.nn.log_softmax(logits.astype(jnp.float32))
        nll = -jnp.take_along_axis(log_probs, example["labels"][:, None], axis=-1)[:, 0]
        return jnp.sum(nll * target_mask) / jnp.maximum(jnp.sum(target_mask), 1)

    step = training.make_lot_step(  # The step dpnmt.train runs.
        lambda p, example, _: loss_fn(p, example),
        optax.identity(),
        training.StepPrivacy(True, 1.0, 1.0, lot_size),
        mesh,
    )
    gradient = training.lot_gradient
    jax.block_until_ready(
        gradient(step, params, lot_microbatches[:1], jax.random.key(1))
    )  # compile
    start = time.perf_counter()
    jax.block_until_ready(gradient(step, params, lot_microbatches, jax.random.key(2)))
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_examples", type=int, default=100_000)
    parser.add_argument("--lot_size", type=int, default=4096)
    parser.add_argument("--physical_batch_size", type=int, default=32)
    parser.add_argument("--max_length", type=int, default=128)
    parser.add_argument("--num_lots", type=int, default=24)
    parser.add_argument("--with_dp_step", action="store_true", help="also time a T5-small step")
    args = parser.parse_args()

    start = time.perf_counter()
    source, target = synthetic_pairs(args.num_examples, args.max_length, 32_000)
    dataset = TokenizedExamples(
        source, target, max_source_length=args.max_length, max_target_length=args.max_length
    )
    build_seconds = time.perf_counter() - start
    mesh = make_data_mesh()
    rows = []

    for name, lots in (
        ("PoissonLots", PoissonLots(dataset, args.lot_size, seed=0)),
        ("ShuffledLots", ShuffledLots(dataset, args.lot_size, seed=0)),
    ):
        iterator = iter(lots)
        seconds, sampled = timed_map(lambda _, it=iterator: next(it), range(args.num_lots))
        rows.append((f"{name}: sample + collate", seconds, args.num_lots, None))

    def split(lot):
        return to_microbatches(lot, args.physical_batch_size, pad_values=dataset.pad_values)

    seconds, split_lots = timed_map(split, sampled)
    num_microbatches = sum(len(m) for m in split_lots)
    rows.append(("to_microbatches", seconds, len(sampled), num_microbatches))

    def place(microbatches):
        arrays = [shard_microbatch(mb, mesh) for mb in microbatches]
        jax.block_until_ready(arrays)
        return arrays

    seconds, _ = timed_map(place, split_lots)
    rows.append(
        (f"shard_microbatch ({mesh.size} devices)", seconds, len(split_lots), num_microbatches)
    )

    poisson = PoissonLots(dataset, args.lot_size, seed=1)
    with device_lots(
        poisson, mesh, args.physical_batch_size, pad_values=dataset.pad_values
    ) as prefetcher:
        next(prefetcher)  # warm the thread up
        start = time.perf_counter()
        consumed = [jax.block_until_ready(m) for m in itertools.islice(prefetcher, args.num_lots)]
        seconds = time.perf_counter() - start
    rows.append(
        (
            "device_lots (Poisson, prefetched, all stages)",
            seconds,
            args.num_lots,
            sum(len(m) for m in consumed),
        )
    )

    print(
        f"\nbridge benchmark: N={args.num_examples:,} L={args.lot_size:,} "
        f"b={args.physical_batch_size} seq={args.max_length} devices={jax.device_count()} "
        f"({jax.devices()[0].platform}); dataset view built in {build_seconds:.2f}s\n"
    )
    if args.with_dp_step:
        lot_microbatches = consumed[0]
        step_seconds = time_dp_step(dataset, lot_microbatches, mesh, args.lot_size)
        bridge_seconds = seconds / args.num_lots
        rows.append(("DP lot gradient, T5-small (one lot)", step_seconds, 1, len(lot_microbatches)))
    header = f"{'stage':45s} {'lots/s':>9s} {'ms/lot':>9s} {'micro-batches/s':>16s}"
    print(header)
    print("-" * len(header))
    for stage, seconds, lots, microbatches in rows:
        micro_rate = f"{microbatches / seconds:16.0f}" if microbatches else f"{'-':>16s}"
        print(f"{stage:45s} {lots / seconds:9.2f} {1000 * seconds / lots:9.1f} {micro_rate}")
    if args.with_dp_step:
        print(
            f"\nbridge time / DP step time = {bridge_seconds:.3f}s / {step_seconds:.3f}s "
            f"= {bridge_seconds / step_seconds:.3%} (and the bridge runs in a background thread)"
        )


if __name__ == "__main__":
    main()
