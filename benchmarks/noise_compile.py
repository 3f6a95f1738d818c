"""Compile seconds (and run time) of the DP lot update: noise drawn per leaf (as before) vs once.

The update is the trainer's `core.dp_step.apply_lot` (noise once, ÷ L, the
config's optimizer) on the Multi30K config's model (`configs/multi30k.py`,
ε = 8: its 8,000-piece vocabulary, lr schedule and Adam), lowered on the
parameters' shapes, the compilation cache off. "per-leaf" replaces
`core.add_gaussian_noise` by the former one (a key and a `jax.random.normal`
draw per leaf, each with a straight-line Threefry hash that XLA compiles per
leaf); "one-draw" is the current one. Modes alternate, ROUNDS times; each
compiled update then runs 5 times on zeros (the median is printed):

    python -m benchmarks.noise_compile
    ROUNDS=1 MODES=one-draw python -m benchmarks.noise_compile
"""

import collections
import os
import re
import time
from unittest import mock

import jax
import jax.numpy as jnp

from configs import multi30k
from dpnmt import core, models
from dpnmt.core import threefry
from dpnmt.training import steps

VOCAB = 8000


def per_leaf_noise(tree, stddev, key, **_):
    """The former float `core.add_gaussian_noise`: one key and one draw per leaf."""
    leaves, treedef = jax.tree.flatten(tree)
    keys = jax.random.split(key, len(leaves))
    noised = [
        leaf + threefry.normal(k, leaf.shape) * stddev for leaf, k in zip(leaves, keys, strict=True)
    ]
    return treedef.unflatten(noised)


def update_program():
    """(jitted apply_lot, its abstract arguments, parameter count and leaves)."""
    config = multi30k.get_config("eps8")
    gated = config.model.feed_forward_proj.startswith("gated-")
    model_config = models.T5Config(  # As `training.pieces.build_model` builds it.
        model_type="t5",
        vocab_size=VOCAB,
        d_model=config.model.d_model,
        d_kv=config.model.d_kv,
        d_ff=config.model.d_ff,
        num_layers=config.model.num_layers,
        num_decoder_layers=config.model.num_decoder_layers,
        num_heads=config.model.num_heads,
        feed_forward_proj=config.model.feed_forward_proj,
        tie_word_embeddings=not gated,
        scale_decoder_outputs=not gated,
    )
    params = models.abstract_params(models.create_model(model_config))
    tx = steps.make_optimizer(config.train, 1000)
    state = jax.eval_shape(lambda p: core.TrainState(jnp.int32(0), p, tx.init(p)), params)
    acc = jax.eval_shape(core.init_accumulator, params)

    def apply_lot(state, acc, noise_base):
        return core.dp_step.apply_lot(
            state, acc, noise_base, tx=tx, noise_multiplier=1.0, l2_clip=1.0, expected_lot_size=512
        )

    leaves = jax.tree.leaves(params)
    return jax.jit(apply_lot), (state, acc, jax.random.key(0)), sum(x.size for x in leaves), leaves


def main():
    """Prints one line per mode and round."""
    jax.config.update("jax_enable_compilation_cache", False)
    update, args, size, leaves = update_program()
    zeros = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), args[:2])
    print(f"Multi30K config model: {size} parameters in {len(leaves)} leaves")
    for _ in range(int(os.environ.get("ROUNDS", "2"))):
        for mode in os.environ.get("MODES", "per-leaf,one-draw").split(","):
            noise = per_leaf_noise if mode == "per-leaf" else core.noise.add_gaussian_noise
            with mock.patch.object(core.noise, "add_gaussian_noise", noise):
                jax.clear_caches()
                t0 = time.perf_counter()
                lowered = update.lower(*args)
                t1 = time.perf_counter()
                compiled = lowered.compile()
                t2 = time.perf_counter()
            seconds = []
            for _ in range(5):
                t3 = time.perf_counter()
                jax.block_until_ready(compiled(*zeros, args[2]))
                seconds.append(time.perf_counter() - t3)
            ops = collections.Counter(re.findall(r"= \S+ (\w[\w-]*)\(", compiled.as_text()))
            print(
                f"{mode:9s} lower {t1 - t0:5.2f}s compile {t2 - t1:5.2f}s "
                f"HLO instructions {sum(ops.values())} (xor, Threefry: {ops['xor']}) "
                f"run {1e3 * sorted(seconds)[2]:.0f} ms",
                flush=True,
            )


if __name__ == "__main__":
    main()
