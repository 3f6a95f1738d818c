"""DP lot step cost of full fine-tuning vs LoRA vs bias-only, side by side.

The trainer's own lot step (`training.make_lot_step`: ghost clipping, noise
once, ÷ L, Adam) on a small random mBART, one micro-batch per lot. The modes
differ only in what trains: everything, LoRA adapters (the base frozen), or
the bias terms. They run in one process taking turns step by step, so that
machine load hits all alike; each mode's peak RSS comes from a one-step
subprocess of its own.

    python -m benchmarks.peft_step                      # batch 32, seq 32
    python -m benchmarks.peft_step --lora_rank=16 --lora_targets=q,k,v,o,fc1,fc2

Printed per mode: trainable parameters, Adam state MiB, median step ms,
examples/s, XLA temporary memory of the gradient step, peak RSS.
"""

import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys

from absl import app, flags

from benchmarks.timing import time_interleaved

_MODES = flags.DEFINE_list("modes", ["full", "lora", "bias"], "full | lora | bias.")
_BATCH = flags.DEFINE_integer("batch", 32, "Rows per micro-batch (= lot).")
_SEQ = flags.DEFINE_integer("seq", 32, "Source = target tokens.")
_STEPS = flags.DEFINE_integer("steps", 5, "Timed steps per mode (after 2 warm-up steps).")
_RANK = flags.DEFINE_integer("lora_rank", 8, "LoRA rank.")
_TARGETS = flags.DEFINE_list("lora_targets", ["q", "v"], "Layers with adapters.")
_D_MODEL = flags.DEFINE_integer("d_model", 256, "mBART width.")
_LAYERS = flags.DEFINE_integer("layers", 3, "Encoder and decoder layers.")
_VOCAB = flags.DEFINE_integer("vocab_size", 16000, "Vocabulary size.")
_JSON = flags.DEFINE_string("json", "peft_step.json", "Where to write the results.")
_WORKER = flags.DEFINE_string("worker", None, "Internal: modes to run in this process.")

L2_CLIP, SIGMA = 1.0, 1.0


def _cell(mode: str):
    """(run one lot step, facts) for `mode` on the benchmark's mBART."""
    import jax
    import jax.numpy as jnp
    import optax

    from dpnmt import bridge, core, models, privacy, training
    from dpnmt.bridge.dataset import INPUT_IDS, INPUT_LENGTH, LABEL_LENGTH, LABELS

    d = _D_MODEL.value
    config = models.MBartConfig(
        vocab_size=_VOCAB.value,
        d_model=d,
        encoder_layers=_LAYERS.value,
        decoder_layers=_LAYERS.value,
        encoder_attention_heads=max(1, d // 64),
        decoder_attention_heads=max(1, d // 64),
        encoder_ffn_dim=4 * d,
        decoder_ffn_dim=4 * d,
        max_position_embeddings=max(64, _SEQ.value),
        dropout=0.1,
    )
    params = models.init_params(models.create_model(config), jax.random.key(0))
    if mode == "lora":
        spec = models.LoRASpec(_RANK.value, None, tuple(_TARGETS.value))
        config = dataclasses.replace(config, lora=spec)
        params = models.add_adapters(models.create_model(config), params, jax.random.key(1))
    model = models.create_model(config)
    predicate = {
        "full": lambda path, leaf: True,
        "lora": models.is_adapter,
        "bias": models.bias_only,
    }[mode]
    trainable, frozen = models.split_params(params, predicate)
    plan = privacy.PrivacyPlan(
        private=True,
        sampling="poisson",
        dataset_size=100 * _BATCH.value,
        expected_lot_size=_BATCH.value,
        num_steps=1000,
        steps_per_epoch=100,
        noise_multiplier=SIGMA,
        l2_clip=L2_CLIP,
        delta=1e-6,
        accountant="rdp",
    )
    tx = optax.adam(1e-4)
    mesh = bridge.make_data_mesh(jax.devices()[:1])
    step = training.make_lot_step(
        lambda p, example, key: training.example_loss(model, config, p, example, key),
        tx,
        training.StepPrivacy.from_plan(plan),
        mesh,
        clipping="ghost",
    )
    batch, seq = _BATCH.value, _SEQ.value
    ids = jax.random.randint(jax.random.key(2), (2, batch, seq), 3, config.vocab_size)
    micro = {
        INPUT_IDS: ids[0],
        INPUT_LENGTH: jnp.full((batch,), seq, jnp.int32),
        LABELS: ids[1],
        LABEL_LENGTH: jnp.full((batch,), seq, jnp.int32),
        bridge.MASK: jnp.ones((batch,), jnp.int32),
    }
    micro = jax.device_put(micro, bridge.batch_sharding(mesh))
    state = {"trainable": trainable, "opt": tx.init(trainable), "step": 0}
    acc0 = core.init_accumulator(trainable)
    compiled = step.add_microbatch.lower(acc0, trainable, frozen, micro, jax.random.key(3))
    temp = compiled.compile().memory_analysis().temp_size_in_bytes / 2**20

    def run():
        acc = core.init_accumulator(state["trainable"])
        key = jax.random.fold_in(jax.random.key(4), state["step"])
        acc, _ = step.add_microbatch(acc, state["trainable"], frozen, micro, key)
        lot_state = core.TrainState(jnp.int32(state["step"]), state["trainable"], state["opt"])
        lot_state = step.apply_lot(lot_state, acc, jax.random.key(5))
        state["trainable"], state["opt"] = lot_state.params, lot_state.opt_state
        state["step"] += 1
        jax.block_until_ready(state["trainable"])

    count = sum(x.size for x in jax.tree.leaves(trainable))
    total = sum(x.size for x in jax.tree.leaves(params))
    opt_mib = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state["opt"])) / 2**20
    return run, {
        "trainable_params": count,
        "total_params": total,
        "adam_state_mib": opt_mib,
        "xla_temp_mib": temp,
    }


