"""`private_grad_sum`: the clipped per-example gradient sum of a loss, by either method.

It runs `"ghost"` (`dpnmt.core.ghost`) or `"vmap"` (per-example gradients and
`dpnmt.core.clipping.clip_and_sum`), or picks one (`"auto"`, the default:
ghost where flax is installed and the loss has layers it factorises), checks
the inputs at the boundary, and optionally runs the batch in sequential
chunks. The sum's L2 sensitivity to adding or removing one example is `l2_clip`.
"""

import dataclasses
import functools
import warnings
from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp

from dpnmt.core import accumulation, deprecation, ghost, ghost_trace, validation
from dpnmt.core.clipping import call_loss, clip_and_sum

# The methods that run (`PrivateGradSum.clipping`), and the values `clipping=` takes.
CLIPPING_METHODS = ("ghost", "vmap")
AUTO = "auto"
CLIPPING_CHOICES = (AUTO, *CLIPPING_METHODS)


def check_clipping(clipping: str) -> str:
    """`clipping` if it is one of `CLIPPING_CHOICES`; ValueError naming them otherwise."""
    if clipping not in CLIPPING_CHOICES:
        raise ValueError(f"clipping={clipping!r}: use one of {CLIPPING_CHOICES}.")
    return clipping


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["grad_sum", "norms", "mean_loss"],
    meta_fields=["clipping"],
)
@dataclasses.dataclass(frozen=True)
class PrivateGradSum:
    """What `private_grad_sum` returns; unpacks as `(grad_sum, norms, mean_loss)`.

    ALL THREE ARE PRIVATE. Only `grad_sum` is meant to leave, and only through
    one noisy release per lot (`noisy_average`, `dp_step.release`).

    Attributes:
      grad_sum: sum of clipped per-example gradients (structure of `params`,
        float32 or wider); L2 sensitivity C. PRIVATE until noised.
      norms: float32 `[B]`, each example's unclipped gradient norm (non-finite
        where the example was dropped). PRIVATE: each entry is a function of
        one example, neither clipped nor noised; never log or publish it (for
        debugging, `count_nonfinite`, or a DP mechanism of your own).
      mean_loss: float32 scalar, the mean loss of the unmasked finite rows (0
        when every row is masked). PRIVATE: a private run's training loss;
        never log or publish it.
      clipping: the method that ran, `"ghost"` or `"vmap"` (what `"auto"`
        picked, or `"vmap"` where ghost clipping fell back). Public: it depends
        on the loss and the install, not on the data. A static pytree field
        (kept through `jax.jit`), not one of the three unpacked values.
    """

    grad_sum: chex.ArrayTree
    norms: chex.Array
    mean_loss: chex.Array
    clipping: str

    def _values(self) -> tuple:
        return (self.grad_sum, self.norms, self.mean_loss)

    def __iter__(self):
        """`grad_sum, norms, mean_loss = result`, as when this was a 3-tuple."""
        return iter(self._values())

    def __len__(self) -> int:
        return 3

    def __getitem__(self, index):
        return self._values()[index]


def _vmap_clipped_sum(loss_fn, params, batch, mask, l2_clip, keys, spmd_axis_name):
    """Clipped sum, norms and losses from materialised per-example gradients, and "vmap"."""
    value_and_grad = jax.vmap(
        jax.value_and_grad(functools.partial(call_loss, loss_fn)),
        in_axes=(None, 0, None if keys is None else 0),
        spmd_axis_name=spmd_axis_name,
    )
    losses, per_example_grads = value_and_grad(params, batch, keys)
    grad_sum, norms = clip_and_sum(per_example_grads, l2_clip=l2_clip, mask=mask, params=params)
    return grad_sum, norms, losses, "vmap"


def _ghost_or_vmap(loss_fn, params, batch, mask, l2_clip, keys, spmd_axis_name, *, auto):
    """`(grad_sum, norms, losses, method)`: ghost clipping, else vmap.

    vmap where loss_fn's layers cannot be intercepted (with a warning: the
    user can act), and, with `auto`, where flax is missing or no parameter is
    used only through layers ghost clipping factorises (silently: vmap is the
    right method there, and the user asked for none).
    """
    args = (loss_fn, params, batch, mask, l2_clip, keys, spmd_axis_name)
    if auto and not ghost.has_flax():
        return _vmap_clipped_sum(*args)
    try:
        return (*ghost.ghost_clipped_sum(*args, require_layers=auto), "ghost")
    except ghost.NothingToFactoriseError:
        return _vmap_clipped_sum(*args)
    except ghost.UNINTERCEPTABLE as error:
        reason = ghost_trace.fallback_reason(
            error,
            "it uses nn.scan, nn.vmap or another lifted transform, or a jax.checkpoint "
            "closing over the parameters?",
        )
    warnings.warn(
        f"ghost clipping cannot intercept the layers of loss_fn ({reason}); "
        "falling back to per-example gradients "
        "for all parameters (as clipping='vmap': same sum, B copies of the gradient in "
        "memory). Pass clipping='vmap' to choose this explicitly.",
        ghost.GhostClippingWarning,
        stacklevel=4,
    )
    return _vmap_clipped_sum(*args)


