"""DP-SGD for a small Flax classifier with `dpnmt.core` alone (no torch, no data download).

Data: 8x8 images of a bar (horizontal, vertical, diagonal or anti-diagonal,
at a random offset) in Gaussian noise, generated here from a fixed seed, so
the example needs nothing beyond `pip install "dpnmt[ghost]"` (no scikit-learn).

Each step: a JAX Poisson lot (`poisson_lot`, q = L/N, padded to a capacity
from `lot_capacity`) -> fixed-shape micro-batches -> `private_lot_gradient`
(`private_grad_sum` per micro-batch, `accumulate`, `noisy_average`: noise
once, / L) -> optax. The step compiles once whatever the lot size. Prints
the accountant's ε for the Poisson sampling that ran and the test accuracy.

    python examples/dp_classifier.py [--steps 300] [--epsilon 3]
"""

import argparse

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from dpnmt import core

NUM_CLASSES = 4


def make_bars(num: int, seed: int) -> dict[str, np.ndarray]:
    """`num` noisy 8x8 bar images `x` [num, 64] (float32) and labels `y` [num] (int32)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, NUM_CLASSES, num)
    offsets = rng.integers(-2, 3, num)
    images = rng.normal(0.0, 0.6, (num, 8, 8))
    rows, cols = np.indices((8, 8))
    for i, (label, offset) in enumerate(zip(labels, offsets, strict=True)):
        line = [
            rows == 4 + offset,
            cols == 4 + offset,
            rows - cols == offset,
            rows + cols == 7 + offset,
        ][label]
        images[i][line] += 1.5
    return {"x": images.reshape(num, 64).astype(np.float32), "y": labels.astype(np.int32)}


class MLP(nn.Module):
    """Two Dense layers: ghost clipping handles every parameter."""

    @nn.compact
    def __call__(self, x):
        """Logits `[..., NUM_CLASSES]` of images `[..., 64]`."""
        return nn.Dense(NUM_CLASSES)(nn.relu(nn.Dense(32)(x)))


def main() -> None:
    """Trains with DP-SGD and prints ε and test accuracy."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--epsilon", type=float, default=3.0)
    parser.add_argument("--num_train", type=int, default=4000)
    parser.add_argument("--lot_size", type=int, default=200)
    parser.add_argument("--microbatch_size", type=int, default=64)
    args = parser.parse_args()

    train, test = make_bars(args.num_train, seed=0), make_bars(1000, seed=1)
    n, lot_size, delta, l2_clip = args.num_train, args.lot_size, 1e-5, 1.0
    q = lot_size / n
    sigma = core.calibrate_noise_multiplier(args.epsilon, q, args.steps, delta)
    max_microbatches = core.lot_capacity(n, q, args.microbatch_size, num_steps=args.steps)

    model = MLP()
    params = model.init(jax.random.key(0), jnp.zeros((1, 64)))["params"]
    optimizer = optax.adam(3e-3)
    opt_state = optimizer.init(params)

    def loss_fn(params, example):  # ONE example
        logits = model.apply({"params": params}, example["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, example["y"])

    examples = jax.tree.map(jnp.asarray, train)

    @jax.jit
    def step(params, opt_state, sample_key, noise_key):
        lot = core.poisson_lot(
            sample_key,
            n,
            q,
            microbatch_size=args.microbatch_size,
            max_microbatches=max_microbatches,
        )
        grad = core.private_lot_gradient(
            loss_fn,
            params,
            examples,
            lot,
            noise_key,
            l2_clip=l2_clip,
            noise_multiplier=sigma,
            expected_lot_size=lot_size,
        )
        updates, opt_state = optimizer.update(grad, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    # Release runs: seeds >= 128 bits from the OS, never printed or saved.
    sample_base = core.key_from_seed(core.fresh_seed())
    noise_base = core.key_from_seed(core.fresh_seed())
    for t in range(args.steps):
        params, opt_state = step(
            params,
            opt_state,
            jax.random.fold_in(sample_base, t),
            core.noise_key_for_step(noise_base, t),
        )

    logits = model.apply({"params": params}, jnp.asarray(test["x"]))
    accuracy = float(jnp.mean(jnp.argmax(logits, -1) == test["y"]))
    epsilon = core.compute_epsilon(sigma, q, args.steps, delta)
    print(f"σ={sigma:.3f} ε={epsilon:.3f} δ={delta:g} steps={args.steps} accuracy={accuracy:.3f}")


if __name__ == "__main__":
    main()
