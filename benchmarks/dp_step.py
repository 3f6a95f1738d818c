"""DP-SGD step cost: JAX non-private vs DP `vmap` vs DP `ghost`, and PyTorch vs Opacus.

One training step (gradient of the per-example token-mean losses, DP: clip,
sum, noise once, SGD update) on T5-style models built from the same config in
Flax (`dpnmt.models`) and in `transformers` (PyTorch). Per cell (model ×
batch × sequence length), the JAX modes run in one subprocess and the PyTorch
modes in another, both alive at once and taking turns step by step (all modes
of all processes in a round), so that machine load hits all modes alike and
every ratio, JAX/PyTorch included, compares steps taken side by side; each
mode's peak RSS comes from a separate one-step subprocess of its own.
`--baseline_tree` adds the JAX modes once more, run with `dpnmt` imported from
another checkout (e.g. `git worktree add /tmp/base main`), in their own
process taking turns with the others: a before/after in one run.

    python -m benchmarks.dp_step                      # tiny, batch 8/32, seq 32
    python -m benchmarks.dp_step --models=tiny,t5-small --batch_sizes=8,32,128 \
        --seq_lens=32,64,128 --json=/tmp/dp_step.json --capacity_mib=8192
    python -m benchmarks.dp_step --models=tiny --batch_sizes=32 --modes=jax,ghost,torch \
        --baseline_tree=/tmp/base                     # also jax@base, ghost@base

Printed per cell: median step time, examples/s, tokens/s (source + target),
peak RSS of the one-step process (compilation included), step RSS (the peak
of its steps alone: after compiling, freed heap is returned to the OS and the
peak count restarted), and for JAX modes XLA's compiled temporary memory; then the ratios
DP/non-private, JAX/PyTorch, ours (ghost) / Opacus, and with `--baseline_tree`
each JAX mode / the same mode from the baseline checkout. `--capacity_mib` adds, per JAX mode,
the largest physical batch (doubling from 8) whose peak RSS stays under the cap.
A cell that exceeds `--timeout_s` or fails is reported as skipped, with why.
"""

import ctypes
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import time

from absl import app, flags

from benchmarks.timing import time_interleaved

_MODELS = flags.DEFINE_list("models", ["tiny"], "Model configs: tiny, t5-small.")
_BATCHES = flags.DEFINE_list("batch_sizes", ["8", "32"], "Physical batch sizes.")
_SEQS = flags.DEFINE_list("seq_lens", ["32"], "Source = target lengths (tokens).")
_MODES = flags.DEFINE_list(
    "modes",
    ["jax", "vmap", "ghost", "torch", "opacus_fgc", "opacus_hooks"],
    "Step kinds: jax (non-private), vmap, ghost (dpnmt), torch (non-private), and Opacus: "
    "opacus_fgc (fast gradient clipping), opacus_hooks (per-sample grads), "
    "opacus_functorch, opacus_ghost (refuses T5: its embedding is used twice).",
)
_STEPS = flags.DEFINE_integer("steps", 5, "Timed steps per cell (after 2 warm-up steps).")
_TIMEOUT = flags.DEFINE_integer("timeout_s", 600, "Per-cell limit; slower cells are skipped.")
_JSON = flags.DEFINE_string("json", "dp_step.json", "Where to write the results.")
_CAPACITY = flags.DEFINE_integer(
    "capacity_mib", 0, "Peak-RSS cap for the capacity search (0: off)."
)
_CAPACITY_MODES = flags.DEFINE_list("capacity_modes", ["jax", "vmap", "ghost"], "Modes searched.")
_CAPACITY_MAX = flags.DEFINE_integer("capacity_max_batch", 512, "Largest batch tried.")
_BASELINE = flags.DEFINE_string(
    "baseline_tree",
    None,
    "Another checkout of dpnmt: its JAX modes run too, named '<mode>@base' (before/after).",
)
_WORKER = flags.DEFINE_string("worker", None, "Internal: run one cell, 'model:batch:seq:mode'.")
_SERVE = flags.DEFINE_bool("serve", False, "Internal: the worker times one step per stdin line.")
_BASE = "@base"

