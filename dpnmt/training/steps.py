"""The one DP-SGD lot step, sharded on the data mesh: training and every privacy test run it.

A thin, jitted and sharded user of `dpnmt.core.dp_step` (the core-owned lot
step). One step = one lot. Each fixed-shape masked micro-batch (sharded
`P('data')`) adds its sum of clipped per-example gradients to a replicated
accumulator (`add_microbatch`); the lot's update adds Gaussian noise ONCE to
that global sum and divides by the fixed expected lot size L (`release`), then
applies the optimizer to a `core.TrainState` (`apply_lot`). The state, the
accumulator and the keys are replicated: the batch-axis sum makes XLA
all-reduce across devices, and the noise drawn from the replicated key on the
replicated sum is drawn once, never once per device (σC√D). With
`group_cap=k` (dp.unit="group") a micro-batch's rows are whole groups of k,
each group's gradient clipped to C once, and L counts groups.
"""

import dataclasses
from collections.abc import Callable, Sequence

import chex
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from dpnmt import core, models
from dpnmt.bridge.dataset import INPUT_IDS, INPUT_LENGTH, LABEL_LENGTH, LABELS
from dpnmt.bridge.microbatch import EXAMPLE_INDEX, MASK
from dpnmt.bridge.sharding import batch_sharding, replicated_sharding

# `loss_fn(params, example, dropout_key) -> scalar` for ONE example (params:
# trainable and frozen merged; dropout_key None at evaluation).
ExampleLoss = Callable[[chex.ArrayTree, dict, chex.PRNGKey | None], chex.Array]


def example_loss(
    model, model_config, params, example, dropout_key, *, label_smoothing: float = 0.0
) -> jax.Array:
    """Token-mean cross-entropy of ONE example (padding tokens ignored).

    Args:
      model: the Flax seq2seq module.
      model_config: its config (decoder input convention).
      params: full parameters.
      example: `input_ids [S]`, `input_length []`, `labels [T]`, `label_length []`.
      dropout_key: this example's own dropout key, or None for no dropout.
      label_smoothing: s in [0, 1): each token's target is (1 - s) on its label
        plus s / V on every one of the V classes (`optax.smooth_labels`); 0 is
        plain cross-entropy.

    Returns:
      float32 scalar: the mean over the example's own target tokens, so the
      loss never depends on other examples.
    """
    source_length = example[INPUT_IDS].shape[0]
    target_length = example[LABELS].shape[0]
    input_ids = example[INPUT_IDS][None]
    attention_mask = (jnp.arange(source_length) < example[INPUT_LENGTH])[None].astype(jnp.int32)
    target_mask = jnp.arange(target_length) < example[LABEL_LENGTH]
    labels = jnp.where(target_mask, example[LABELS], model_config.pad_token_id)[None]
    decoder_input_ids = models.decoder_inputs(model_config, labels)
    rngs = None if dropout_key is None else {"dropout": dropout_key}
    logits = model.apply(
        {"params": params},
        input_ids,
        attention_mask,
        decoder_input_ids,
        deterministic=dropout_key is None,
        rngs=rngs,
    )[0]
    token_losses = smoothed_cross_entropy(logits.astype(jnp.float32), labels[0], label_smoothing)
    num_tokens = jnp.maximum(jnp.sum(target_mask), 1)
    return jnp.sum(jnp.where(target_mask, token_losses, 0.0)) / num_tokens


def smoothed_cross_entropy(logits: jax.Array, labels: jax.Array, smoothing: float) -> jax.Array:
    """Per-token cross-entropy against label-smoothed targets.

    Args:
      logits: `[T, V]` float32.
      labels: `[T]` integer ids.
      smoothing: s in [0, 1), a Python float; 0 gives optax's plain
        `softmax_cross_entropy_with_integer_labels` exactly.

    Returns:
      `[T]`: (1 - s) * (-log p[label]) + s * mean over the V classes of -log p,
      i.e. `optax.softmax_cross_entropy(logits, optax.smooth_labels(one_hot, s))`
      without building the `[T, V]` one-hot targets.
    """
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"train.label_smoothing={smoothing!r} must be in [0, 1).")
    if smoothing == 0.0:
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(log_probs, labels[:, None], axis=-1)[:, 0]
    return (1.0 - smoothing) * nll - smoothing * jnp.mean(log_probs, axis=-1)


