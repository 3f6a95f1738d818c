"""Model FLOP utilisation (MFU) of the training step, against the machine's measured matmul peak.

Peak: the best of `--peak_repeats` runs of one jitted, warmed-up `jnp.dot` of
two `--peak_n` square matrices per dtype (2 n³ FLOPs; on all of the device's
cores; float32 at JAX's default precision, which is TF32 on Ampere and later
GPUs). Step: the trainer's own micro-batch step (`training.steps.make_lot_step`'s
`add_microbatch` on a one-device mesh: non-private `jax`, DP `ghost`, DP
`vmap`), built from a config with random token ids of full length; the modes of
a cell take turns step by step (`benchmarks.timing.time_interleaved`, median of
`--steps` after 2 warm-up steps). FLOPs per step are XLA's count of the
compiled program (`compile().cost_analysis()['flops']`); the `jax` row also
shows an analytic cross-check, 6 × (matmul parameters a token passes through)
× tokens (attention scores, softmax, norms and embedding gathers left out).
MFU = the model's FLOPs (XLA's count of the cell's non-private step, so that
what DP adds costs MFU; without `jax` in `--modes`, the mode's own count) /
step time / measured peak of the same dtype; `MFU % 6ND` the same with the
analytic count. On a GPU read the 6ND column: XLA's count there is far below
the matmuls done (H100, 2026-11-26: 899 GFLOP against 5,946 analytic for
t5-small at batch 128, 128 + 128 tokens; the library matmul calls are likely
not counted). GFLOP/s uses each mode's own count (the ghost norms included).
The once-per-lot release and optimizer update (`apply_lot`) are not in the
step: one per L / b micro-batches.

    python -m benchmarks.mfu                                   # Multi30K model, CPU
    python -m benchmarks.mfu --models=t5-small,mt5-small --dtypes=bfloat16,float32 \
        --batch_sizes=8,16,32,64,128 --seq_lens=128 --anchor   # benchmarks/gpu.sh does this
    python -m benchmarks.mfu --tiny                            # seconds: the test's size

Models: `multi30k` is `configs/multi30k.py`'s model (3+3 layers, d_model 256,
tied embeddings, its 8,000-piece vocabulary) at its length-bucket shapes
(`--batch_sizes`/`--seq_lens` do not apply) and its physical batch, or at
each of `--multi30k_batch_sizes` when given; `t5-small`
and `mt5-small` are those architectures built from config (random weights, no
download); `--tiny` shrinks every model to a few thousand parameters. Batches
of one cell grow in the given order and stop at the first that does not fit
in memory. `--epoch` adds one Multi30K epoch's time derived from the measured
`multi30k` bucket steps; `--anchor` the paper's WMT-16 epoch as examples and
tokens per second. A benchmark, never a timed test.
"""

import gc
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from benchmarks.timing import time_interleaved

_MODELS = flags.DEFINE_list("models", ["multi30k"], "multi30k, t5-small, mt5-small.")
_MODES = flags.DEFINE_list("modes", ["jax", "ghost", "vmap"], "jax (non-private), ghost, vmap.")
_DTYPES = flags.DEFINE_list("dtypes", ["float32"], "Parameter and compute dtypes.")
_BATCHES = flags.DEFINE_list("batch_sizes", ["32"], "Physical batch sizes, ascending.")
_MULTI30K_BATCHES = flags.DEFINE_list(
    "multi30k_batch_sizes", None, "multi30k's physical batch sizes (default: its config's)."
)
_SEQS = flags.DEFINE_list("seq_lens", ["128"], "Source = target lengths (not multi30k).")
_STEPS = flags.DEFINE_integer("steps", 5, "Timed steps per mode (after 2 warm-up steps).")
_PEAK_N = flags.DEFINE_integer("peak_n", 4096, "Side of the square matrices of the peak.")
_PEAK_REPEATS = flags.DEFINE_integer("peak_repeats", 10, "Peak: best of this many dots.")
_TINY = flags.DEFINE_bool("tiny", False, "Shrink every model, batch and the peak (a smoke run).")
_EPOCH = flags.DEFINE_bool("epoch", False, "One Multi30K epoch's time from the multi30k steps.")
_ANCHOR = flags.DEFINE_bool("anchor", False, "The paper's WMT-16 epoch as examples, tokens/s.")
_JSON = flags.DEFINE_string("json", None, "Also write the rows here.")