# T5 layout with ReLU feed-forward, UNTIED LM head and a FROZEN relative attention
# bias in every mode: Opacus' ghost clipping refuses tied parameters, and its
# per-sample hooks cannot handle T5's relative attention bias (its nn.Embedding
# input [q_len, k_len] has no batch axis). dpnmt's ghost clipping handles both
# (tests/models/test_ghost_clipping.py); here all modes train the same params.
MODELS = {
    "tiny": dict(vocab_size=1000, d_model=128, d_kv=32, d_ff=256, num_layers=2, num_heads=4),
    "t5-small": dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8),
}
L2_CLIP, SIGMA, LEARNING_RATE, DROPOUT = 1.0, 1.0, 1e-3, 0.1


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _start_step_peak() -> bool:
    """Returns freed heap to the OS and restarts the peak-RSS count (Linux); False if it can't.

    XLA's compiler frees most of what it allocates, but glibc keeps it resident:
    without this the steps' peak would include the compiler's.
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # Resets VmHWM to the current RSS (ru_maxrss too, unless a thread exits).
    except (OSError, AttributeError):  # No glibc, or no /proc.
        return False
    return True


def _step_peak_rss_mib() -> float:
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["VmHWM"].split()[0]) / 1024


def _jax_cell(model_name: str, batch: int, seq: int, mode: str):
    """A function running one jitted step of `mode`, and its XLA temporary memory."""
    import jax
    import jax.numpy as jnp

    from dpnmt import core, models, training
    from dpnmt.bridge.dataset import INPUT_IDS, INPUT_LENGTH, LABEL_LENGTH, LABELS

    spec = MODELS[model_name]
    config = models.T5Config(
        **spec,
        num_decoder_layers=spec["num_layers"],
        feed_forward_proj="relu",
        tie_word_embeddings=False,
        scale_decoder_outputs=False,
        dropout_rate=DROPOUT,
        pad_token_id=0,
        eos_token_id=1,
    )
    model = models.create_model(config)
    params, frozen = models.split_params(
        models.init_params(model, jax.random.key(0)),
        lambda path, _: "relative_attention_bias" not in path,
    )
    ids = jax.random.randint(jax.random.key(1), (2, batch, seq), 2, config.vocab_size)
    data = {
        INPUT_IDS: ids[0],
        INPUT_LENGTH: jnp.full((batch,), seq, jnp.int32),
        LABELS: ids[1],
        LABEL_LENGTH: jnp.full((batch,), seq, jnp.int32),
    }
    mask = jnp.ones((batch,), jnp.float32)

    def loss_fn(p, example, key):
        return training.example_loss(model, config, models.merge_params(p, frozen), example, key)

    def step(p, data, key):
        grad_key, noise_key = jax.random.split(key)
        if mode == "jax":
            keys = jax.random.split(grad_key, batch)

            def summed(p):
                return jnp.sum(jax.vmap(loss_fn, in_axes=(None, 0, 0))(p, data, keys))

            grad = jax.grad(summed)(p)
        else:
            grad_sum, _, _ = core.private_grad_sum(
                loss_fn, p, data, mask, l2_clip=L2_CLIP, dropout_key=grad_key, clipping=mode
            )
            grad = core.add_gaussian_noise(grad_sum, SIGMA * L2_CLIP, noise_key)
        return jax.tree.map(lambda w, g: w - LEARNING_RATE / batch * g, p, grad)

    compiled = jax.jit(step, donate_argnums=0).lower(params, data, jax.random.key(2)).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes / 2**20
    state = {"params": params, "key": jax.random.key(3)}

    def run():
        state["key"], key = jax.random.split(state["key"])
        state["params"] = compiled(state["params"], data, key)
        jax.block_until_ready(state["params"])

    return run, {"xla_temp_mib": temp}


def _torch_cell(model_name: str, batch: int, seq: int, mode: str):
    """A function running one PyTorch step of `mode` on its own model copy."""
    import torch
    import transformers

    torch.manual_seed(0)
    spec = MODELS[model_name]
    config = transformers.T5Config(
        **spec,
        num_decoder_layers=spec["num_layers"],
        feed_forward_proj="relu",
        tie_word_embeddings=False,
        dropout_rate=DROPOUT,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    model = transformers.T5ForConditionalGeneration(config).train()
    for name, param in model.named_parameters():
        param.requires_grad_("relative_attention_bias" not in name)
    ids = torch.randint(2, spec["vocab_size"], (2, batch, seq))
    labels = ids[1]
    inputs = {
        "input_ids": ids[0],
        "attention_mask": torch.ones(batch, seq, dtype=torch.long),
        "decoder_input_ids": torch.cat(
            [torch.zeros(batch, 1, dtype=torch.long), labels[:, :-1]], 1
        ),
    }
    per_token = torch.nn.CrossEntropyLoss(reduction="none")

    def example_losses(module):
        logits = module(**inputs).logits
        losses = per_token(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        return losses.reshape(batch, seq).mean(dim=1)

    if mode == "torch":
        optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)

        def run():
            optimizer.zero_grad()
            example_losses(model).sum().backward()
            optimizer.step()

    elif mode in ("opacus_ghost", "opacus_fgc"):
        from opacus.grad_sample import GradSampleModuleFastGradientClipping
        from opacus.optimizers import DPOptimizerFastGradientClipping
        from opacus.utils.fast_gradient_clipping_utils import DPTensorFastGradientClipping

        wrapped = GradSampleModuleFastGradientClipping(
            model,
            batch_first=True,
            loss_reduction="sum",
            max_grad_norm=L2_CLIP,
            use_ghost_clipping=mode == "opacus_ghost",
        )
        optimizer = DPOptimizerFastGradientClipping(**_opacus_optimizer_args(wrapped, batch))

        def run():
            optimizer.zero_grad()
            losses = example_losses(wrapped)
            DPTensorFastGradientClipping(wrapped, optimizer, losses, "sum").backward()
            optimizer.step()

    else:
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer

        wrapped = GradSampleModule(
            model,
            batch_first=True,
            loss_reduction="sum",
            force_functorch=mode == "opacus_functorch",
        )
        optimizer = DPOptimizer(**_opacus_optimizer_args(wrapped, batch))

        def run():
            optimizer.zero_grad()
            example_losses(wrapped).sum().backward()
            optimizer.step()

    return run, {}


def _opacus_optimizer_args(wrapped, batch: int) -> dict:
    """Arguments of Opacus' DP optimizers: SGD, σ, C and the sum reduction of our losses."""
    import torch

    return dict(
        optimizer=torch.optim.SGD(wrapped.parameters(), lr=LEARNING_RATE),
        noise_multiplier=SIGMA,
        max_grad_norm=L2_CLIP,
        expected_batch_size=batch,
        loss_reduction="sum",
    )


