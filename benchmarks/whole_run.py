"""One epoch of the Multi30K config's model: dpnmt against the PyTorch loop a user would write.

Four runs of one invocation, one after the other, each in a process of its own
(so each pays its own imports, data loading, model building and compiling):

  * `dpnmt`: `python -m dpnmt.train --config=configs/multi30k.py:nonprivate`,
    one epoch (shuffled lots of L = 128, micro-batches of 32 in the config's
    length buckets).
  * `dpnmt_dp`: the same with `:eps8` (ε = 8 for this one epoch, Poisson lots
    of expected size L = 512, ghost clipping, C = 1, σ calibrated by dpnmt).
  * `torch`: the same corpus, vocabulary (the config's cached public
    SentencePiece), truncation (48 + 48 tokens) and tokenized split (dpnmt's
    own `preprocess`, as a user given the vocabulary would reproduce it),
    trained by a plain loop: `transformers.T5ForConditionalGeneration` built
    from the config (`dpnmt.models.export.to_hf_config`: T5 v1.0, ReLU, tied
    embeddings, d_model 256, 3+3 layers, dropout 0.1), AdamW (no weight decay:
    Adam, as dpnmt), the config's warm-up and linear decay, a shuffled
    `DataLoader` of L = 128 pairs a step padded to the longest pair of the
    batch (dynamic padding), N // L steps (dpnmt's shuffled epoch).
  * `opacus`: Opacus' Poisson `DPDataLoader` (q = L / N, L = 512), its
    `BatchMemoryManager` splitting lots into physical batches of 32 (dpnmt's),
    each example's token-mean loss, the same σ (dpnmt's calibration for this N
    and T), C and optimizer. Its clipping mode: `--opacus_mode` (`auto`: the
    faster of fast gradient clipping and per-sample hooks over a few warm steps
    before the clock starts; Opacus' ghost clipping refuses tied embeddings).
    T5's relative attention bias is frozen here only: Opacus' per-sample
    hooks cannot handle it (its input has no batch axis); 512 of ~4.2M params.

Reported per run: the process's wall time from its start to its exit, the
training wall time (that minus what is excluded: dpnmt's validation, final
test evaluation (of 64 test pairs, or `--set=data.max_test_examples=K`) and
checkpoint phases, from its `train.profile`; Opacus' mode probe), the epoch's
examples (N, the training pairs kept after preprocessing), examples per
second of training wall time, and dpnmt / PyTorch per mode. Start-up, data
loading, tokenization, model building and compilation are in the training
wall time for every run. dpnmt's compilation cache is a fresh empty folder
per run (`--jax_cache=cold`, a first run) or the user's (`warm`). PyTorch
uses `--threads` intra-op threads; JAX uses every core (both: the machine's
2). `XLA_FLAGS` is cleared in the children (one CPU device, as a user's run).
A benchmark, never a timed test.

    python -m benchmarks.whole_run                          # a full epoch, four runs
    python -m benchmarks.whole_run --max_train_examples=6400 --json=/tmp/whole_run.json
"""

import ast
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from absl import app, flags

from benchmarks.whole_run_table import rows as _rows
from benchmarks.whole_run_table import table

