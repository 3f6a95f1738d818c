"""Gaussian noise for pytrees, and the key schedule that keeps noise fresh."""

import numbers
import secrets

import chex
import jax
import jax.numpy as jnp
import numpy as np

from dpnmt.core import deprecation, secure_noise, threefry, validation

FLOAT, SECURE = "float", "secure"
# "float": jax.random.normal's float32 draws (the default); "secure": a discrete
# Gaussian on a grid, safe from floating-point attacks (`core.secure_noise`).
NOISE_MODES = (FLOAT, SECURE)


@deprecation.deprecated_arguments(renamed={"key": "noise_key", "mode": "noise_mode"})
def add_gaussian_noise(
    tree: chex.ArrayTree,
    stddev: float,
    noise_key: chex.PRNGKey,
    *,
    noise_mode: str = FLOAT,
    l2_sensitivity: float | None = None,
) -> chex.ArrayTree:
    """Adds independent N(0, stddev²) noise to every element of `tree`.

    One draw per sampling dtype, not per leaf: the d coordinates of the leaves
    sampled in float32 (float32, bfloat16, float16 leaves; float64 ones are
    sampled in float64) get `jax.random.normal(k, (d,))`, in flattening order,
    sliced and reshaped back to the leaves, with k = `jax.random.split(noise_key, g)[i]`
    for the i-th of the g dtypes present (g = 1 unless float64 leaves are mixed
    in). Threefry hashes each coordinate's index, so every coordinate, in every
    leaf, gets its own bits: the noise is i.i.d. N(0, stddev²) across the
    whole tree. The draws are `jax.random.normal`'s, bit for bit (float32
    Threefry keys compute them with `core.threefry.normal_vector`: XLA's CPU
    backend runs it several times faster, and compiles its hash once, where one
    draw per leaf compiled one hash per leaf). Noise is added in float32 (or
    float64) and the sum cast back: the dtype of every leaf is preserved.

    Floating-point exposure (mode "float"): a float32 sample takes at most 2**23
    values, and `float32(x + z)` lands only on floats reachable from `x`, so the
    returned tree itself can reveal `x` far beyond the Gaussian mechanism's ε
    (Mironov 2012; `tests/core/test_secure_noise.py` replays the attack). Mode
    "secure" releases a discrete Gaussian on a grid instead: integers computed
    exactly, noise at most 0.4 % larger, and a stated guarantee
    (`core.secure_noise`); it needs `l2_sensitivity` and costs far more time.

    Args:
      tree: pytree of floating arrays.
      stddev: standard deviation (same units as the leaves), >= 0.
      noise_key: PRNG key; never reuse it for another release.
      noise_mode: "float" (default, `jax.random.normal`'s draws) or "secure".
      l2_sensitivity: mode "secure" only: C, the L2 sensitivity of the whole
        tree (stddev / C is the noise multiplier the accountant uses).

    Returns:
      A pytree with the structure, shapes and dtypes of `tree`.
    """
    validation.check_positive("stddev", stddev, allow_zero=True)
    check_noise_mode(noise_mode)
    if noise_mode == SECURE:
        if l2_sensitivity is None:
            raise ValueError(
                "noise_mode='secure' needs l2_sensitivity (C, the L2 sensitivity of the tree): "
                "the grid and the noise scale are set from it."
            )
        l2_sensitivity = validation.check_positive("l2_sensitivity", l2_sensitivity)
        return secure_noise.add_discrete_gaussian_noise(tree, stddev, l2_sensitivity, noise_key)
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    leaves = [jnp.asarray(leaf) for leaf in leaves]
    groups = {}  # sampling dtype -> indices of its leaves, in flattening order
    for index, leaf in enumerate(leaves):
        if not jnp.issubdtype(leaf.dtype, jnp.floating):
            raise TypeError(f"add_gaussian_noise needs floating leaves, got {leaf.dtype}.")
        groups.setdefault(jnp.promote_types(leaf.dtype, jnp.float32), []).append(index)
    noised = list(leaves)
    for (dtype, indices), group_key in zip(
        groups.items(), jax.random.split(noise_key, len(groups)), strict=True
    ):
        draws = _standard_normal(group_key, sum(leaves[i].size for i in indices), dtype)
        start = 0
        for i in indices:
            leaf = leaves[i]
            noise = draws[start : start + leaf.size].reshape(leaf.shape) * stddev
            noised[i] = (leaf.astype(dtype) + noise).astype(leaf.dtype)
            start += leaf.size
    return jax.tree_util.tree_unflatten(treedef, noised)


def _standard_normal(key: chex.PRNGKey, size: int, dtype) -> chex.Array:
    """`jax.random.normal(key, (size,), dtype)`; float32 Threefry draws as one hash on CPU."""
    if dtype == jnp.float32:
        sample = threefry.normal_vector(key, size)
        if sample is not None:
            return sample
    return jax.random.normal(key, (size,), dtype)