def from_batched_loss(batched_loss_fn: Callable[..., chex.Array]) -> Callable[..., chex.Array]:
    """Adapts a loss written for a batch of one (jax_privacy's convention) to ONE example.

    dpnmt.core calls `loss_fn(params, example[, key])` with one example without
    its batch axis and vmaps it; jax_privacy's `clipped_grad` (and most
    training code) calls a loss on a batch and slices it into batches of one.
    The adaptor adds a leading axis of size 1 to every leaf of the example,
    calls `batched_loss_fn(params, batch[, key])` and returns its one value as
    a scalar (a mean or sum over a batch of one is that example's loss).

        loss_fn = core.from_batched_loss(jax_privacy_style_loss)
        core.private_grad_sum(loss_fn, params, batch, mask, l2_clip=1.0)

    Args:
      batched_loss_fn: `batched_loss_fn(params, batch) -> loss` (or with a
        third argument, the example's key, when a `dropout_key` is given),
        where every leaf of `batch` is `[1, ...]` and `loss` holds one value
        (shape `()` or `(1,)`). It must not mix examples (no batch statistics).

    Returns:
      `loss_fn(params, example[, key]) -> scalar` for ONE example, to pass as
      `loss_fn` to `private_grad_sum`, `private_lot_gradient`, `dp_multi_steps`
      or `dp_step.add_microbatch`.
    """

    @functools.wraps(batched_loss_fn)
    def loss_fn(params, example, *key):
        batch = jax.tree.map(lambda leaf: jnp.asarray(leaf)[None], example)
        loss = jnp.asarray(batched_loss_fn(params, batch, *key))
        if loss.size != 1:
            raise ValueError(
                f"from_batched_loss: the batched loss returned shape {loss.shape} for a "
                "batch of one; return one value (the batch's mean or sum) or a [1] vector."
            )
        return loss.reshape(())

    return loss_fn


def checked_scalar_loss(loss_fn):
    """`loss_fn`, raising ValueError at trace time unless it returns a scalar for one example.

    Checked on the trace the clipping makes anyway: a separate `eval_shape`
    traced the whole model once more per compiled shape (a fifth of the
    start-up's tracing of a T5 training step).
    """

    @functools.wraps(loss_fn)
    def checked(*args):
        out = loss_fn(*args)
        shapes = [jnp.shape(leaf) for leaf in jax.tree.leaves(out)]
        if shapes != [()]:
            raise ValueError(
                f"loss_fn must return a scalar loss for ONE example (batch sliced without its "
                f"leading axis), but returned shape(s) {shapes}: compute each example's own "
                "loss (e.g. its mean token loss); the clipping code vmaps it over the batch."
            )
        return out

    return checked