def _build(cell: str) -> tuple[dict, dict]:
    model_name, batch, seq, modes = cell.split(":")
    runs, results = {}, {}
    for mode in modes.split(","):
        fn = _torch_cell if mode.startswith(("torch", "opacus")) else _jax_cell
        runs[mode], results[mode] = fn(model_name, int(batch), int(seq), mode)
    return runs, results


def _worker(cell: str, steps: int) -> None:
    """Times the cell's modes taking turns in this process (the one-step RSS runs)."""
    runs, results = _build(cell)
    build_peak = _peak_rss_mib()  # Before the reset, which usually resets ru_maxrss too.
    measured = _start_step_peak()
    for mode, times in time_interleaved(runs, steps).items():
        results[mode]["times"] = times
    step_rss = _step_peak_rss_mib() if measured else None
    peaks = {"peak_rss_mib": max(build_peak, _peak_rss_mib()), "step_rss_mib": step_rss}
    print("RESULT " + json.dumps({"modes": results, **peaks}))


def _serve(cell: str) -> None:
    """Builds and warms up the cell's modes, then times one step per `step MODE` line."""
    import dpnmt

    runs, results = _build(cell)
    for run in runs.values():
        for _ in range(2):  # Compile and warm up.
            run()
    print("READY", flush=True)
    for line in sys.stdin:
        if line.strip() == "done":
            break
        mode = line.split()[1]
        start = time.perf_counter()
        runs[mode]()
        print(f"TIME {time.perf_counter() - start!r}", flush=True)
    print("RESULT " + json.dumps({"modes": results, "dpnmt": dpnmt.__file__}), flush=True)


