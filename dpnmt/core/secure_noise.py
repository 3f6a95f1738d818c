"""Gaussian-mechanism noise that is safe from floating-point attacks: a discrete Gaussian on a grid.

A float32 Gaussian sample takes at most 2**23 values per coordinate (23 random
mantissa bits through erfinv), and `float32(s + z)` can only land on the floats
reachable from `s`: an observer who sees a raw noisy sum can test which input
produced it far beyond the claimed ε (Mironov 2012; Jin et al. 2022). Here the
noisy value is an integer computed exactly: `grid · (round(s / grid) + N)`, with
N exactly discrete Gaussian (Canonne, Kamath, Steinke 2020, "The Discrete
Gaussian for Differential Privacy", Algorithms 1-3) drawn from uniform 32-bit
words by integer comparisons only. Every float operation comes after the noise
and reads only the noised integer: post-processing.

Formal guarantee. Let `s` (d coordinates, the whole pytree) have L2 sensitivity
C and let σ = stddev / C. The grid γ is the largest power of two with
γ√d <= `GRID_INFLATION` · C. `k = clip(round(s / γ), ±2**30)` then has L2
sensitivity Δ <= C/γ + √d (rounding moves a coordinate by <= 1/2, clipping is
1-Lipschitz, and s / γ is exact for a power of two). With N of independent
coordinates N_Z(0, S²), S = ceil(σΔ) an integer, the release `k + N` is
½(Δ/S)² <= 1/(2σ²)-zCDP (CKS 2020, its result for the multivariate
discrete Gaussian with L2 sensitivity Δ): the concentrated DP of the continuous
Gaussian mechanism at noise multiplier σ. The sampler's N differs from N_Z(0,
S²) by less than 2**-200 in total variation per coordinate (it conditions on
|N_i| < 17 S and restarts a draw whose Algorithm 1 counter passes 64), which
adds at most about 2d·2**-200 to δ of a release. The cost is noise of
standard deviation γS <= σ(C + γ√d)(1 + 1/(σΔ)): at most `GRID_INFLATION`
(0.4 %) more than σC, plus one grid step.

Assumed, not proven here: (1) the random words (Threefry-2x32 under the secret
key, as for every other draw of the run) are uniform; (2) the float sum `s`
itself has sensitivity C: its own rounding (Casacuberta et al. 2022) is not
bounded; (3) the accountant (`core.accounting`, dp_accounting's Poisson-sampled
Gaussian, PLD or RDP) is applied to this discrete mechanism as if it were the
continuous Gaussian at σ. Without subsampling the discrete Gaussian has the
same Rényi divergence bound as the continuous one (the zCDP above); that
the Poisson-subsampled curves are bounded by the continuous ones as well is not
proven here (Kairouz, Liu, Steinke 2021 account their distributed discrete
Gaussian through zCDP/RDP for this reason). With S >= 256·σ√d the lattice is
fine against the noise, but that is an argument, not a proof.

Range: |round(s_i / γ)| saturates at 2**30 (|s_i| <= 2**30 γ, e.g. 512 C at
60M coordinates: `SecureGrid.signal_limit`); S may be at most `MAX_SCALE`
(σ√d up to 1.2e5 always fits, up to 2.5e5 for some d; σ 30 fits at 60M
coordinates): larger is refused with a ValueError.
"""

from __future__ import annotations

import dataclasses
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from dpnmt.core import threefry

# γ√d <= GRID_INFLATION · C: the rounding adds at most this fraction to the noise.
GRID_INFLATION = 2.0**-8
# Signal clip, in grid units: |round(s_i / γ)| <= 2**30.
SIGNAL_LIMIT = 2**30
# The discrete Laplace proposal keeps X = U + S·V with V <= _MAX_V, so |N| < 17 S.
_MAX_V = 16
# |k| + |N| < 2**31: the integer sum never overflows int32.
MAX_SCALE = (2**31 - 1 - SIGNAL_LIMIT) // (_MAX_V + 1)
# Lanes run in parallel by the sampler (each a rejection-sampling state machine).
# Measured on 2 CPU cores: 2**13 lanes ran faster than 2**16 or 2**18, and two to
# four transitions per loop iteration were no faster than one.
POOL_SIZE = 2**13