# Architectures only (random weights, built from config; no hub download).
SPECS = {
    "t5-small": dict(
        vocab_size=32128,
        d_model=512,
        d_kv=64,
        d_ff=2048,
        num_layers=6,
        num_decoder_layers=6,
        num_heads=8,
        feed_forward_proj="relu",
    ),  # fmt: skip
    "mt5-small": dict(
        vocab_size=250112,
        d_model=512,
        d_kv=64,
        d_ff=1024,
        num_layers=8,
        num_decoder_layers=8,
        num_heads=6,
        feed_forward_proj="gated-gelu",
    ),  # fmt: skip
}
TINY = dict(d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2)
TINY_VOCAB = 64

# Multi30K (configs/multi30k.py): 29,000 training pairs; its length buckets
# hold 26 / 45 / 21 / 9% of the public validation split's rows (the config's
# docstring), used as the share of each bucket's micro-batches in an epoch.
MULTI30K_TRAIN_PAIRS = 29_000
MULTI30K_BUCKET_SHARES = (0.26, 0.45, 0.21, 0.09)

# The paper's anchor (DP-NMT, mT5-small on WMT-16 de-en, 2 x A100): one epoch of
# N = 4,551,054 pairs (configs/wmt16.py) in 2 h 45 m (shuffled) / 4 h 08 m
# (Poisson); tokens counted at the config's max lengths, 128 + 128 a pair.
WMT16_PAIRS, WMT16_TOKENS_PER_PAIR, ANCHOR_GPUS = 4_551_054, 256, 2
ANCHOR_EPOCH_S = {"shuffled": 2 * 3600 + 45 * 60, "Poisson": 4 * 3600 + 8 * 60}

# Dense (no sparsity) peaks from NVIDIA's data sheets, TFLOP/s: bfloat16 and
# TF32 tensor cores (JAX's default float32 matmul on these cards).
NOMINAL_TFLOPS = {  # Matched in order against the device kind (nvidia-smi's name).
    "H200": {"bfloat16": 989.0, "float32": 494.7},
    "H100 PCIe": {"bfloat16": 756.0, "float32": 378.0},
    "H100": {"bfloat16": 989.0, "float32": 494.7},  # SXM.
    "A100": {"bfloat16": 312.0, "float32": 156.0},
}


def nominal_peak(device_kind: str) -> dict | None:
    """The data sheet's TFLOP/s per dtype of `device_kind`, or None if not listed."""
    for name, peaks in NOMINAL_TFLOPS.items():
        if all(part in device_kind for part in name.split()):
            return peaks
    return None


def matmul_peak_gflops(dtype: str, n: int, repeats: int) -> float:
    """GFLOP/s of the best of `repeats` jitted `[n, n] @ [n, n]` in `dtype`, after a warm-up."""
    a, b = jax.random.normal(jax.random.key(0), (2, n, n), dtype)
    dot = jax.jit(jnp.dot)
    jax.block_until_ready(dot(a, b))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(dot(a, b))
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def _multi30k():
    """configs/multi30k.py's model config, physical batch and bucket shapes."""
    from configs import multi30k  # noqa: PLC0415 - the repo's configs/, importable from its root.
    from dpnmt.config import RunConfig  # noqa: PLC0415

    run = RunConfig.parse(multi30k.get_config("nonprivate"))
    spec = {
        name: getattr(run.model, name)
        for name in ("d_model", "d_kv", "d_ff", "num_layers", "num_decoder_layers", "num_heads")
    }
    spec.update(vocab_size=run.tokenizer.vocab_size, feed_forward_proj=run.model.feed_forward_proj)
    lengths = [int(n) for n in run.data.length_buckets.split(",")]
    return spec, run.train.physical_batch_size, [(n, n) for n in lengths]


