"""How loud DP-SGD's noise is against the clipped gradient, on a run's validation split.

Each DP-SGD update is `(Σ_lot clip(g_i) + N(0, σ²C² I)) / L`. Its noise has
norm about `σ C √d / L` (d trainable parameters); its signal is the mean
clipped gradient, at most C and usually far less, because examples' gradients
point different ways. Their ratio says why a DP run learns slowly or not at
all: a ratio of r needs about r² steps along a steady direction before the
signal outweighs the noise.

The signal is measured on the validation split (public where the corpus has
its own; `validation_is_private` says when it was carved from train) with the
run's released parameters and its initial ones (rebuilt from the public
`config.seed`), never on the training data, and without dropout: training
drew per-example dropout, so the norms describe the deterministic model.
"""

import dataclasses
import math
import os
import tempfile

import datasets
import jax
import jax.numpy as jnp
import numpy as np

from dpnmt import bridge, core, models, privacy
from dpnmt.config import RunConfig
from dpnmt.data import checks as data_checks
from dpnmt.errors import ConfigError
from dpnmt.evaluation import decode
from dpnmt.evaluation import evaluator as evaluator_lib
from dpnmt.training import pieces, preflight, steps
from dpnmt.training.run_dir import NOISE_TO_SIGNAL_FILE, RunDir, write_json


@dataclasses.dataclass(frozen=True)
class Signal:
    """The clipped gradient of `num_examples` examples at one set of parameters.

    Attributes:
      num_examples: n, examples averaged.
      mean_clipped_norm: ‖(1/n) Σ clip_C(g_i)‖, the signal of an update of n examples.
      median_example_norm: median of the unclipped ‖g_i‖.
      fraction_clipped: share of examples with ‖g_i‖ > C.
      loss: mean token loss of the n examples (nats/token, no dropout).
    """

    num_examples: int
    mean_clipped_norm: float
    median_example_norm: float
    fraction_clipped: float
    loss: float


def noise_norm(noise_multiplier: float, l2_clip: float, lot_size: float, num_params: int) -> float:
    """Expected norm of the noise on the averaged gradient, `σ C √d / L` (√d: E‖N(0, I_d)‖ ≈ √d)."""
    return noise_multiplier * l2_clip * math.sqrt(num_params) / lot_size


def clipped_signal(loss_fn, trainable, microbatches, l2_clip: float) -> Signal:
    """The mean clipped gradient of the examples in `microbatches` (ghost clipping).

    Args:
      loss_fn: `loss_fn(trainable, example) -> scalar` for ONE example.
      trainable: the parameters differentiated.
      microbatches: dicts of `[b, ...]` example fields plus `mask` `[b]` (as
        `bridge.to_microbatches` makes them; padding rows are masked out).
      l2_clip: C.
    """

    @jax.jit
    def grad_sum(params, batch, mask):
        return core.private_grad_sum(loss_fn, params, batch, mask, l2_clip=l2_clip)

    total, norms, loss_sum, count = None, [], 0.0, 0
    for micro in microbatches:
        mask = micro[bridge.MASK]
        batch = {k: v for k, v in micro.items() if k not in (bridge.MASK, bridge.EXAMPLE_INDEX)}
        summed, example_norms, mean_loss = grad_sum(trainable, batch, mask)
        total = summed if total is None else jax.tree.map(jnp.add, total, summed)
        real = np.asarray(mask) > 0
        norms.append(np.asarray(example_norms)[real])
        loss_sum += float(mean_loss) * int(real.sum())
        count += int(real.sum())
    if not count:
        raise ValueError("No examples: give at least one unmasked row.")
    norms = np.concatenate(norms)
    squares = sum(float(jnp.sum(jnp.square(leaf))) for leaf in jax.tree.leaves(total))
    return Signal(
        num_examples=count,
        mean_clipped_norm=math.sqrt(squares) / count,
        median_example_norm=float(np.median(norms)),
        fraction_clipped=float(np.mean(norms > l2_clip)),
        loss=loss_sum / count,
    )