@deprecation.deprecated_arguments(renamed={"key": "dropout_key"}, positional=("l2_clip",))
def private_grad_sum(
    loss_fn: Callable[..., chex.Array],
    params: chex.ArrayTree,
    batch: Any,
    mask: chex.Array,
    *,
    l2_clip: float,
    dropout_key: chex.PRNGKey | None = None,
    spmd_axis_name: str | None = None,
    clipping: str = AUTO,
    microbatch_size: int | None = None,
) -> PrivateGradSum:
    """Sum of clipped per-example gradients, with per-example norms and the mean loss (all PRIVATE).

    Both methods return the same sum (up to float32 rounding):
    `"vmap"` materialises every example's gradient with `vmap(grad)` (memory
    B × parameters); `"ghost"` (`dpnmt.core.ghost`) computes each example's
    norm layer by layer from the inputs and output gradients of the Flax
    `nn.Dense` / `nn.Embed` calls inside `loss_fn`, and falls back to
    per-example gradients only for the parameters it cannot factorise. A
    `loss_fn` whose layers cannot be intercepted (`nn.scan`, `nn.vmap`) gets
    the `vmap` result, with a `ghost.GhostClippingWarning` saying why.
    `"auto"` (the default) runs `"ghost"` where flax is installed and some
    parameter is used only through layers it factorises, and `"vmap"`
    otherwise (no flax, or a pure-JAX loss: silently, the same sum); the
    result's `clipping` says which ran. `"ghost"` asked for explicitly needs
    flax (the `ghost` extra): without it, it raises rather than switching to
    `"vmap"`, and on a loss with nothing to factorise it warns.

    Args:
      loss_fn: `loss_fn(params, example) -> scalar` for ONE example (a slice of
        `batch` without the leading axis), or `loss_fn(params, example, key)`
        when `dropout_key` is given (a loss written for a batch of one, as
        jax_privacy's: wrap it in `from_batched_loss`). The loss must depend
        on that example alone (e.g. the example's own mean token loss), never
        on batch statistics.
      params: the parameters to differentiate (pass only trainable ones; frozen
        parameters can be closed over by `loss_fn` and then cost no
        per-example memory). For `"ghost"`, `loss_fn` must pass these leaves
        to `module.apply` unchanged (merging with frozen ones is fine).
      batch: pytree, every leaf `[B, ...]`.
      mask: `[B]` 0/1 indicator, 1 for real examples, 0 for padding rows (not
        weights; a traced mask counts any non-zero entry as 1).
      l2_clip: clipping norm C > 0, a concrete number: close over it or mark it
        static under `jax.jit` (a traced C is refused: it cannot be checked).
      dropout_key: optional PRNG key; each example gets its own key
        `jax.random.split(dropout_key, B)[i]` (e.g. for dropout), whatever the
        method and micro-batching. Use a different key for every batch
        (`dropout_key(dropout_base, step, index)`), never the noise key.
      spmd_axis_name: passed to `jax.vmap` for batches sharded over a mesh axis.
      clipping: `"auto"` (default: ghost where it applies and flax is
        installed, else vmap), `"ghost"` (needs flax, `pip install
        "dpnmt[ghost]"`) or `"vmap"`.
      microbatch_size: if set, the batch is processed in sequential chunks of
        this many examples (B must be a multiple of it) to bound peak memory;
        the result is the same.

    Raises:
      ImportError: `clipping="ghost"` without flax installed (the `ghost` extra).
      TypeError: `l2_clip` is traced (an argument of `jax.jit`).
      ValueError: bad `clipping`, `microbatch_size`, `l2_clip`, `mask` (shape
        other than `[B]`, or concrete entries other than 0/1), batch leaves of
        different lengths, an empty batch (B = 0), or a `loss_fn` that does not return a scalar.

    Returns:
      `PrivateGradSum(grad_sum, norms, mean_loss, clipping)`: the clipped sum
      (structure of `params`), float32 `[B]` unclipped norms, and the float32
      mean loss over unmasked, finite rows (0 when every row is masked), ALL
      PRIVATE: the norms and the loss are un-noised functions of the examples;
      never log or publish them, and release the sum only through one noisy
      release per lot. `clipping` (public) names the method that ran.
    """
    check_clipping(clipping)
    if clipping == "ghost":
        ghost.require_flax()
    l2_clip = validation.check_positive("l2_clip", l2_clip)
    batch_size = validation.check_batch_axis("batch", batch)
    validation.check_mask(mask, batch_size)
    mask = jnp.asarray(mask)
    loss_fn = checked_scalar_loss(loss_fn)
    keys = None if dropout_key is None else jax.random.split(dropout_key, batch_size)
    if clipping == "vmap":
        method = _vmap_clipped_sum
    else:
        method = functools.partial(_ghost_or_vmap, auto=clipping == AUTO)
    ran = []  # The method that ran, set while tracing (a chunk's scan body runs once).

    def run(chunk, chunk_mask, chunk_keys):
        *sums, name = method(
            loss_fn, params, chunk, chunk_mask, l2_clip, chunk_keys, spmd_axis_name
        )
        ran.append(name)
        return sums

    if microbatch_size is None or microbatch_size >= batch_size:
        grad_sum, norms, losses = run(batch, mask, keys)
    else:
        if microbatch_size <= 0 or batch_size % microbatch_size:
            raise ValueError(
                f"microbatch_size={microbatch_size} must be a positive divisor of the batch "
                f"size {batch_size}; pick a divisor or leave it unset."
            )
        chunks = batch_size // microbatch_size

        def split(v):
            return v.reshape((chunks, microbatch_size) + v.shape[1:])

        def body(total, xs):
            chunk_sum, chunk_norms, chunk_losses = run(*xs)
            total = jax.tree_util.tree_map(jnp.add, total, chunk_sum)
            return total, (chunk_norms, chunk_losses)

        zeros = accumulation.init_accumulator(params).grad_sum
        xs = (
            jax.tree_util.tree_map(split, batch),
            split(mask),
            None if keys is None else split(keys),
        )
        grad_sum, (norms, losses) = jax.lax.scan(body, zeros, xs)
        norms, losses = norms.reshape(batch_size), losses.reshape(batch_size)
    counted = (mask.astype(jnp.float32) != 0) & jnp.isfinite(norms) & jnp.isfinite(losses)
    total = jnp.sum(jnp.where(counted, losses.astype(jnp.float32), 0.0))
    mean_loss = total / jnp.maximum(jnp.sum(counted.astype(jnp.float32)), 1.0)
    return PrivateGradSum(grad_sum, norms, mean_loss, ran[-1])