@dataclasses.dataclass(frozen=True)
class SecureGrid:
    """The grid and integer noise scale of one secure release.

    Attributes:
      grid: γ, a power of two, in the units of the noised values.
      integer_scale: S, the discrete Gaussian's scale in grid units (an integer).
      sensitivity: Δ = C/γ + √d, the L2 sensitivity in grid units after rounding.
      noise_multiplier: σ = stddev / C, the multiplier the accountant uses.
    """

    grid: float
    integer_scale: int
    sensitivity: float
    noise_multiplier: float

    @property
    def stddev(self) -> float:
        """γ·S: the noise standard deviation in the units of the values (>= σC)."""
        return self.grid * self.integer_scale

    @property
    def signal_limit(self) -> float:
        """|s_i| beyond this saturates (2**30 grid steps)."""
        return self.grid * SIGNAL_LIMIT


def secure_grid(num_coordinates: int, stddev: float, l2_sensitivity: float) -> SecureGrid:
    """The grid γ and integer scale S for `num_coordinates` values, noise σC, sensitivity C.

    Args:
      num_coordinates: d, all coordinates of the release (every leaf together).
      stddev: σC, the Gaussian mechanism's standard deviation (> 0).
      l2_sensitivity: C, the L2 sensitivity of the released sum (> 0).

    Returns:
      A `SecureGrid`.

    Raises:
      ValueError: S would exceed `MAX_SCALE` (too many coordinates for σ).
    """
    sigma = stddev / l2_sensitivity
    root_d = math.sqrt(num_coordinates)
    grid = 2.0 ** math.floor(math.log2(GRID_INFLATION * l2_sensitivity / root_d))
    sensitivity = l2_sensitivity / grid + root_d
    # The relative margin covers float64 rounding of the product: S >= σΔ exactly.
    scale = math.ceil(sigma * sensitivity * (1 + 1e-12))
    if scale > MAX_SCALE:
        raise ValueError(
            f"noise_mode='secure' cannot noise {num_coordinates} coordinates at noise "
            f"multiplier {sigma:g}: its integer noise scale {scale} exceeds {MAX_SCALE} "
            f"(int32 arithmetic: σ·√d up to {MAX_SCALE / (2 / GRID_INFLATION + 1):.3g} always "
            f"fits, up to {MAX_SCALE / (1 / GRID_INFLATION + 1):.3g} for some d). "
            "Use noise_mode='float' or fewer trainable parameters."
        )
    return SecureGrid(grid, scale, sensitivity, sigma)


def add_discrete_gaussian_noise(
    tree: chex.ArrayTree, stddev: float, l2_sensitivity: float, key: chex.PRNGKey
) -> chex.ArrayTree:
    """`tree` noised by the discrete Gaussian mechanism on a grid (module docstring).

    Args:
      tree: pytree of floating arrays, the sum to release (sensitivity C).
      stddev: σC >= 0 (0: `tree` is returned unchanged, as in float mode).
      l2_sensitivity: C > 0, the L2 sensitivity of the whole tree.
      key: PRNG key; never reuse it for another release.

    Returns:
      A pytree with the structure, shapes and dtypes of `tree`: γ times integers.
      NaN coordinates stay NaN.
    """
    if stddev == 0:
        return tree
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    leaves = [jnp.asarray(leaf) for leaf in leaves]
    for leaf in leaves:
        if not jnp.issubdtype(leaf.dtype, jnp.floating):
            raise TypeError(f"add_gaussian_noise needs floating leaves, got {leaf.dtype}.")
    sizes = [leaf.size for leaf in leaves]
    plan = secure_grid(sum(sizes), stddev, l2_sensitivity)
    flat = jnp.concatenate([leaf.astype(jnp.float32).ravel() for leaf in leaves])
    scaled = jnp.round(flat * np.float32(1 / plan.grid))  # Exact: γ is a power of two.
    signal = jnp.clip(scaled, -SIGNAL_LIMIT, SIGNAL_LIMIT)
    signal = jnp.where(jnp.isnan(signal), 0.0, signal).astype(jnp.int32)
    noised = signal + discrete_gaussian(key, plan.integer_scale, flat.size)
    released = noised.astype(jnp.float32) * np.float32(plan.grid)  # Post-processing.
    released = jnp.where(jnp.isnan(flat), flat, released)
    out, start = [], 0
    for leaf, size in zip(leaves, sizes, strict=True):
        out.append(released[start : start + size].reshape(leaf.shape).astype(leaf.dtype))
        start += size
    return jax.tree_util.tree_unflatten(treedef, out)


