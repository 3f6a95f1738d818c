"""DP-SGD for a tiny Flax NNX language model with ghost clipping (`dpnmt.core` alone).

Model: `nnx.Embed` -> residual `nnx.LayerNorm` + `nnx.Linear` block -> a head
tied to the embedding (`Embed.attend`). Data: sequences that count up modulo
the vocabulary (next token = token + 1), generated here from a fixed seed.

Each step: a JAX Poisson lot (`poisson_lot`, q = L/N, padded to a capacity from
`lot_capacity`) -> masked micro-batches, each clipped by `private_grad_sum_nnx`
(ghost clipping: per-example norms of the Linear and Embed parameters from
their inputs and output gradients, per-example gradients only for the
LayerNorm vectors) -> `accumulate` -> `noisy_average` (noise once, / L) ->
`nnx.Optimizer`. The step compiles once whatever the lot size. Prints the
held-out loss before and after training and the accountant's ε.

    python examples/dp_nnx_lm.py [--steps 30] [--epsilon 2]
"""

import argparse

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from dpnmt import core

VOCAB, LENGTH, CLIP = 16, 8, 1.0


class TinyLM(nnx.Module):
    """Embed + LayerNorm + Linear with a tied output head."""

    def __init__(self, rngs: nnx.Rngs, width: int = 32):
        self.embed = nnx.Embed(VOCAB, width, rngs=rngs)
        self.norm = nnx.LayerNorm(width, rngs=rngs)
        self.mlp = nnx.Linear(width, width, rngs=rngs)

    def __call__(self, ids: jax.Array) -> jax.Array:
        """Logits `[T, VOCAB]` for token ids `[T]`."""
        h = self.embed(ids)
        return self.embed.attend(h + jax.nn.gelu(self.mlp(self.norm(h))))


def loss_fn(model: TinyLM, ids: jax.Array) -> jax.Array:
    """ONE sequence's own mean next-token loss (never a batch statistic)."""
    logits = model(ids[:-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, ids[1:]).mean()


def counting_sequences(num: int, seed: int) -> jax.Array:
    """`[num, LENGTH]` int32 sequences `s, s+1, ...` (mod VOCAB) from random starts."""
    starts = jax.random.randint(jax.random.key(seed), (num, 1), 0, VOCAB)
    return (starts + jnp.arange(LENGTH)) % VOCAB


def train(steps: int = 30, epsilon: float = 2.0, num_train: int = 4096, lot_size: int = 256):
    """Trains with DP-SGD; returns (held-out loss before, after, ε spent)."""
    delta, microbatch = 1e-5, 64
    rate = lot_size / num_train
    data, held_out = counting_sequences(num_train, 1), counting_sequences(256, 2)
    sigma = core.calibrate_noise_multiplier(epsilon, rate, steps, delta)
    capacity = core.lot_capacity(num_train, rate, microbatch, num_steps=steps)
    sample_key = core.key_from_seed(core.fresh_seed())
    noise_key = core.key_from_seed(core.fresh_seed())
    model = TinyLM(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(3e-2), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, t):
        lot = core.poisson_lot(
            jax.random.fold_in(sample_key, t),
            num_train,
            rate,
            microbatch_size=microbatch,
            max_microbatches=capacity,
        )

        def add(acc, k):  # micro-batch k: its rows (checked against N), ghost-clipped to CLIP
            rows, mask = lot.gather(data, k), lot.mask[k]
            clipped = core.private_grad_sum_nnx(loss_fn, model, rows, mask, l2_clip=CLIP)
            return core.accumulate(acc, clipped.grad_sum, jnp.sum(mask)), None

        empty = core.init_accumulator(nnx.state(model, nnx.Param))
        acc, _ = jax.lax.scan(add, empty, jnp.arange(capacity))
        key = core.noise_key_for_step(noise_key, t)
        optimizer.update(
            model,
            core.noisy_average(
                acc, key, l2_clip=CLIP, noise_multiplier=sigma, expected_lot_size=lot_size
            ),
        )

    def held_out_loss():
        return float(jnp.mean(jax.vmap(lambda ids: loss_fn(model, ids))(held_out)))

    before = held_out_loss()
    for t in range(steps):
        step(model, optimizer, t)
    spent = core.compute_epsilon(sigma, rate, steps, delta)
    return before, held_out_loss(), spent


def main() -> None:
    """Trains and prints the held-out loss and ε."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--epsilon", type=float, default=2.0)
    args = parser.parse_args()
    before, after, spent = train(args.steps, args.epsilon)
    print(f"held-out loss {before:.3f} -> {after:.3f}, ε={spent:.2f} (δ=1e-5)")


if __name__ == "__main__":
    main()