def model_config(spec: dict):
    """A dpnmt T5Config: tied embeddings for v1.0 (ReLU), an untied head for gated (mT5)."""
    from dpnmt import models  # noqa: PLC0415

    gated = spec["feed_forward_proj"].startswith("gated-")
    return models.T5Config(
        model_type="mt5" if gated else "t5",
        **spec,
        dropout_rate=0.1,
        tie_word_embeddings=not gated,
        scale_decoder_outputs=not gated,
    )


def analytic_gflops(config, batch: int, source: int, target: int) -> float:
    """6 x matmul parameters x tokens (GFLOP) of a non-private step, attention scores left out."""
    heads = config.num_heads * config.d_kv
    ffn = config.d_model * config.d_ff * (3 if config.is_gated_act else 2)
    attention = 4 * config.d_model * heads
    per_source = config.num_layers * (attention + ffn) + config.num_decoder_layers * attention // 2
    per_target = config.num_decoder_layers * (attention + attention // 2 + ffn)
    per_target += config.d_model * config.vocab_size
    return 6 * batch * (source * per_source + target * per_target) / 1e9


def _step(config, dtype: str, batch: int, source: int, target: int, mode: str):
    """The trainer's compiled `add_microbatch` of `mode`, a runner, and XLA's FLOP count."""
    import optax  # noqa: PLC0415

    from dpnmt import bridge, core, models, training  # noqa: PLC0415
    from dpnmt.bridge.dataset import INPUT_IDS, INPUT_LENGTH, LABEL_LENGTH, LABELS  # noqa: PLC0415

    model = models.create_model(config)
    params = models.init_params(model, jax.random.key(0))
    params = jax.tree.map(lambda p: p.astype(dtype), params)

    def loss_fn(p, example, key):
        return training.steps.example_loss(model, config, p, example, key)

    privacy = training.steps.StepPrivacy(mode != "jax", 1.0, 1.0, 512)
    mesh = bridge.make_data_mesh(jax.devices()[:1])
    step = training.steps.make_lot_step(
        loss_fn, optax.sgd(1e-3), privacy, mesh, clipping="ghost" if mode == "jax" else mode
    )
    rng = np.random.default_rng(0)
    micro = {
        INPUT_IDS: rng.integers(2, config.vocab_size, (batch, source), dtype=np.int32),
        INPUT_LENGTH: np.full(batch, source, np.int32),
        LABELS: rng.integers(2, config.vocab_size, (batch, target), dtype=np.int32),
        LABEL_LENGTH: np.full(batch, target, np.int32),
        bridge.MASK: np.ones(batch, np.float32),
        bridge.EXAMPLE_INDEX: np.arange(batch, dtype=np.int32),
    }
    micro = bridge.shard_microbatch(micro, mesh)
    trainable, frozen = jax.device_put((params, {}), bridge.replicated_sharding(mesh))
    acc = jax.device_put(core.init_accumulator(trainable), bridge.replicated_sharding(mesh))
    key = jax.random.key(1)
    compiled = step.add_microbatch.lower(acc, trainable, frozen, micro, key).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    state = {"acc": acc}

    def run():
        state["acc"], loss = compiled(state["acc"], trainable, frozen, micro, key)
        jax.block_until_ready(loss)

    return run, float(cost["flops"]) / 1e9


def _is_oom(error: Exception) -> bool:
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or isinstance(error, MemoryError)


def _cell(name, config, dtype, batch, source, target, peak, modes) -> tuple[list[dict], dict]:
    """One row per mode that fits in memory, the modes taking turns; and why each other did not.

    A mode is built and run once on its own first, so that running out of memory
    (on a GPU, at the first execution) drops that mode alone.
    """
    base = dict(model=name, dtype=dtype, batch=batch, source=source, target=target)
    runs, flops, oom = {}, {}, {}
    try:
        for mode in modes:
            try:
                runs[mode], flops[mode] = _step(config, dtype, batch, source, target, mode)
                runs[mode]()
            except Exception as error:  # noqa: BLE001 - only out-of-memory is expected.
                if not _is_oom(error):
                    raise
                runs.pop(mode, None)
                oom[mode] = str(error).splitlines()[0][:160]
                gc.collect()
        times = time_interleaved(runs, _STEPS.value) if runs else {}
    finally:
        runs.clear()
        gc.collect()
    rows = []
    model_flops = flops.get("jax", None) if "jax" in times else None
    analytic = analytic_gflops(config, batch, source, target)
    for mode in times:
        seconds = statistics.median(times[mode])
        achieved = flops[mode] / seconds
        row = dict(base, mode=mode, step_ms=seconds * 1e3, gflop_xla=flops[mode])
        if mode == "jax":
            row["gflop_analytic"] = analytic
        row.update(
            examples_per_s=batch / seconds,
            tokens_per_s=batch * (source + target) / seconds,
            gflops=achieved,
            mfu_pct=100 * (model_flops or flops[mode]) / seconds / peak,
            mfu_6nd_pct=100 * analytic / seconds / peak,
            peak_gflops=peak,
        )
        rows.append(row)
    return rows, oom


def _cells(peaks: dict) -> list[dict]:
    """Every model x dtype x shape x batch; a mode out of memory skips the larger batches."""
    rows = []
    for name in _MODELS.value:
        if name == "multi30k":
            spec, batch, shapes = _multi30k()
            batches = [int(b) for b in _MULTI30K_BATCHES.value or [batch]]
        else:
            spec, batches = dict(SPECS[name]), [int(b) for b in _BATCHES.value]
            shapes = [(int(n), int(n)) for n in _SEQS.value]
        if _TINY.value:
            spec.update(TINY, vocab_size=TINY_VOCAB)
            if name != "multi30k":
                batches = [2, 4]
            elif not _MULTI30K_BATCHES.value:
                batches = [4]
            shapes = [(8, 8)] if name != "multi30k" else [(n // 4, n // 4) for n, _ in shapes]
        config = model_config(spec)
        for dtype in _DTYPES.value:
            for source, target in shapes:
                modes = list(_MODES.value)
                for batch in batches:
                    cell, oom = _cell(
                        name, config, dtype, batch, source, target, peaks[dtype], modes
                    )
                    for mode, why in oom.items():
                        print(f"{name} {dtype} batch {batch} {source}+{target} {mode}: stop, {why}")
                        modes.remove(mode)
                    for row in cell:
                        print(json.dumps(row), flush=True)
                    rows += cell
                    if not modes:
                        break
                jax.clear_caches()
    return rows


COLUMNS = (
    "model", "dtype", "batch", "src+tgt", "mode", "step ms", "tokens/s",
    "GFLOP/step XLA", "GFLOP/step 6ND", "GFLOP/s", "MFU %", "MFU % 6ND",
)  # fmt: skip


def print_table(rows: list[dict]) -> None:
    """The step table as Markdown, one row per cell and mode."""
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for r in rows:
        analytic = f"{r['gflop_analytic']:.3f}" if "gflop_analytic" in r else ""
        cells = (
            r["model"], r["dtype"], r["batch"], f"{r['source']}+{r['target']}", r["mode"],
            f"{r['step_ms']:.1f}", f"{r['tokens_per_s']:.0f}", f"{r['gflop_xla']:.3f}",
            analytic, f"{r['gflops']:.1f}", f"{r['mfu_pct']:.1f}", f"{r['mfu_6nd_pct']:.1f}",
        )  # fmt: skip
        print("| " + " | ".join(str(c) for c in cells) + " |")


def multi30k_epoch(rows: list[dict]) -> None:
    """Derived: one epoch's device-step time per mode and dtype from the bucket steps."""
    steps = [r for r in rows if r["model"] == "multi30k"]
    if not steps:
        return
    print(
        f"\nOne Multi30K epoch, DERIVED (not measured): {MULTI30K_TRAIN_PAIRS:,} pairs / batch x "
        f"each bucket's share {MULTI30K_BUCKET_SHARES} x its measured step (micro-batches "
        "only: no lot padding, release, evaluation or compilation)"
    )
    for dtype, mode, batch in dict.fromkeys((r["dtype"], r["mode"], r["batch"]) for r in steps):
        mine = [r for r in steps if (r["dtype"], r["mode"], r["batch"]) == (dtype, mode, batch)]
        if len(mine) != len(MULTI30K_BUCKET_SHARES):
            continue
        pairs = zip(MULTI30K_BUCKET_SHARES, mine, strict=True)
        counts = [share * MULTI30K_TRAIN_PAIRS / r["batch"] for share, r in pairs]  # Micro-batches.
        seconds = [n * r["step_ms"] / 1e3 for n, r in zip(counts, mine, strict=True)]
        total = sum(seconds)
        # The epoch's MFU: each bucket's MFU weighted by its share of the epoch's time.
        mfu_pct = sum(t * r["mfu_pct"] for t, r in zip(seconds, mine, strict=True)) / total
        mfu_6nd = sum(t * r["mfu_6nd_pct"] for t, r in zip(seconds, mine, strict=True)) / total
        print(
            f"  {dtype} {mode} batch {batch}: {total:.0f} s ({total / 60:.1f} min), "
            f"MFU {mfu_pct:.1f}% (XLA count), {mfu_6nd:.1f}% (6ND)"
        )


def paper_anchor(rows: list[dict]) -> None:
    """The paper's epoch as examples/s and tokens/s per GPU, beside ours at 128 + 128 tokens."""
    print(
        f"\nPaper anchor (mT5-small, WMT-16 de-en, {ANCHOR_GPUS} x A100): {WMT16_PAIRS:,} pairs "
        f"an epoch; tokens at {WMT16_TOKENS_PER_PAIR} a pair (max lengths 128 + 128, an upper "
        "bound if the paper padded less); per GPU = / 2"
    )
    for setting, seconds in ANCHOR_EPOCH_S.items():
        per_gpu = WMT16_PAIRS / seconds / ANCHOR_GPUS
        print(
            f"  {setting} ({seconds / 3600:.2f} h): {per_gpu:.0f} examples/s per GPU, "
            f"{per_gpu * WMT16_TOKENS_PER_PAIR:,.0f} tokens/s per GPU"
        )
    for r in rows:
        if r["model"] == "mt5-small" and (r["source"], r["target"]) == (128, 128):
            print(
                f"  ours, mt5-small {r['dtype']} {r['mode']} batch {r['batch']}: "
                f"{r['examples_per_s']:.0f} examples/s, {r['tokens_per_s']:,.0f} tokens/s"
            )


def main(argv):
    del argv
    device = jax.devices()[0]
    n, repeats = (256, 3) if _TINY.value else (_PEAK_N.value, _PEAK_REPEATS.value)
    print(f"device: {device.device_kind} ({device.platform}), {jax.device_count()} device(s)")
    peaks = {dtype: matmul_peak_gflops(dtype, n, repeats) for dtype in _DTYPES.value}
    nominal = nominal_peak(device.device_kind) if device.platform == "gpu" else None
    for dtype, peak in peaks.items():
        sheet = f", data sheet {nominal[dtype]:,.0f} TFLOP/s" if nominal else ""
        print(f"peak {dtype}: {peak:,.1f} GFLOP/s measured ({n}x{n} dot, best of {repeats}){sheet}")
    rows = _cells(peaks)
    print()
    print_table(rows)
    if _EPOCH.value:
        multi30k_epoch(rows)
    if _ANCHOR.value:
        paper_anchor(rows)
    if _JSON.value:
        with open(_JSON.value, "w") as f:
            json.dump({"device": device.device_kind, "peaks": peaks, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    app.run(main)