# Sampler phases (one transition per lane per iteration).
_DRAW_U, _EXP_U, _EXP_ONE, _EXP_HALF, _EXP_R, _EXP_R2_PAIR, _EXP_R2_K, _IDLE = range(8)
# Algorithm 1's counter K restarts the draw when it would pass this (probability
# below 1/63! per Bernoulli: part of the 2**-200 bound).
_MAX_K = 64


def _reciprocals(denominator: int) -> tuple[int, int]:
    """(M, limit): M = floor(2**32 / b) and limit = b·M mod 2**32 (0 when b <= 1).

    A uniform 32-bit word w below b·M (all words when the limit is 0) is uniform
    on [0, b·M), so `w < a·M` is Bernoulli(a/b) exactly for integers 0 <= a < b.
    """
    if denominator <= 1:
        return 0, 0
    multiple = 2**32 // denominator
    return multiple, (denominator * multiple) % 2**32


_RECIPROCALS = [_reciprocals(b) for b in range(2 * _MAX_K + 1)]
_M_TABLE = np.array([m for m, _ in _RECIPROCALS], np.uint32)
_LIMIT_TABLE = np.array([limit for _, limit in _RECIPROCALS], np.uint32)


def _bernoulli(word, numerator, denominator, multiple, limit):
    """(Bernoulli(numerator / denominator) from `word`, whether `word` is usable).

    An unusable word (probability below denominator / 2**32) must be redrawn.
    """
    usable = (limit == 0) | (word < limit)
    success = (numerator >= denominator) | (word < numerator.astype(jnp.uint32) * multiple)
    return success, usable


def _words(key: chex.PRNGKey, lane: chex.Array) -> tuple[chex.Array, chex.Array]:
    """Two independent uniform uint32 words per lane: one Threefry block per lane."""
    if str(jax.random.key_impl(key)) == "threefry2x32":
        return threefry.threefry2x32(jax.random.key_data(key), jnp.zeros_like(lane), lane)
    bits = jax.random.bits(key, (2, lane.size), jnp.uint32)
    return bits[0], bits[1]