def check_noise_mode(mode: str) -> str:
    """Returns `mode` if it is one of `NOISE_MODES`; raises ValueError naming them otherwise."""
    if mode not in NOISE_MODES:
        raise ValueError(f"noise mode {mode!r} is unknown; use one of {list(NOISE_MODES)}.")
    return mode


@deprecation.deprecated_arguments(renamed={"base_key": "noise_base"})
def noise_key_for_step(noise_base: chex.PRNGKey, step) -> chex.PRNGKey:
    """The noise key of training step `step`: `fold_in(noise_base, step)`.

    Deriving each step's key from the step number (rather than carrying a
    split chain) means a resumed run continues the exact key sequence of an
    uninterrupted one, and no two steps share a key.

    Args:
      noise_base: the run's noise key (from `fresh_seed()` for a release run).
      step: int or integer JAX/NumPy scalar (traced or not), the 0-based
        optimizer step, below 2**32.

    Returns:
      A PRNG key.

    Raises:
      TypeError: `step` is a float or a bool, even 2.0: `fold_in` truncates it
        (1.5 folds in as 1), so a float step counter would reuse step 1's noise
        key, and two releases with one key leak their difference exactly.
      ValueError: `step` is not a scalar, or a concrete step outside [0, 2**32)
        (`fold_in` takes a 32-bit word).
    """
    return jax.random.fold_in(noise_base, validation.check_step("step", step))


def key_from_seed(seed: int, *, allow_fixed_seed_for_testing: bool = False) -> chex.PRNGKey:
    """A threefry PRNG key that depends on every bit of `seed`, however large.

    `jax.random.key(seed)` keeps only the low 32 bits unless 64-bit mode is on,
    and folding in a fixed number of words would drop the bits above them. The
    whole integer goes through `numpy.random.SeedSequence` (a hash of all its
    bits), whose first two 32-bit words become the key data.

    A threefry key holds 64 bits, so the key is a 64-bit hash of the seed: two
    different seeds share a key with probability about 2**-64 (per pair), and
    an adversary who could test 2**64 keys against a release would find the
    key without the seed. The key, not the seed, is what the noise draws use:
    the noise's secrecy is 64 bits of key, whatever the seed's size. The seed
    is still the secret to protect (with the key): whoever holds either
    regenerates every step's noise and subtracts it, which voids the privacy
    guarantee (ε = ∞).

    Seeds below 2**64 are refused: `fresh_seed` never returns one, so such a
    seed was typed in, counted or truncated, and is not secret.

    Args:
      seed: integer (Python or NumPy) from `fresh_seed()`, any size >= 2**64.
      allow_fixed_seed_for_testing: accept a small seed (tests, and runs whose
        noise need not be secret: they get no privacy).

    Returns:
      A PRNG key (impl threefry2x32). Secret: never log, save or publish it.

    Raises:
      TypeError: `seed` is not an integer (a float or bool, e.g. 1.5 or True).
      ValueError: `seed` is negative, or below 2**64 without the testing flag.
    """
    if isinstance(seed, bool | np.bool_) or not isinstance(seed, numbers.Integral):
        raise TypeError(
            f"seed must be an integer (use core.fresh_seed()), got {type(seed).__name__}: a "
            "float or bool would be rounded, so different values would share one key."
        )
    seed = int(seed)
    if seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}.")
    if seed < FIXED_SEED_BOUND and not allow_fixed_seed_for_testing:
        raise ValueError(
            "seed is below 2**64, so it is fixed or truncated, not a secret 128-bit seed "
            "(core.fresh_seed() never returns one): whoever knows it rebuilds the noise and "
            "the privacy guarantee is void. Use core.fresh_seed() and keep the seed "
            "secret; tests may pass allow_fixed_seed_for_testing=True."
        )
    words = np.random.SeedSequence(seed).generate_state(2, np.uint32)
    return jax.random.wrap_key_data(jnp.asarray(words), impl="threefry2x32")


SEED_BITS = 128
# Seeds below this look fixed: a fresh 128-bit seed is that small with probability 2**-64.
FIXED_SEED_BOUND = 2**64


def fresh_seed() -> int:
    """A 128-bit seed from the operating system's CSPRNG, for release runs.

    Fixed seeds void the guarantee (anyone holding one rebuilds the noise); a
    run whose ε is published draws its seed here and keeps it private. Turn it
    into a key with `key_from_seed`, which reads all its bits. The seed is
    uniform on [2**64, 2**128) (a draw below 2**64, probability 2**-64, is
    redrawn), so `key_from_seed` never mistakes it for a fixed seed.
    """
    while True:
        seed = secrets.randbits(SEED_BITS)
        if seed >= FIXED_SEED_BOUND:
            return seed