def _measure(run: RunConfig, corpus, tokenizer, built, params: dict, plan, max_examples) -> dict:
    """`Signal` and noise to signal of each named parameter set on the validation split.

    `built`: `pieces.build_model`'s (model, model_config); `params`: name -> parameters.
    """
    model, model_config = built
    # The validation split alone: the private train split is not read or counted.
    validation = datasets.DatasetDict(validation=corpus["validation"])
    objective = pieces.make_objective(run.data, tokenizer)
    tokenized, _ = pieces.tokenize_corpus(run, validation, tokenizer, objective)
    lot_size = plan.expected_lot_size
    split = tokenized["validation"]
    n = min(len(split), int(max_examples or math.ceil(lot_size)))
    micro = evaluator_lib.split_microbatches(
        split.select(range(n)), run.data, run.train.physical_batch_size, tokenizer.pad_id
    )
    predicate = pieces.trainable_predicate(run.model)
    out = {
        "noise_multiplier": plan.noise_multiplier,
        "l2_clip": plan.l2_clip,
        "expected_lot_size": lot_size,
        "validation_is_private": pieces.validation_is_carved_from_train(corpus),
    }
    num_trainable = 0
    for name, values in params.items():
        trainable, frozen = models.split_params(values, predicate)
        num_trainable = sum(int(np.size(x)) for x in jax.tree.leaves(trainable))

        def loss_fn(train, example, frozen=frozen):
            return steps.example_loss(  # The training loss: its clipped gradients.
                model,
                model_config,
                models.merge_params(train, frozen),
                example,
                None,
                label_smoothing=float(run.train.label_smoothing),
            )

        out[name] = dataclasses.asdict(clipped_signal(loss_fn, trainable, micro, plan.l2_clip))
    out["num_trainable"] = num_trainable
    out["noise_norm"] = noise_norm(
        plan.noise_multiplier, plan.l2_clip, lot_size, out["num_trainable"]
    )
    for name in params:
        out[name]["noise_to_signal"] = out["noise_norm"] / max(
            out[name]["mean_clipped_norm"], 1e-30
        )
    return out


def _private_only(run: RunConfig, what: str) -> None:
    if not run.dp.enabled:
        raise ConfigError(
            f"{what}: a non-private run adds no noise and clips nothing; give a DP "
            "run's --workdir or a private config variant (e.g. :eps8)."
        )


def measure_run(run: RunConfig, workdir: str, max_examples: int | None = None) -> dict:
    """Noise-to-signal of a trained run at its initial and its latest parameters.

    Args:
      run: the run's config (`decode.load_run_config`).
      workdir: the run's folder (tokenizer, checkpoint).
      max_examples: validation examples averaged (default: L, at most the split).

    Returns:
      A JSON-able dict: the plan's σ, C, L, d, T, the steps done, whether the
      run finished, the noise norm, and per parameter set (`initial`,
      `trained`: the last iterate, where the lots' gradients are taken, not a
      `train.ema_decay` average) the `Signal` fields and `noise_to_signal`
      (noise norm / mean clipped norm).

    Raises:
      ConfigError: the run is not private (no noise, no clipping to compare).
    """
    _private_only(run, workdir)
    corpus = pieces.load_corpus(run.data)
    tokenizer, _ = pieces.build_tokenizer(run, corpus, workdir, noise_seed=None, learn=False)
    model, model_config, initial = pieces.build_model(
        run.model, tokenizer, jax.random.fold_in(jax.random.key(run.seed), 0)
    )
    trained, plan, steps_done = decode.restore_params(run, workdir, initial, iterate=True)
    # The restored arrays come back committed to their device: the initial ones placed
    # alike give jit the same signatures, so the programs compiled for the first set
    # serve the second (the ghost step from the persistent cache, when it is on).
    initial = jax.tree.map(
        lambda x, like: jax.device_put(x, like.sharding) if like.committed else x, initial, trained
    )
    out = {
        "steps_done": steps_done,
        "steps_planned": plan.num_steps,
        "finished": decode.warn_if_unfinished(workdir),
    }
    params = {"initial": initial, "trained": trained}
    built = (model, model_config)
    return out | _measure(run, corpus, tokenizer, built, params, plan, max_examples)