def _worker(modes: list[str], steps: int) -> None:
    runs, results = {}, {}
    for mode in modes:
        runs[mode], results[mode] = _cell(mode)
    times = time_interleaved(runs, steps)
    for mode in modes:
        results[mode]["median_s"] = statistics.median(times[mode])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps({"modes": results, "peak_rss_mib": peak}))


def _subprocess(modes: list[str], steps: int) -> dict:
    flags_out = [
        f"--worker={','.join(modes)}",
        f"--steps={steps}",
        f"--batch={_BATCH.value}",
        f"--seq={_SEQ.value}",
        f"--lora_rank={_RANK.value}",
        f"--lora_targets={','.join(_TARGETS.value)}",
        f"--d_model={_D_MODEL.value}",
        f"--layers={_LAYERS.value}",
        f"--vocab_size={_VOCAB.value}",
    ]
    path = os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.peft_step", *flags_out],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=path),
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"worker {modes} failed: {done.stderr.strip()[-2000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def main(argv):
    del argv
    if _WORKER.value:
        _worker(_WORKER.value.split(","), _STEPS.value)
        return
    modes = _MODES.value
    rows = _subprocess(modes, _STEPS.value)["modes"]
    for mode in modes:
        rows[mode]["peak_rss_mib"] = _subprocess([mode], 1)["peak_rss_mib"]
    print(
        f"mBART d_model={_D_MODEL.value} layers={_LAYERS.value}+{_LAYERS.value} "
        f"vocab={_VOCAB.value}, {rows[modes[0]]['total_params'] / 1e6:.1f}M params; ghost "
        f"clipping, Adam, batch {_BATCH.value}, seq {_SEQ.value}; LoRA r={_RANK.value} on "
        f"{','.join(_TARGETS.value)}"
    )
    print(
        f"{'mode':<6} {'trainable':>11} {'Adam MiB':>9} {'step ms':>9} {'ex/s':>7} "
        f"{'XLA temp MiB':>13} {'peak RSS MiB':>13}"
    )
    for mode in modes:
        row = rows[mode]
        print(
            f"{mode:<6} {row['trainable_params']:>11,} {row['adam_state_mib']:>9.1f} "
            f"{row['median_s'] * 1e3:>9.0f} {_BATCH.value / row['median_s']:>7.1f} "
            f"{row['xla_temp_mib']:>13.0f} {row['peak_rss_mib']:>13.0f}"
        )
    with open(_JSON.value, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"wrote {_JSON.value}")


if __name__ == "__main__":
    app.run(main)