def make_optimizer(train_config, num_steps: int) -> optax.GradientTransformation:
    """The optax optimizer, with linear warm-up and the configured decay."""
    peak, warmup = train_config.learning_rate, min(train_config.warmup_steps, num_steps)
    decay_steps = max(num_steps - warmup, 1)
    if train_config.decay == "constant":
        after = optax.constant_schedule(peak)
    elif train_config.decay == "linear":
        after = optax.linear_schedule(peak, 0.0, decay_steps)
    elif train_config.decay == "cosine":
        after = optax.cosine_decay_schedule(peak, decay_steps)
    else:
        raise ValueError(f"train.decay={train_config.decay!r}: use constant, linear or cosine.")
    schedule = optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), after], [warmup])
    name = train_config.optimizer
    if name == "sgd":
        return optax.sgd(schedule)
    if name == "adam":
        return optax.adam(schedule)
    if name == "adamw":
        return optax.adamw(schedule, weight_decay=train_config.weight_decay)
    if name == "adafactor":
        return optax.adafactor(schedule)
    raise ValueError(f"train.optimizer={name!r}: use sgd, adam, adamw or adafactor.")


@dataclasses.dataclass(frozen=True)
class StepPrivacy:
    """What the step needs of the privacy plan.

    Attributes:
      private: False: plain gradient of the summed losses, no clipping or noise.
      l2_clip: C > 0.
      noise_multiplier: σ >= 0.
      expected_lot_size: L, the constant divisor (never the realised lot size).
      noise_mode: "float" | "secure" (`core.noisy_average`'s `noise_mode`).
    """

    private: bool
    l2_clip: float
    noise_multiplier: float
    expected_lot_size: int
    noise_mode: str = "float"

    @classmethod
    def from_plan(cls, plan) -> "StepPrivacy":
        """The step's part of a `dpnmt.privacy.PrivacyPlan`."""
        return cls(
            plan.private,
            plan.l2_clip,
            plan.noise_multiplier,
            plan.expected_lot_size,
            plan.noise_mode,
        )


@dataclasses.dataclass(frozen=True)
class LotStep:
    """Jitted, sharded pieces of one lot's update.

    Attributes:
      add_microbatch: `(acc, trainable, frozen, micro, dropout_key) -> (acc,
        loss_sum)`: adds one sharded micro-batch's (clipped) gradient sum; the
        summed loss of its real rows is private (never publish it in a DP run).
      release: `(acc, noise_key) -> gradient` like `trainable`: private,
        `(Σ clipped + N(0, σ²C²)) / L` with the noise drawn once; else `Σ / L`.
      apply_lot: `(state, acc, noise_base) -> state` on a `core.TrainState`
        (donated): `release` with lot `state.step`'s noise key
        (`core.dp_step.noise_key(noise_base, state.step)`; `noise_base` is the
        run's SECRET noise base key), then the optimizer; `step` + 1.
    """

    add_microbatch: Callable[..., tuple[core.AccumulatorState, jax.Array]]
    release: Callable[[core.AccumulatorState, chex.PRNGKey], chex.ArrayTree]
    apply_lot: Callable[[core.TrainState, core.AccumulatorState, chex.PRNGKey], core.TrainState]


def _examples(micro: dict) -> dict:
    return {name: values for name, values in micro.items() if name not in (MASK, EXAMPLE_INDEX)}