def measure_start(run: RunConfig, max_examples: int | None = None) -> dict:
    """Noise-to-signal of a DP config at its starting parameters, before any training.

    For choosing what to train (LoRA or the whole model, L, epochs) before any
    privacy is spent: first every check training makes before it spends
    privacy (`preflight.check_run`: public vocabulary text that is not the
    corpus's, the starting model's claim, L < N, a reachable ε); then σ from
    the config's plan for N (the train pairs kept, counted as training counts
    them: assumed public, as in every run), and the signal on the public
    validation split at the parameters training would start from. Nothing is
    written but a public vocabulary's cache.

    Args:
      run: a private config (`RunConfig.of(config)`), unit "example".
      max_examples: validation examples averaged (default: L, at most the split).

    Returns:
      `measure_run`'s dict with the `initial` set only, `steps_planned` and N.

    Raises:
      ConfigError: a non-private or per-group config, a validation split carved
        from the private train split (measuring on it would spend privacy), a
        vocabulary learnt from the private train split, or any problem
        training would refuse.
    """
    _private_only(run, "the config")
    if run.dp.unit != privacy.EXAMPLE:
        raise ConfigError(
            f"dp.unit={run.dp.unit!r}: the start is measured for per-example DP only; "
            "measure a per-group run with --workdir after training."
        )
    corpus = pieces.load_corpus(run.data)
    if pieces.validation_is_carved_from_train(corpus):
        raise ConfigError(
            f"data.corpus={run.data.corpus!r} has no validation split of its own: its "
            "validation pairs would be carved from the private train split, and measuring on "
            "them before training spends privacy; use a corpus with a public validation split."
        )
    kind = run.tokenizer_kind
    if kind not in ("pretrained", "sentencepiece_public"):
        raise ConfigError(
            f"tokenizer.kind={kind!r} learns its vocabulary from the private train split "
            "(spending privacy or outside the guarantee): measure a run's start with "
            "--workdir after training, or use a public vocabulary (sentencepiece_public) "
            "or a pretrained model's tokenizer."
        )
    with tempfile.TemporaryDirectory() as scratch:
        preflight.check_run(run, scratch, load_corpus=lambda _: corpus)
        plan = privacy.plan_privacy(
            run.dp, run.train, data_checks.kept_pairs(corpus["train"], run.data.pair)
        )
        # A public vocabulary is learnt from public text only (or read from its cache).
        learn = kind == "sentencepiece_public"
        tokenizer, _ = pieces.build_tokenizer(run, corpus, scratch, noise_seed=None, learn=learn)
        model, model_config, initial = pieces.build_model(
            run.model, tokenizer, jax.random.fold_in(jax.random.key(run.seed), 0)
        )
        built, params = (model, model_config), {"initial": initial}
        measured = _measure(run, corpus, tokenizer, built, params, plan, max_examples)
    start = {"steps_done": 0, "steps_planned": plan.num_steps, "dataset_size": plan.dataset_size}
    return start | measured


def write_run(workdir: str, max_examples: int | None = None) -> tuple[str, dict]:
    """Measures a trained run (`measure_run`) and writes its JSON; returns (path, result).

    The file goes to the workdir, or to its `private/` when the validation
    split was carved from the private training data.
    """
    result = measure_run(decode.load_run_config(workdir), workdir, max_examples)
    path = RunDir(workdir).output_path(
        NOISE_TO_SIGNAL_FILE, private=result["validation_is_private"]
    )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json(path, result)
    return path, result


def format_table(result: dict) -> str:
    """The result as a Markdown table, one row per parameter set."""
    head = (
        f"σ = {result['noise_multiplier']:.3f}, C = {result['l2_clip']:g}, "
        f"L = {result['expected_lot_size']}, d = {result['num_trainable']:,}: "
        f"noise norm σC√d/L = {result['noise_norm']:.3f}\n\n"
        "| parameters | validation loss | median ‖g_i‖ | clipped | ‖mean clip(g)‖ "
        "| noise / signal |\n"
        "|---|---|---|---|---|---|\n"
    )
    if result["validation_is_private"]:
        head = (
            "Measured on validation pairs carved from the PRIVATE training data: outside "
            "the guarantee; do not publish.\n\n" + head
        )
    rows = []
    for name in ("initial", "trained"):
        if name not in result:  # measure_start: before training.
            continue
        r = result[name]
        rows.append(
            f"| {name} | {r['loss']:.2f} | {r['median_example_norm']:.3g} | "
            f"{r['fraction_clipped']:.0%} | {r['mean_clipped_norm']:.3g} | "
            f"{r['noise_to_signal']:.1f} |"
        )
    return head + "\n".join(rows)
