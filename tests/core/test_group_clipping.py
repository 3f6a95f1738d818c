"""Group clipping: one clipped contribution per group, sensitivity C per whole group."""

import functools
from unittest import mock

import chex
import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

from dpnmt.core import ghost as core_ghost
from dpnmt.core import group_clipping
from tests.core import test_ghost

GROUPS, CAP = 3, 3


def _setup(seed=0, groups=GROUPS, k=CAP, scale=1.0):
    params, flat, loss_fn = test_ghost._setup(test_ghost._TiedLM, seed=seed, rows=groups * k)
    flat["features"] = flat["features"] * scale
    batch = jax.tree_util.tree_map(lambda v: v.reshape((groups, k) + v.shape[1:]), flat)
    return params, batch, loss_fn


@functools.cache
def _jitted(clipping, loss_fn):
    return jax.jit(
        functools.partial(group_clipping.group_clipped_sum, loss_fn, clipping=clipping),
        static_argnames="l2_clip",
    )


def _run(clipping, loss_fn, params, batch, row_mask, l2_clip):
    return _jitted(clipping, loss_fn)(params, batch, jnp.asarray(row_mask), l2_clip=float(l2_clip))


def _flat(tree):
    return np.concatenate([np.ravel(np.asarray(v, np.float64)) for v in jax.tree.leaves(tree)])


@functools.cache
def _row_grad(loss_fn):
    return jax.jit(jax.grad(loss_fn))


def _reference(loss_fn, params, batch, row_mask, l2_clip):
    """Σ_g min(1, C/‖g_g‖) g_g with g_g = Σ_j mask_gj ∇ℓ_gj, in float64 from per-row grads."""
    total = 0.0
    for g in range(row_mask.shape[0]):
        group_grad = 0.0
        for j in range(row_mask.shape[1]):
            if row_mask[g, j]:
                row = jax.tree_util.tree_map(lambda v, g=g, j=j: v[g, j], batch)
                group_grad = group_grad + _flat(_row_grad(loss_fn)(params, row))
        if np.ndim(group_grad):
            norm = np.linalg.norm(group_grad)
            total = total + group_grad * min(1.0, l2_clip / norm)
    return total


MASK = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1]])


@pytest.mark.parametrize("clipping", ["vmap", "ghost"])
@pytest.mark.parametrize("l2_clip", [1e-2, 1e3])  # Every group clipped; none clipped.
def test_equals_the_per_group_reference(clipping, l2_clip):
    params, batch, loss_fn = _setup(scale=3.0)
    got, norms, _ = _run(clipping, loss_fn, params, batch, MASK, l2_clip)
    expected = _reference(loss_fn, params, batch, MASK, l2_clip)
    np.testing.assert_allclose(_flat(got), expected, rtol=2e-5, atol=1e-6 * l2_clip)
    assert norms.shape == (GROUPS,)