def discrete_gaussian(key: chex.PRNGKey, scale: int, size: int) -> chex.Array:
    """`size` independent draws of N_Z(0, scale²) given |N| < 17·scale, exactly.

    Canonne, Kamath, Steinke (2020): Algorithm 3 with the discrete Laplace
    proposal of scale t = S (any t is correct; t = S makes σ²/t the integer S),
    its acceptance exp(-(|Y| - S)²/(2S²)) split as exp(-1/2)^(q²)·exp(-r/S)^q·
    exp(-r²/(2S²)) for | |Y| - S | = qS + r, and every Bernoulli(exp(-γ)) by
    Algorithm 1, whose Bernoulli(γ/K) is a product of Bernoullis of ratios of
    integers below 2**31, each decided by comparing a uniform 32-bit word with
    an integer (`_reciprocals`). A pool of `POOL_SIZE` lanes runs the rejection
    loops; a finished lane writes its draw and takes the next coordinate.

    Args:
      key: PRNG key.
      scale: S, a Python int in [1, `MAX_SCALE`].
      size: number of draws (static).

    Returns:
      int32 `[size]`.
    """
    if not 1 <= scale <= MAX_SCALE:
        raise ValueError(f"scale must be an integer in [1, {MAX_SCALE}], got {scale}.")
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)
    pool = min(POOL_SIZE, size)
    s_multiple, s_limit = (np.uint32(x) for x in _reciprocals(scale))
    big_s = np.int32(scale)
    m_table, limit_table = jnp.asarray(_M_TABLE), jnp.asarray(_LIMIT_TABLE)
    zeros = jnp.zeros((pool,), jnp.int32)
    fresh = dict(
        phase=zeros + _DRAW_U, u=zeros, v=zeros, k=zeros + 1, r=zeros, c1=zeros, c2=zeros, neg=zeros
    )

    def advance(lanes, w0, w1):
        """One transition of every lane that is neither finished (-2) nor idle."""
        phase, u, v, k, r, c1, c2, neg = (lanes[name] for name in fresh)
        is_ = {p: phase == p for p in range(_IDLE + 1)}
        one = jnp.ones_like(k)

        # _DRAW_U: U uniform on [0, S) from w0 (w0 < S·M), then Algorithm 1's
        # first step for exp(-U/S) from w1.
        if scale == 1:
            drawn, drawn_ok = zeros, jnp.ones_like(is_[_DRAW_U])
        else:
            drawn = (w0 // s_multiple).astype(jnp.int32)
            drawn_ok = (s_limit == 0) | (w0 < s_limit)
        u = jnp.where(is_[_DRAW_U], drawn, u)

        # Word 0: Bernoulli(a0 / S) (or certain); word 1: Bernoulli(a1 / b1).
        uses_s0 = is_[_DRAW_U] | is_[_EXP_U] | is_[_EXP_R] | is_[_EXP_R2_PAIR]
        a0 = jnp.where(is_[_EXP_R] | is_[_EXP_R2_PAIR], r, u)
        bit0, ok0 = _bernoulli(w0, a0, big_s, s_multiple, s_limit)
        bit0, ok0 = bit0 | ~uses_s0 | is_[_DRAW_U], ok0 | ~uses_s0
        ok0 = jnp.where(is_[_DRAW_U], drawn_ok, ok0)
        b1 = jnp.where(is_[_EXP_HALF] | is_[_EXP_R2_K], 2 * k, k)
        b1 = jnp.where(is_[_EXP_R2_PAIR], big_s, jnp.where(is_[_DRAW_U], big_s, b1))
        a1 = jnp.where(is_[_EXP_R2_PAIR], r, jnp.where(is_[_DRAW_U], u, one))
        m1 = jnp.where(
            is_[_EXP_R2_PAIR] | is_[_DRAW_U], s_multiple, m_table[jnp.minimum(b1, 2 * _MAX_K)]
        )
        l1 = jnp.where(
            is_[_EXP_R2_PAIR] | is_[_DRAW_U], s_limit, limit_table[jnp.minimum(b1, 2 * _MAX_K)]
        )
        bit1, ok1 = _bernoulli(w1, a1, b1, m1, l1)
        usable = ok0 & ok1
        success = bit0 & bit1  # Algorithm 1's A: K grows; otherwise it ends at K.
        odd = (k % 2) == 1
        passed, failed = ~success & odd, ~success & ~odd

        to = jnp.full_like(phase, -1)  # -1: stay in the phase.
        new_k = jnp.where(success, k + 1, 1)
        new_v = v
        # After exp(-U/S) passed: V = 0, and exp(-1)'s Algorithm 1 starts at K = 2
        # (its K = 1 step always succeeds).
        to_v = (is_[_DRAW_U] | is_[_EXP_U]) & passed
        to = jnp.where(to_v, _EXP_ONE, jnp.where(is_[_EXP_U] & failed, _DRAW_U, to))
        to = jnp.where(is_[_DRAW_U] & success, _EXP_U, to)
        new_v = jnp.where(to_v, 0, new_v)
        new_k = jnp.where(to_v, 2, new_k)
        # _EXP_ONE: V counts Bernoulli(exp(-1)) successes; past _MAX_V the proposal is rejected.
        more = is_[_EXP_ONE] & passed
        new_v = jnp.where(more, v + 1, new_v)
        new_k = jnp.where(more, 2, new_k)
        to = jnp.where(more & (v + 1 > _MAX_V), _DRAW_U, to)
        # V is complete: the sign from w0; -0 is rejected; | |Y| - S | = qS + r.
        signed = is_[_EXP_ONE] & failed
        sign = (w0 & np.uint32(1)).astype(jnp.int32)
        q_new = jnp.where(v >= 1, v - 1, jnp.where(u == 0, 1, 0))
        r_new = jnp.where(v >= 1, u, jnp.where(u == 0, 0, big_s - u))
        neg = jnp.where(signed, sign, neg)
        r = jnp.where(signed, r_new, r)
        c1 = jnp.where(signed, q_new * q_new, c1)
        c2 = jnp.where(signed, jnp.where(r_new > 0, q_new, 0), c2)
        # The acceptance tests in turn: exp(-1/2) c1 times, exp(-r/S) c2 times, exp(-r²/(2S²)).
        last_test = jnp.where(r > 0, _EXP_R2_PAIR, -2)  # -2: accepted.
        after_half = jnp.where(c2 > 0, _EXP_R, last_test)
        first_test = jnp.where(c1 > 0, _EXP_HALF, after_half)
        to = jnp.where(
            signed, jnp.where((sign == 1) & (u == 0) & (v == 0), _DRAW_U, first_test), to
        )
        half, at_r = is_[_EXP_HALF], is_[_EXP_R]
        to = jnp.where((half | at_r) & failed, _DRAW_U, to)
        to = jnp.where(half & passed & (c1 == 1), after_half, to)
        to = jnp.where(at_r & passed & (c2 == 1), last_test, to)
        c1 = jnp.where(half & passed, c1 - 1, c1)
        c2 = jnp.where(at_r & passed, c2 - 1, c2)
        # exp(-r²/(2S²)): Algorithm 1's step Bernoulli(r/S)²·Bernoulli(1/(2K)), in two iterations.
        pair, at_k = is_[_EXP_R2_PAIR], is_[_EXP_R2_K]
        to = jnp.where(pair & success, _EXP_R2_K, to)
        new_k = jnp.where(pair & success, k, new_k)
        to = jnp.where(at_k & success, _EXP_R2_PAIR, to)
        to = jnp.where((pair | at_k) & passed, -2, to)
        to = jnp.where((pair | at_k) & failed, _DRAW_U, to)
        to = jnp.where(new_k > _MAX_K, _DRAW_U, to)
        new_k = jnp.where(to == _DRAW_U, 1, new_k)
        new = dict(
            phase=jnp.where(to == -1, phase, to), u=u, v=new_v, k=new_k, r=r, c1=c1, c2=c2, neg=neg
        )
        # An unusable word changes nothing: the lane draws again next iteration.
        moves = usable & ~is_[_IDLE] & (phase != -2)
        return {name: jnp.where(moves, new[name], lanes[name]) for name in fresh}

    def step(carry):
        it, next_coord, coord, new, out = carry
        new = advance(new, *_words(jax.random.fold_in(key, it), lane_words))
        # Finished lanes (phase -2) write their draw and take the next coordinate.
        done = new["phase"] == -2
        magnitude = new["u"] + big_s * new["v"]
        out = out.at[jnp.where(done, coord, size)].set(
            jnp.where(new["neg"] == 1, -magnitude, magnitude), mode="drop"
        )
        rank = jnp.cumsum(done.astype(jnp.int32)) - 1
        coord = jnp.where(done, jnp.minimum(next_coord + rank, size), coord)
        new = {name: jnp.where(done, fresh[name], new[name]) for name in fresh}
        new["phase"] = jnp.where(coord >= size, _IDLE, new["phase"])
        next_coord = next_coord + jnp.sum(done.astype(jnp.int32))
        return it + 1, next_coord, coord, new, out

    def running(carry):
        return jnp.any(carry[3]["phase"] != _IDLE)

    lane = jnp.arange(pool, dtype=jnp.int32)
    lane_words = lane.astype(jnp.uint32)
    carry = (jnp.uint32(0), jnp.int32(pool), lane, fresh, jnp.zeros((size,), jnp.int32))
    return lax.while_loop(running, step, carry)[4]
