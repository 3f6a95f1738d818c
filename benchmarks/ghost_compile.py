"""Compile seconds and HLO instructions of one step: non-private, ghost DP, ghost without noise.

A small Flax LM (133k parameters: tied 512-word embedding, 2 layers of
`nn.Dense` attention and MLP, d 64), batch 32 x 32 tokens, the compilation
cache off, the programs compiled one after another in one process ("ghost-per-leaf"
is the ghost DP step with the former noise, a draw per leaf:
`benchmarks.noise_compile.per_leaf_noise`):

    python -m benchmarks.ghost_compile
    MODES=jax,ghost python -m benchmarks.ghost_compile
"""

import collections
import os
import re
import time

import flax.linen as nn
import jax
import jax.numpy as jnp

from benchmarks.noise_compile import per_leaf_noise
from dpnmt import core

V, D, L, T, B = 512, 64, 2, 32, 32


class LM(nn.Module):
    """Causal LM from nn.Embed (tied head) and nn.Dense only: every layer has ghost norms."""

    @nn.compact
    def __call__(self, ids):
        embed = nn.Embed(V, D)
        h = embed(ids)
        for i in range(L):
            x = nn.LayerNorm()(h)
            q, k, v = (nn.Dense(D, name=f"{n}{i}")(x) for n in "qkv")
            a = jax.nn.softmax(q @ k.T / 8.0 + jnp.triu(jnp.full((T, T), -1e9), 1))
            h = h + nn.Dense(D, name=f"o{i}")(a @ v)
            x = nn.LayerNorm()(h)
            h = h + nn.Dense(D, name=f"wo{i}")(jax.nn.gelu(nn.Dense(4 * D, name=f"wi{i}")(x)))
        return embed.attend(nn.LayerNorm()(h))


def _programs():
    """Params, ids, and a step builder per mode."""
    model = LM()
    params = model.init(jax.random.key(0), jnp.zeros((T,), jnp.int32))["params"]
    ids = jax.random.randint(jax.random.key(1), (B, T + 1), 0, V)
    mask = jnp.ones((B,))

    def loss_fn(p, ex):
        logits = model.apply({"params": p}, ex[:-1])
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), ex[1:, None], 1))

    def step(mode):
        def f(p, ids, key):
            if mode == "jax":
                g = jax.grad(lambda p: jnp.sum(jax.vmap(loss_fn, (None, 0))(p, ids)))(p)
            else:
                g, _, _ = core.private_grad_sum(
                    loss_fn, p, ids, mask, l2_clip=1.0, clipping="ghost"
                )
                if mode == "ghost":
                    g = core.add_gaussian_noise(g, 1.0, key)
                elif mode == "ghost-per-leaf":
                    g = per_leaf_noise(g, 1.0, key)
            return jax.tree.map(lambda w, g: w - 1e-3 * g, p, g)

        return f

    return params, ids, step


def main():
    """Prints one line per mode."""
    jax.config.update("jax_enable_compilation_cache", False)
    params, ids, step = _programs()
    n = sum(v.size for v in jax.tree.leaves(params))
    out = []
    for mode in os.environ.get("MODES", "jax,ghost,ghost-per-leaf,ghost-no-noise").split(","):
        t0 = time.perf_counter()
        lowered = jax.jit(step(mode)).lower(params, ids, jax.random.key(2))
        t1 = time.perf_counter()
        compiled = lowered.compile()
        t2 = time.perf_counter()
        hlo = compiled.as_text()
        ops = collections.Counter(re.findall(r"= \S+ (\w[\w-]*)\(", hlo))
        out.append(
            f"{mode:15s} params {n} lower {t1 - t0:5.2f}s compile {t2 - t1:5.2f}s "
            f"HLO instructions {sum(ops.values())} (xor, Threefry: {ops['xor']})"
        )
    print("\n".join(out))


if __name__ == "__main__":
    main()