_MODES = flags.DEFINE_list(
    "modes", ["dpnmt", "dpnmt_dp", "torch", "opacus"], "Runs: dpnmt, dpnmt_dp, torch, opacus."
)
_MAX_TRAIN = flags.DEFINE_integer(
    "max_train_examples", None, "Keep the first K training pairs (None: the whole epoch)."
)
_CONFIG = flags.DEFINE_string("config", "configs/multi30k.py", "The config file (a Multi30K one).")
_EPSILON = flags.DEFINE_float("epsilon", 8.0, "ε of the DP runs (this one epoch).")
_OPACUS_MODE = flags.DEFINE_enum(
    "opacus_mode", "auto", ["auto", "fgc", "hooks"], "Opacus clipping: auto picks the faster."
)
_SET = flags.DEFINE_list(
    "set",
    [],
    "Config fields every run also sets, name=value (e.g. model.d_model=32): a smaller model.",
)
_PROBE_STEPS = flags.DEFINE_integer("probe_steps", 3, "opacus_mode=auto: timed steps per mode.")
_THREADS = flags.DEFINE_integer("threads", 2, "PyTorch intra-op threads.")
_JAX_CACHE = flags.DEFINE_enum(
    "jax_cache", "cold", ["cold", "warm"], "dpnmt's compilation cache: empty, or the user's."
)
_TIMEOUT = flags.DEFINE_integer("timeout_s", 7200, "Per-run limit (s).")
_JSON = flags.DEFINE_string("json", None, "Also write the rows here.")
_WORKER = flags.DEFINE_string("worker", None, "Internal: run one PyTorch mode (torch, opacus).")
_WORKDIR = flags.DEFINE_string("worker_dir", None, "Internal: the worker's folder.")

REPO = pathlib.Path(__file__).resolve().parents[1]
# dpnmt's profile phases that a plain training loop does not have.
EXCLUDED_PHASES = ("evaluation", "final evaluation", "checkpointing")
# dpnmt's profile phases of the training loop proper (after start-up and compiling).
LOOP_PHASES = ("device steps", "lot preparation")
DP_MODES = ("dpnmt_dp", "opacus")


def _variant(mode: str) -> str:
    return "eps8" if mode in DP_MODES else "nonprivate"  # ε: dp.target_epsilon (--epsilon).