def _command(cell: str, tree: str, *extra: str) -> tuple[list[str], dict]:
    """A worker's command and environment, importing `dpnmt` from `tree`."""
    script = str(pathlib.Path(__file__).resolve())
    command = [sys.executable, script, f"--worker={cell}", *extra]
    path = os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")])
    return command, dict(os.environ, PYTHONPATH=path)


def _subprocess(model_name: str, batch: int, seq: int, modes: list[str], steps: int):
    """Runs one worker; its parsed result, or the reason it gave none."""
    tree = _BASELINE.value if modes[0].endswith(_BASE) else os.getcwd()
    cell = f"{model_name}:{batch}:{seq}:{','.join(m.removesuffix(_BASE) for m in modes)}"
    command, env = _command(cell, tree, f"--steps={steps}")
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=_TIMEOUT.value, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        return None, f"over --timeout_s={_TIMEOUT.value}"
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"exit {done.returncode}: {tail[:200]}"
    result = json.loads(lines[-1][len("RESULT ") :])
    result["modes"] = {mode: result["modes"][mode.removesuffix(_BASE)] for mode in modes}
    return result, None


class _Server:
    """A `--serve` worker process for one group of modes (one framework, one checkout)."""

    def __init__(self, model_name: str, batch: int, seq: int, modes: list[str]):
        self.modes = modes
        tree = _BASELINE.value if modes[0].endswith(_BASE) else os.getcwd()
        cell = f"{model_name}:{batch}:{seq}:{','.join(m.removesuffix(_BASE) for m in modes)}"
        command, env = _command(cell, tree, "--serve")
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        self.error = None

    def _line(self, prefix: str) -> str:
        for line in self.process.stdout:
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
        self.error = f"exit {self.process.wait()} before {prefix.strip()}"
        raise RuntimeError(self.error)

    def ready(self) -> None:
        self._line("READY")

    def step(self, mode: str) -> float:
        self.process.stdin.write(f"step {mode.removesuffix(_BASE)}\n")
        self.process.stdin.flush()
        return float(self._line("TIME "))

    def finish(self) -> dict:
        self.process.stdin.write("done\n")
        self.process.stdin.flush()
        result = json.loads(self._line("RESULT "))
        self.process.wait()
        return {mode: result["modes"][mode.removesuffix(_BASE)] for mode in self.modes}

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _time_lockstep(model_name: str, batch: int, seq: int, groups: list[list[str]], steps: int):
    """Per mode: its results and step times, all groups' processes taking turns; or why not."""
    servers = [_Server(model_name, batch, seq, group) for group in groups]
    deadline = time.monotonic() + _TIMEOUT.value
    try:
        for server in servers:
            server.ready()
        times = {mode: [] for group in groups for mode in group}
        for _ in range(steps):
            for server in servers:
                for mode in server.modes:
                    times[mode].append(server.step(mode))
            if time.monotonic() > deadline:
                raise RuntimeError(f"over --timeout_s={_TIMEOUT.value}")
        results = {}
        for server in servers:
            results.update(server.finish())
        for mode in results:
            results[mode]["times"] = times[mode]
        return results, None
    except RuntimeError as error:
        return None, str(error)
    finally:
        for server in servers:
            server.kill()