@pytest.mark.parametrize("forced", [False, True])
def test_ghost_equals_vmap_with_padding(forced):
    """`forced`: the ghost norm (grams over the group's stacked rows) for every handled
    leaf; the small test widths would otherwise materialise most of them."""
    params, batch, loss_fn = _setup(seed=3, scale=5.0)
    mask = np.array([[1, 0, 1], [0, 0, 0], [1, 1, 1]])
    vmap = _run("vmap", loss_fn, params, batch, mask, 0.3)
    if forced:

        def prefer(uses, shape):
            return all(use.kind != "direct" for use in uses)

        with mock.patch.object(core_ghost, "_prefer_ghost", prefer):
            run = jax.jit(
                lambda p, b, m: group_clipping.group_clipped_sum(
                    loss_fn, p, b, m, l2_clip=0.3, clipping="ghost"
                )
            )
            ghost = run(params, batch, jnp.asarray(mask))
    else:
        ghost = _run("ghost", loss_fn, params, batch, mask, 0.3)
    chex.assert_trees_all_close(ghost[0], vmap[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ghost[1], vmap[1], rtol=1e-5)
    np.testing.assert_allclose(ghost[2], vmap[2], rtol=1e-6)


@pytest.mark.parametrize("clipping", ["vmap", "ghost"])
def test_padding_rows_and_padded_groups_add_exactly_zero(clipping):
    params, batch, loss_fn = _setup(seed=1, scale=2.0)
    mask = np.array([[1, 0, 0], [0, 0, 0], [1, 1, 0]])
    base = _run(clipping, loss_fn, params, batch, mask, 0.5)
    # Other (finite) contents in every masked row: bit-identical sum and loss.
    rng = np.random.default_rng(7)
    masked = jnp.asarray(mask == 0)
    other = dict(batch)
    other["features"] = jnp.where(
        masked[..., None, None], rng.normal(size=batch["features"].shape) * 1e3, batch["features"]
    ).astype(jnp.float32)
    other["ids"] = jnp.where(masked[..., None], (batch["ids"] + 3) % test_ghost.VOCAB, batch["ids"])
    changed = _run(clipping, loss_fn, params, other, mask, 0.5)
    for a, b in zip(jax.tree.leaves(base[0]), jax.tree.leaves(changed[0]), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(base[2], changed[2])
    # The padded group removed altogether: the same sum (up to summation order).
    without = jax.tree_util.tree_map(lambda v: jnp.delete(v, 1, axis=0), batch)
    less = _run(clipping, loss_fn, params, without, np.delete(mask, 1, axis=0), 0.5)
    np.testing.assert_allclose(_flat(less[0]), _flat(base[0]), rtol=1e-6, atol=1e-7)
    # All groups padded: exactly zero.
    empty = _run(clipping, loss_fn, params, batch, np.zeros_like(mask), 0.5)
    assert not np.any(_flat(empty[0]))
    assert float(empty[2]) == 0.0


@pytest.mark.slow
@hypothesis.settings(max_examples=12, deadline=None)
@hypothesis.given(
    seed=st.integers(0, 2**16),
    mask_bits=st.lists(st.integers(0, 2**CAP - 1), min_size=GROUPS, max_size=GROUPS),
    removed=st.integers(0, GROUPS - 1),
    log_scale=st.floats(-2.0, 3.0),
    l2_clip=st.sampled_from([1e-3, 1.0, 1e3]),
    clipping=st.sampled_from(["vmap", "ghost"]),
)
def test_removing_one_whole_group_moves_the_sum_by_at_most_c(
    seed, mask_bits, removed, log_scale, l2_clip, clipping
):
    """Any group sizes 0..k (row masks), any group removed: ‖Δ sum‖ <= C."""
    _check_removal(seed, mask_bits, removed, log_scale, l2_clip, clipping)


@pytest.mark.parametrize("clipping", ["vmap", "ghost"])
def test_removing_the_largest_group_moves_the_sum_by_at_most_c(clipping):
    """The fast case of the property above (CI without slow tests still checks it)."""
    _check_removal(5, [0b111, 0b001, 0b011], 0, 2.0, 1e-3, clipping)


def _check_removal(seed, mask_bits, removed, log_scale, l2_clip, clipping):
    params, batch, loss_fn = _setup(seed=seed, scale=10.0**log_scale)
    mask = np.array([[(bits >> j) & 1 for j in range(CAP)] for bits in mask_bits])
    full = _run(clipping, loss_fn, params, batch, mask, l2_clip)[0]
    neighbour = jax.tree_util.tree_map(lambda v: jnp.delete(v, removed, axis=0), batch)
    less = _run(clipping, loss_fn, params, neighbour, np.delete(mask, removed, axis=0), l2_clip)[0]
    # Float32 rounding of a sum of G terms each of norm <= C.
    bound = l2_clip * (1 + 1e-5) + 1e-6 * l2_clip * GROUPS
    assert np.linalg.norm(_flat(full) - _flat(less)) <= bound


def test_a_group_of_k_identical_rows_is_clipped_once_not_k_times():
    """Per-example clipping would let k copies add k·C; the group adds C."""
    params, batch, loss_fn = _setup(seed=2, scale=100.0)
    same = jax.tree_util.tree_map(lambda v: jnp.broadcast_to(v[:1, :1], v[:1].shape), batch)
    got = _run("vmap", loss_fn, params, same, np.ones((1, CAP)), 1e-2)[0]
    assert np.linalg.norm(_flat(got)) == pytest.approx(1e-2, rel=1e-5)


@pytest.mark.parametrize(
    "row_mask, match",
    [(np.ones((GROUPS,)), r"\[G, k\]"), (np.ones((GROUPS, CAP + 1)), "every leaf must be")],
)
def test_bad_shapes_name_the_fix(row_mask, match):
    params, batch, loss_fn = _setup()
    with pytest.raises(ValueError, match=match):
        group_clipping.group_clipped_sum(
            loss_fn, params, batch, row_mask, l2_clip=1.0, clipping="vmap"
        )


@pytest.mark.parametrize("clipping", ["vmap", "ghost"])
def test_a_row_loss_that_is_not_a_scalar_is_refused(clipping):
    """A [1]-shaped row loss would broadcast against the row mask and count masked rows."""
    params, batch, loss_fn = _setup()

    def shaped(params, row):
        return jnp.reshape(loss_fn(params, row), (1,))

    with pytest.raises(ValueError, match="scalar loss for ONE example"):
        group_clipping.group_clipped_sum(
            shaped, params, batch, np.ones((GROUPS, CAP)), l2_clip=1.0, clipping=clipping
        )


def test_the_lot_s_loss_sum_counts_only_the_kept_groups_rows():
    """A group dropped as non-finite adds no loss, and its rows do not scale the kept mean."""
    from dpnmt.core import dp_step

    def loss_fn(w, row):  # ONE row's loss.
        return jnp.sum((row["x"] @ w - row["y"]) ** 2)

    w = jnp.ones((3,))
    x = np.ones((2, 2, 3), np.float32)
    x[1, 0, 0] = np.nan  # Group 1 is non-finite: dropped.
    batch = {"x": jnp.asarray(x), "y": jnp.zeros((2, 2))}
    row_mask = jnp.array([[1, 1], [1, 1]])
    _, loss_sum = dp_step.add_group_microbatch(
        dp_step.init(w), loss_fn, w, batch, row_mask, l2_clip=1.0, clipping="vmap"
    )
    assert float(loss_sum) == pytest.approx(2 * 9.0)  # Group 0's two rows, 9 each.


def test_ghost_falls_back_to_vmap_when_the_loss_traces_differently():
    # From its second trace on (the ghost analysis is the first, its checked pass the
    # second) the loss reads a Dense kernel directly: ghost refuses it and the group
    # sum falls back to per-group gradients, equal to the vmap method's.
    params, batch, loss_fn = _setup(scale=3.0)
    traces = {}  # One entry per trace: the parameters' tracer of that trace.

    def drifting(p, row):
        kernel = next(v for v in jax.tree.leaves(p) if v.ndim == 2 and v.shape[0] != v.shape[1])
        traces.setdefault(id(kernel), len(traces))
        loss = loss_fn(p, row)
        return loss + 0.1 * jnp.sum(kernel) if traces[id(kernel)] >= 1 else loss

    mask = jnp.asarray(MASK)
    with pytest.warns(core_ghost.GhostClippingWarning, match="falling back to per-group"):
        ghost = group_clipping.group_clipped_sum(
            drifting, params, batch, mask, l2_clip=0.5, clipping="ghost"
        )
    vmap = group_clipping.group_clipped_sum(
        drifting, params, batch, mask, l2_clip=0.5, clipping="vmap"
    )
    np.testing.assert_allclose(_flat(ghost.grad_sum), _flat(vmap.grad_sum), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(ghost.norms, vmap.norms, rtol=1e-5)
