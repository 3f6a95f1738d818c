"""The clipped gradient sum of one batch, five ways, side by side on the same models.

Modes, each one jitted call from params and a batch to a gradient pytree:
`nonprivate` (the gradient of the summed per-example losses), `dpnmt_vmap`
(`core.private_grad_sum(clipping="vmap")`, the path of `dp_aggregate`,
`dp_multi_steps` and `dp_step.add_per_example_grads` too), `dpnmt_ghost`
(`clipping="ghost"`), `jax_privacy` (`jax_privacy.clipped_grad`, when
installed) and `hand_tensordot` (vmap(grad), norms, `min(1, C/‖g‖)`, one
`tensordot` a leaf: the floor a per-example clip can reach, with no NaN
safety) and `old_where_sum` (the same with dpnmt's summation before issue 30:
`where` + `sum(axis=0)`, NaN-safe: before/after in one run). No noise: that
costs the same whichever way the sum was clipped.

Models: an MLP (256 → 256 → 256 → 10, batch 64, C = 1) and a small causal LM
in Flax (vocabulary 512, width 64, 2 blocks of single-head attention and an
MLP, all `nn.Dense`/`nn.Embed`, 32 tokens, batch 32). Modes take turns step
by step (`timing.time_interleaved`), so load hits all alike. Each mode's sum
is also compared with `hand_tensordot`'s (max relative difference).

    python -m benchmarks.core_clip                 # both models, 20 steps
    python -m benchmarks.core_clip --models=mlp --steps=50
"""

import argparse
import functools
import statistics
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.timing import time_interleaved
from dpnmt import core
from dpnmt.core import ghost

L2_CLIP = 1.0


class Mlp(nn.Module):
    @nn.compact
    def __call__(self, x):
        for width in (256, 256):
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(10)(x)


class TinyLm(nn.Module):
    vocab: int = 512
    width: int = 64
    blocks: int = 2

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(self.vocab, self.width)(tokens)
        causal = jnp.tril(jnp.ones((tokens.shape[-1], tokens.shape[-1]), bool))
        for _ in range(self.blocks):
            q, k, v = (nn.Dense(self.width)(x) for _ in range(3))
            scores = jnp.where(causal, q @ k.T / np.sqrt(self.width), -1e9)
            x = x + nn.Dense(self.width)(jax.nn.softmax(scores) @ v)
            x = x + nn.Dense(self.width)(nn.gelu(nn.Dense(4 * self.width)(x)))
        return nn.Dense(self.vocab)(x)


def _mlp_problem(batch_size=64):
    model = Mlp()
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(batch_size, 256)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 10, size=batch_size), jnp.int32)
    params = model.init(jax.random.key(0), x[:1])

    def loss_fn(params, example):
        logits = model.apply(params, example["x"])
        return -jax.nn.log_softmax(logits)[example["y"]]

    return loss_fn, params, {"x": x, "y": y}


def _lm_problem(batch_size=32, length=32):
    model = TinyLm()
    rng = np.random.default_rng(1)
    tokens = jnp.asarray(rng.integers(0, 512, size=(batch_size, length + 1)), jnp.int32)
    params = model.init(jax.random.key(1), tokens[0, :-1])

    def loss_fn(params, example):
        logits = model.apply(params, example["tokens"][:-1])
        picked = jnp.take_along_axis(
            jax.nn.log_softmax(logits), example["tokens"][1:, None], axis=-1
        )
        return -jnp.mean(picked)

    return loss_fn, params, {"tokens": tokens}


PROBLEMS = {"mlp": _mlp_problem, "lm": _lm_problem}


def _hand_tensordot(loss_fn, params, batch):
    grads = jax.vmap(jax.grad(loss_fn), in_axes=(None, 0))(params, batch)
    leaves = jax.tree.leaves(grads)
    rows = leaves[0].shape[0]
    norms = jnp.sqrt(sum(jnp.sum(jnp.square(g.reshape(rows, -1)), axis=1) for g in leaves))
    factors = jnp.minimum(1.0, L2_CLIP / norms)
    return jax.tree.map(lambda g: jnp.tensordot(factors, g, axes=1), grads)