def _run_cell(model_name: str, batch: int, seq: int, modes: list[str], steps: int) -> list[dict]:
    """Times the modes in lockstep (one process per framework), then each mode's peak RSS alone."""
    if _BASELINE.value:
        modes = modes + [m + _BASE for m in modes if not m.startswith(("torch", "opacus"))]
    rows = {mode: {"model": model_name, "batch": batch, "seq": seq, "mode": mode} for mode in modes}
    groups = [
        [m for m in modes if not m.startswith(("torch", "opacus")) and not m.endswith(_BASE)],
        [m for m in modes if m.endswith(_BASE)],
        [m for m in modes if m.startswith(("torch", "opacus"))],
    ]
    groups = [group for group in groups if group]
    result, why = _time_lockstep(model_name, batch, seq, groups, steps)
    for mode in modes:
        if result is None:
            rows[mode]["skipped"] = why
            continue
        median = statistics.median(result[mode].pop("times"))
        rows[mode].update(result[mode])
        rows[mode].update(
            median_s=median, examples_per_s=batch / median, tokens_per_s=2 * batch * seq / median
        )
    for mode in modes:
        if "skipped" in rows[mode]:
            continue
        result, why = _subprocess(model_name, batch, seq, [mode], steps=1)
        rows[mode]["peak_rss_mib"] = result["peak_rss_mib"] if result else None
        rows[mode]["step_rss_mib"] = result["step_rss_mib"] if result else None
        if result is None:
            rows[mode]["rss_skipped"] = why
    return list(rows.values())


def _ratios(rows: list[dict]) -> list[dict]:
    """DP/non-private per framework and ghost/Opacus, per (model, batch, seq)."""
    out = []
    by_cell: dict = {}
    for row in rows:
        if "median_s" in row:
            by_cell.setdefault((row["model"], row["batch"], row["seq"]), {})[row["mode"]] = row
    for (model_name, batch, seq), modes in by_cell.items():
        entry = {"model": model_name, "batch": batch, "seq": seq}
        for dp, base in (("vmap", "jax"), ("ghost", "jax")):
            if dp in modes and base in modes:
                entry[f"{dp}/jax time"] = modes[dp]["median_s"] / modes[base]["median_s"]
                if modes[dp]["peak_rss_mib"] and modes[base]["peak_rss_mib"]:
                    rss = modes[dp]["peak_rss_mib"] / modes[base]["peak_rss_mib"]
                    entry[f"{dp}/jax rss"] = rss
                if modes[dp].get("step_rss_mib") and modes[base].get("step_rss_mib"):
                    rss = modes[dp]["step_rss_mib"] / modes[base]["step_rss_mib"]
                    entry[f"{dp}/jax step rss"] = rss
                temp = modes[dp]["xla_temp_mib"] / modes[base]["xla_temp_mib"]
                entry[f"{dp}/jax xla temp"] = temp
        if "jax" in modes and "torch" in modes:
            entry["jax/torch time"] = modes["jax"]["median_s"] / modes["torch"]["median_s"]
        for mode in [m for m in modes if m.endswith(_BASE)]:
            new = mode.removesuffix(_BASE)
            if new in modes:
                entry[f"{new}/{mode} time"] = modes[new]["median_s"] / modes[mode]["median_s"]
                if modes[new]["peak_rss_mib"] and modes[mode]["peak_rss_mib"]:
                    rss = modes[new]["peak_rss_mib"] / modes[mode]["peak_rss_mib"]
                    entry[f"{new}/{mode} rss"] = rss
        opacus = [m for m in modes if m.startswith("opacus")]
        if opacus and "torch" in modes:
            best = min(opacus, key=lambda m: modes[m]["median_s"])
            entry["opacus mode"] = best
            entry["opacus/torch time"] = modes[best]["median_s"] / modes["torch"]["median_s"]
            if "ghost" in modes:
                ours, theirs = modes["ghost"]["examples_per_s"], modes[best]["examples_per_s"]
                entry["ghost/opacus ex/s"] = ours / theirs
        out.append(entry)
    return out