def make_lot_step(
    loss_fn: ExampleLoss,
    tx: optax.GradientTransformation,
    privacy: StepPrivacy,
    mesh: Mesh,
    *,
    clipping: str = "ghost",
    clipping_chunk: int = 0,
    group_cap: int | None = None,
) -> LotStep:
    """Builds the jitted lot step with explicit shardings on `mesh`.

    Args:
      loss_fn: `loss_fn(params, example, dropout_key) -> scalar` for ONE example
        (the micro-batch fields without the batch axis, `mask` and
        `example_index` removed); params are trainable and frozen merged.
      tx: the optimizer (`make_optimizer`).
      privacy: clipping norm, σ and L (`StepPrivacy.from_plan`).
      mesh: the data mesh (`bridge.make_data_mesh`): micro-batches `P('data')`,
        everything else replicated.
      clipping: "ghost" | "vmap" (`core.private_grad_sum`); cost, not result.
      clipping_chunk: rows per sequential clipping chunk (0: all at once).
      group_cap: None for example-level DP. k for group-level DP
        (`dp.unit="group"`): each micro-batch's b rows are b / k whole groups
        of k rows (`bridge.to_group_microbatches`), and each group's gradient
        is clipped to C as one contribution (`core.dp_step.add_group_microbatch`);
        `privacy.expected_lot_size` is then L_groups.

    Returns:
      A `LotStep`; each piece compiles once per micro-batch shape.
    """
    replicated, data = replicated_sharding(mesh), batch_sharding(mesh)

    def add_microbatch(acc, trainable, frozen, micro, key):
        batch, mask = _examples(micro), micro[MASK]

        def one_loss(params, example, example_key):
            return loss_fn(models.merge_params(params, frozen), example, example_key)

        if privacy.private and group_cap is not None:
            groups = mask.shape[0] // group_cap  # Whole groups: bridge.to_group_microbatches.

            def regroup(values):
                return values.reshape((groups, group_cap, *values.shape[1:]))

            return core.dp_step.add_group_microbatch(
                acc,
                one_loss,
                trainable,
                jax.tree.map(regroup, batch),
                regroup(mask),
                l2_clip=privacy.l2_clip,
                dropout_key=key,
                clipping=clipping,
            )
        if privacy.private:
            return core.dp_step.add_microbatch(
                acc,
                one_loss,
                trainable,
                batch,
                mask,
                l2_clip=privacy.l2_clip,
                dropout_key=key,
                clipping=clipping,
                microbatch_size=clipping_chunk or None,
            )
        # Non-private baseline: plain gradient of the sum of example losses.
        keys = jax.random.split(key, mask.shape[0])

        def summed(params):
            losses = jax.vmap(one_loss, in_axes=(None, 0, 0))(params, batch, keys)
            return jnp.sum(jnp.where(mask != 0, losses, 0.0))

        loss_sum, grad_sum = jax.value_and_grad(summed)(trainable)
        return core.accumulate(acc, grad_sum, jnp.sum(mask != 0).astype(jnp.int32)), loss_sum

    noise = {
        "noise_multiplier": privacy.noise_multiplier,
        "l2_clip": privacy.l2_clip,
        "expected_lot_size": privacy.expected_lot_size,
        "noise_mode": privacy.noise_mode,
    }

    def release(acc, noise_key):
        if privacy.private:
            return core.dp_step.release(acc, noise_key, **noise)
        return jax.tree.map(lambda g: g / privacy.expected_lot_size, acc.grad_sum)

    def apply_lot(state, acc, noise_base):
        if privacy.private:
            return core.dp_step.apply_lot(state, acc, noise_base, tx=tx, **noise)
        return core.dp_step.apply_gradient(state, release(acc, None), tx)

    return LotStep(
        add_microbatch=jax.jit(
            add_microbatch,
            in_shardings=(replicated, replicated, replicated, data, replicated),
            out_shardings=(replicated, replicated),
            donate_argnums=0,
        ),
        release=jax.jit(release, in_shardings=(replicated, replicated), out_shardings=replicated),
        apply_lot=jax.jit(
            apply_lot,
            in_shardings=(replicated, replicated, replicated),
            out_shardings=replicated,
            donate_argnums=0,
        ),
    )


def make_eval_loss(loss_fn: ExampleLoss, mesh: Mesh) -> Callable:
    """`(params, micro) -> (loss_sum, count)` over a micro-batch's real rows, on `mesh`.

    Evaluation runs on each process's own devices (`distributed.local_mesh`),
    so it is built for that mesh, apart from the training step.
    """
    replicated, data = replicated_sharding(mesh), batch_sharding(mesh)

    def eval_loss(params, micro):
        losses = jax.vmap(lambda example: loss_fn(params, example, None))(_examples(micro))
        mask = micro[MASK] != 0
        return jnp.sum(jnp.where(mask, losses, 0.0)), jnp.sum(mask)

    return jax.jit(eval_loss, in_shardings=(replicated, data), out_shardings=replicated)


def lot_gradient(
    step: LotStep,
    trainable: chex.ArrayTree,
    microbatches: Sequence[dict[str, jax.Array]],
    noise_key: chex.PRNGKey,
    *,
    frozen: chex.ArrayTree | None = None,
    dropout_key: chex.PRNGKey | None = None,
) -> chex.ArrayTree:
    """The released gradient of one lot (any number of micro-batches, even 0).

    The trainer's loop, without the optimizer: for tests and tools that check
    what a lot releases.

    Args:
      step: from `make_lot_step`.
      trainable: replicated parameters to differentiate.
      microbatches: the lot's sharded micro-batches; an empty lot has none and
        still gets a (noise-only) gradient.
      noise_key: this step's noise key; never reuse it.
      frozen: parameters not trained (default none).
      dropout_key: base of the micro-batches' dropout keys (default key(0)).

    Returns:
      Pytree like `trainable`: `(Σ clipped grads + N(0, (σC)²)) / L`.
    """
    frozen = {} if frozen is None else frozen
    dropout_key = jax.random.key(0) if dropout_key is None else dropout_key
    acc = core.init_accumulator(trainable)
    for index, micro in enumerate(microbatches):
        key = jax.random.fold_in(dropout_key, index)
        acc, _ = step.add_microbatch(acc, trainable, frozen, micro, key)
    return step.release(acc, noise_key)