def _overrides(mode: str) -> dict:
    """Config fields every run sets: one epoch, the subset, the DP target."""
    fields = {"train.num_epochs": 1}
    if _MAX_TRAIN.value is not None:
        fields["data.max_train_examples"] = _MAX_TRAIN.value
    if mode in DP_MODES:
        fields["dp.target_epsilon"] = _EPSILON.value
    for item in _SET.value:
        name, _, value = item.partition("=")
        try:
            fields[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            fields[name] = value  # A plain string, e.g. data.length_buckets=none.
    return fields


def _config_flags(mode: str) -> list[str]:
    """`python -m dpnmt.train`'s `--config` flags of `mode`."""
    flags_ = [f"--config={REPO / _CONFIG.value}:{_variant(mode)}"]
    return flags_ + [f"--config.{name}={value}" for name, value in _overrides(mode).items()]


def _child_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # One CPU device.
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


def _timed(command: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=_child_env(),
        cwd=REPO,
        timeout=_TIMEOUT.value,
        check=False,
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{command[:4]} exited {done.returncode}: {done.stderr[-3000:]}")
    return wall, done


def _dpnmt_run(mode: str, folder: str) -> dict:
    """`python -m dpnmt.train` for one epoch; its wall time and what its profile excludes."""
    workdir = os.path.join(folder, mode)
    command = [sys.executable, "-m", "dpnmt.train", f"--workdir={workdir}", *_config_flags(mode)]
    command += [
        "--config.train.profile=True",
        "--config.train.eval_every_steps=0",  # No validation during training.
        "--config.train.checkpoint_every_steps=1000000",  # Only the final checkpoint.
    ]
    if "data.max_test_examples" not in _overrides(mode):  # `--set` may make it smaller.
        command.append("--config.data.max_test_examples=64")  # Excluded anyway: keep it short.
    if _JAX_CACHE.value == "cold":
        command.append(f"--config.train.compilation_cache={os.path.join(folder, mode + '_jax')}")
    wall, _ = _timed(command)
    with open(os.path.join(workdir, "results.json")) as f:
        results = json.load(f)
    private = os.path.join(workdir, "private", "profile.json")
    with open(private if os.path.exists(private) else os.path.join(workdir, "profile.json")) as f:
        profile = json.load(f)
    excluded = sum(
        p["seconds"] for p in profile["phases"] if p["phase"].startswith(EXCLUDED_PHASES)
    )
    compile_s = sum(
        p["compile_seconds"]
        for p in profile["phases"]
        if not p["phase"].startswith(EXCLUDED_PHASES)
    )
    privacy = results["privacy"]
    loop = sum(p["seconds"] for p in profile["phases"] if p["phase"].startswith(LOOP_PHASES))
    return {
        "loop_s": loop,
        "process_s": wall,
        "excluded_s": excluded,
        "examples": privacy["dataset_size"],
        "steps": results["steps_done"],
        "lot_size": privacy["expected_lot_size"],
        "noise_multiplier": privacy["noise_multiplier"],
        "compile_s": compile_s,
        "phases": {p["phase"]: round(p["seconds"], 2) for p in profile["phases"]},
    }


def _torch_run(mode: str, folder: str) -> dict:
    """This file as a PyTorch worker process; its wall time and its own report."""
    workdir = os.path.join(folder, mode)
    command = [sys.executable, str(pathlib.Path(__file__).resolve()), f"--worker={mode}"]
    command += [f"--worker_dir={workdir}", f"--threads={_THREADS.value}"]
    command += [f"--opacus_mode={_OPACUS_MODE.value}", f"--probe_steps={_PROBE_STEPS.value}"]
    command += [f"--epsilon={_EPSILON.value}", f"--config={_CONFIG.value}"]
    if _MAX_TRAIN.value is not None:
        command.append(f"--max_train_examples={_MAX_TRAIN.value}")
    if _SET.value:
        command.append(f"--set={','.join(_SET.value)}")
    wall, done = _timed(command)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return {"process_s": wall, **json.loads(lines[-1][len("RESULT ") :])}


# ----------------------------------------------------------------------------- PyTorch worker


def _run_config(mode: str):
    """The `RunConfig` of `mode` with the shared overrides (as the dpnmt runs read it)."""
    import importlib.util

    from dpnmt.training import preflight

    spec = importlib.util.spec_from_file_location("whole_run_config", REPO / _CONFIG.value)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(_variant(mode))
    for name, value in _overrides(mode).items():
        section, field = name.split(".")
        setattr(config[section], field, value)
    return preflight.read_config(config)


def _tokenized_train(run, workdir: str):
    """The train split as dpnmt tokenizes it: [(source ids, target ids)], and the tokenizer."""
    from dpnmt.training import pieces

    corpus = pieces.load_corpus(run.data)
    tokenizer, _ = pieces.build_tokenizer(run, corpus, workdir, noise_seed=None)
    tokenized, _ = pieces.tokenize_corpus(run, corpus, tokenizer)
    train = tokenized["train"]  # Dropped pairs (empty sides) are already gone.
    pairs = [
        (ids[:s], labels[:t])
        for ids, labels, s, t in zip(
            train["input_ids"],
            train["labels"],
            train["source_length"],
            train["target_length"],
            strict=True,
        )
    ]
    return pairs, tokenizer


def _collate(pad_id: int):
    """Pads a batch of (source, target) id lists to its longest row (dynamic padding)."""
    import torch

    def collate(batch):
        width_s = max((len(source) for source, _ in batch), default=1)
        width_t = max((len(target) for _, target in batch), default=1)
        input_ids = torch.full((len(batch), width_s), pad_id, dtype=torch.long)
        labels = torch.full((len(batch), width_t), -100, dtype=torch.long)
        for row, (source, target) in enumerate(batch):
            input_ids[row, : len(source)] = torch.tensor(source)
            labels[row, : len(target)] = torch.tensor(target)
        return input_ids, labels

    return collate


def _model(run, tokenizer):
    """HF T5 built from the run's model section, as dpnmt builds its Flax model."""
    import jax
    import transformers

    from dpnmt.models import export
    from dpnmt.training import pieces

    # dpnmt's model config (vocabulary size and special ids from the tokenizer);
    # its Flax params are not used (transformers initialises its own), so the
    # build is traced for shapes only: no init compiled or run.
    built = {}

    def build(key):
        _, built["config"], params = pieces.build_model(run.model, tokenizer, key)
        return params

    with jax.default_device(jax.devices("cpu")[0]):
        jax.eval_shape(build, jax.random.key(0))
    return transformers.T5ForConditionalGeneration(export.to_hf_config(built["config"])).train()


def _example_losses(model, input_ids, labels, pad_id: int):
    """[B] each example's token-mean cross-entropy (dpnmt's `example_loss`)."""
    import torch

    logits = model(input_ids=input_ids, attention_mask=(input_ids != pad_id).long(), labels=labels)
    per_token = torch.nn.functional.cross_entropy(
        logits.logits.transpose(1, 2), labels, ignore_index=-100, reduction="none"
    )
    mask = (labels != -100).float()
    return (per_token * mask).sum(1) / mask.sum(1).clamp(min=1)


def _schedule(optimizer, train, steps: int):
    """The config's linear warm-up then linear decay to 0 (`train.decay=linear`)."""
    import torch

    warmup = max(1, train.warmup_steps)

    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (steps - step) / max(1, steps - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _opacus_parts(model, mode: str, sigma: float, clip: float, lot: int, lr: float):
    """(wrapped model, DP optimizer, one-physical-batch step) of an Opacus clipping mode."""
    import torch

    if mode == "fgc":
        from opacus.grad_sample import GradSampleModuleFastGradientClipping
        from opacus.optimizers import DPOptimizerFastGradientClipping
        from opacus.utils.fast_gradient_clipping_utils import DPTensorFastGradientClipping

        wrapped = GradSampleModuleFastGradientClipping(
            model, batch_first=True, loss_reduction="mean", max_grad_norm=clip,
            use_ghost_clipping=False,
        )  # fmt: skip
        optimizer_class = DPOptimizerFastGradientClipping
    else:
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer

        wrapped = GradSampleModule(model, batch_first=True, loss_reduction="mean")
        optimizer_class = DPOptimizer
    optimizer = optimizer_class(
        optimizer=torch.optim.AdamW(wrapped.parameters(), lr=lr, weight_decay=0.0),
        noise_multiplier=sigma,
        max_grad_norm=clip,
        expected_batch_size=lot,
        loss_reduction="mean",
    )

    def backward(losses):
        if mode == "fgc":
            DPTensorFastGradientClipping(wrapped, optimizer, losses, "mean").backward()
        else:
            losses.mean().backward()

    return wrapped, optimizer, backward


def _probe_opacus(run, pairs, tokenizer, sigma: float) -> tuple[str, dict]:
    """The faster Opacus mode over a few warm steps of real batches; the step times."""
    import torch

    collate, physical = _collate(tokenizer.pad_id), run.train.physical_batch_size
    batches = [collate(pairs[i * physical : (i + 1) * physical]) for i in range(4)]
    times = {}
    for mode in ("fgc", "hooks"):
        model = _model(run, tokenizer)
        _freeze_relative_bias(model)
        wrapped, optimizer, backward = _opacus_parts(
            model, mode, sigma, run.dp.l2_clip, physical, run.train.learning_rate
        )
        spent = []
        for step in range(2 + _PROBE_STEPS.value):
            input_ids, labels = batches[step % len(batches)]
            start = time.perf_counter()
            optimizer.zero_grad()
            backward(_example_losses(wrapped, input_ids, labels, tokenizer.pad_id))
            optimizer.step()
            spent.append(time.perf_counter() - start)
        times[mode] = sorted(spent[2:])[len(spent[2:]) // 2]
        del wrapped, optimizer
        torch.manual_seed(0)
    return min(times, key=times.get), times


def _freeze_relative_bias(model) -> None:
    for name, param in model.named_parameters():
        if "relative_attention_bias" in name:
            param.requires_grad_(False)


def _worker(mode: str, workdir: str) -> dict:
    """One epoch of the plain PyTorch loop (`torch`) or of Opacus (`opacus`)."""
    import torch

    from dpnmt import privacy

    torch.set_num_threads(_THREADS.value)
    torch.manual_seed(0)
    run = _run_config(mode)
    pairs, tokenizer = _tokenized_train(run, workdir)
    lot, physical = run.train.expected_lot_size, run.train.physical_batch_size
    plan = privacy.plan_privacy(run.dp, run.train, len(pairs))
    report = {"examples": len(pairs), "lot_size": lot, "excluded_s": 0.0}
    collate = _collate(tokenizer.pad_id)
    if mode == "torch":
        model = _model(run, tokenizer)
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=run.train.learning_rate, weight_decay=0.0
        )
        loader = torch.utils.data.DataLoader(
            pairs, batch_size=lot, shuffle=True, drop_last=True, collate_fn=collate
        )
        scheduler, steps = _schedule(optimizer, run.train, len(loader)), 0
        loop_start = time.perf_counter()
        for input_ids, labels in loader:
            optimizer.zero_grad()
            model(input_ids=input_ids, attention_mask=(input_ids != tokenizer.pad_id).long(),
                  labels=labels).loss.backward()  # fmt: skip
            optimizer.step()
            scheduler.step()
            steps += 1
        return {**report, "steps": steps, "loop_s": time.perf_counter() - loop_start}

    from opacus.data_loader import DPDataLoader
    from opacus.utils.batch_memory_manager import BatchMemoryManager

    sigma = plan.noise_multiplier
    clipping = _OPACUS_MODE.value
    if clipping == "auto":
        start = time.perf_counter()
        clipping, report["probe_step_s"] = _probe_opacus(run, pairs, tokenizer, sigma)
        report["excluded_s"] = time.perf_counter() - start
    model = _model(run, tokenizer)
    _freeze_relative_bias(model)
    wrapped, optimizer, backward = _opacus_parts(
        model, clipping, sigma, run.dp.l2_clip, lot, run.train.learning_rate
    )
    loader = DPDataLoader(pairs, sample_rate=lot / len(pairs), collate_fn=collate)
    scheduler = _schedule(optimizer.original_optimizer, run.train, len(loader))
    physical_steps, loop_start = 0, time.perf_counter()
    with BatchMemoryManager(
        data_loader=loader, max_physical_batch_size=physical, optimizer=optimizer
    ) as batches:
        for input_ids, labels in batches:
            optimizer.zero_grad()
            backward(_example_losses(wrapped, input_ids, labels, tokenizer.pad_id))
            optimizer.step()
            if not optimizer._is_last_step_skipped:  # A lot ended: one schedule step.
                scheduler.step()
            physical_steps += 1
    return {
        **report,
        "steps": len(loader),
        "physical_batches": physical_steps,
        "loop_s": time.perf_counter() - loop_start,
        "noise_multiplier": sigma,
        "opacus_mode": clipping,
    }


def main(argv):
    del argv
    if _WORKER.value:
        print("RESULT " + json.dumps(_worker(_WORKER.value, _WORKDIR.value)), flush=True)
        return
    uptime = os.getloadavg()
    results, failed = {}, {}
    with tempfile.TemporaryDirectory(prefix="whole_run_") as folder:
        for mode in _MODES.value:
            run = _dpnmt_run if mode.startswith("dpnmt") else _torch_run
            try:
                results[mode] = run(mode, folder)
            except (RuntimeError, subprocess.TimeoutExpired) as error:
                failed[mode] = str(error)[-2000:]
                print(f"{mode} FAILED: {failed[mode]}", flush=True)
                continue
            print(f"{mode}: " + json.dumps(results[mode]), flush=True)
    rows = _rows(results)
    load = (uptime, os.getloadavg())
    print(f"\nload average (1, 5, 15 min) before {load[0]}, after {load[1]}")
    print(table(rows))
    if _JSON.value:
        with open(_JSON.value, "w") as f:
            json.dump(
                {"rows": rows, "failed": failed, "load_before": load[0], "load_after": load[1]},
                f,
                indent=1,
            )
        print(f"wrote {_JSON.value}")
    if failed:
        raise SystemExit(f"failed runs: {', '.join(failed)}")


if __name__ == "__main__":
    app.run(main)