def _capacity(model_name: str, seq: int, mode: str) -> dict:
    """Largest batch (doubling from 8) whose peak RSS stays under the cap."""
    best, batch, why = None, 8, "reached --capacity_max_batch"
    while batch <= _CAPACITY_MAX.value:
        result, why = _subprocess(model_name, batch, seq, [mode], steps=1)
        if result is None:
            break
        if result["peak_rss_mib"] > _CAPACITY.value:
            why = f"batch {batch}: peak RSS {result['peak_rss_mib']:.0f} MiB"
            break
        best, batch = batch, batch * 2
    return {"model": model_name, "seq": seq, "mode": mode, "largest_batch": best, "stopped": why}


def _print_table(rows: list[dict], ratios: list[dict], capacity: list[dict]) -> None:
    print(
        f"{'model':<9} {'batch':>5} {'seq':>4} {'mode':<16} {'step ms':>9} {'ex/s':>8} "
        f"{'tok/s':>9} {'peak RSS MiB':>12} {'step RSS MiB':>12} {'XLA temp MiB':>12}"
    )
    for row in rows:
        head = f"{row['model']:<9} {row['batch']:>5} {row['seq']:>4} {row['mode']:<16}"
        if "skipped" in row:
            print(f"{head} skipped: {row['skipped']}")
            continue
        temp = f"{row['xla_temp_mib']:>12.0f}" if "xla_temp_mib" in row else f"{'':>12}"
        rss = f"{row['peak_rss_mib']:>12.0f}" if row.get("peak_rss_mib") else f"{'-':>12}"
        step_rss = f"{row['step_rss_mib']:>12.0f}" if row.get("step_rss_mib") else f"{'-':>12}"
        print(
            f"{head} {row['median_s'] * 1e3:>9.1f} {row['examples_per_s']:>8.1f} "
            f"{row['tokens_per_s']:>9.0f} {rss} {step_rss} {temp}"
        )
    print("\nratios (same run, side by side)")
    for entry in ratios:
        parts = [
            f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
            for k, v in entry.items()
            if k not in ("model", "batch", "seq")
        ]
        print(f"{entry['model']:<9} {entry['batch']:>5} {entry['seq']:>4}  " + "  ".join(parts))
    if capacity:
        print(f"\nlargest physical batch under {_CAPACITY.value} MiB peak RSS")
        for entry in capacity:
            print(
                f"{entry['model']:<9} seq {entry['seq']:>4} {entry['mode']:<6} "
                f"{entry['largest_batch']}  (stopped: {entry['stopped']})"
            )


def main(argv):
    del argv
    if _WORKER.value:
        if _SERVE.value:
            _serve(_WORKER.value)
        else:
            _worker(_WORKER.value, _STEPS.value)
        return
    rows = []
    for model_name in _MODELS.value:
        for seq in map(int, _SEQS.value):
            for batch in map(int, _BATCHES.value):
                for row in _run_cell(model_name, batch, seq, _MODES.value, _STEPS.value):
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    capacity = []
    if _CAPACITY.value:
        for model_name in _MODELS.value:
            for mode in _CAPACITY_MODES.value:
                capacity.append(_capacity(model_name, int(_SEQS.value[0]), mode))
    ratios = _ratios(rows)
    _print_table(rows, ratios, capacity)
    with open(_JSON.value, "w") as f:
        json.dump({"cells": rows, "ratios": ratios, "capacity": capacity}, f, indent=1)
    print(f"\nwrote {_JSON.value}")


if __name__ == "__main__":
    app.run(main)