def _hand_where_sum(loss_fn, params, batch):
    """dpnmt's summation before issue 30: scale each row, `where`, `sum(axis=0)`."""
    grads = jax.vmap(jax.grad(loss_fn), in_axes=(None, 0))(params, batch)
    leaves = jax.tree.leaves(grads)
    rows = leaves[0].shape[0]
    norms = jnp.sqrt(sum(jnp.sum(jnp.square(g.reshape(rows, -1)), axis=1) for g in leaves))
    keep = jnp.isfinite(norms)
    factors = jnp.where(keep, L2_CLIP / jnp.maximum(jnp.where(keep, norms, 1.0), L2_CLIP), 0.0)

    def one(g):
        shape = (-1,) + (1,) * (g.ndim - 1)
        return jnp.sum(jnp.where(keep.reshape(shape), g * factors.reshape(shape), 0.0), axis=0)

    return jax.tree.map(one, grads)


def _jax_privacy(loss_fn, params, batch):
    import jax_privacy  # noqa: PLC0415 - optional: the mode is skipped when absent

    def batch_of_one(params, batch):  # jax_privacy's convention: a batch of one.
        return loss_fn(params, jax.tree.map(lambda v: v[0], batch))

    return jax_privacy.clipped_grad(batch_of_one, l2_clip_norm=L2_CLIP, batch_argnums=1)(
        params, batch
    )


def modes(loss_fn, params, batch) -> dict:
    """name -> jitted `f(params, batch) -> gradient pytree`."""
    mask = jnp.ones(jax.tree.leaves(batch)[0].shape[0])

    def dpnmt(clipping, params, batch):
        return core.private_grad_sum(
            loss_fn, params, batch, mask, l2_clip=L2_CLIP, clipping=clipping
        )[0]

    def nonprivate(params, batch):
        losses = jax.vmap(loss_fn, in_axes=(None, 0))
        return jax.grad(lambda p: jnp.sum(losses(p, batch)))(params)

    found = {
        "nonprivate": nonprivate,
        "dpnmt_vmap": functools.partial(dpnmt, "vmap"),
        "dpnmt_ghost": functools.partial(dpnmt, "ghost"),
        "hand_tensordot": functools.partial(_hand_tensordot, loss_fn),
        "old_where_sum": functools.partial(_hand_where_sum, loss_fn),
    }
    try:
        import jax_privacy  # noqa: F401, PLC0415
    except ImportError:
        print("jax_privacy: not installed, its mode is skipped")
    else:
        found["jax_privacy"] = functools.partial(_jax_privacy, loss_fn)
    return {name: jax.jit(f) for name, f in found.items()}


def _max_relative_difference(got, want) -> float:
    diffs = jax.tree.map(
        lambda a, b: float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(b)) + 1e-30)), got, want
    )
    return max(jax.tree.leaves(diffs))


def run(model: str, steps: int) -> list[dict]:
    loss_fn, params, batch = PROBLEMS[model]()
    jitted = modes(loss_fn, params, batch)
    results = {name: f(params, batch) for name, f in jitted.items()}
    calls = {name: functools.partial(_block, f, params, batch) for name, f in jitted.items()}
    times = time_interleaved(calls, steps)
    hand = statistics.median(times["hand_tensordot"])
    base = statistics.median(times["nonprivate"])
    rows = []
    for name, samples in times.items():
        median = statistics.median(samples)
        rows.append(
            {
                "model": model,
                "mode": name,
                "ms": 1e3 * median,
                "vs_hand": median / hand,
                "vs_nonprivate": median / base,
                "diff_vs_hand": None
                if name == "nonprivate"
                else _max_relative_difference(results[name], results["hand_tensordot"]),
            }
        )
    return rows


def _block(f, params, batch):
    jax.block_until_ready(f(params, batch))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,lm")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", ghost.GhostClippingWarning)
    print(f"device: {jax.devices()[0].device_kind}, {args.steps} steps a mode, median")
    print(f"{'model':6} {'mode':15} {'ms':>9} {'/hand':>7} {'/nonpriv':>9} {'sum vs hand':>12}")
    for model in args.models.split(","):
        for row in run(model, args.steps):
            diff = "" if row["diff_vs_hand"] is None else f"{row['diff_vs_hand']:.1e}"
            print(
                f"{row['model']:6} {row['mode']:15} {row['ms']:9.2f} {row['vs_hand']:7.2f} "
                f"{row['vs_nonprivate']:9.2f} {diff:>12}"
            )


if __name__ == "__main__":
    main()
