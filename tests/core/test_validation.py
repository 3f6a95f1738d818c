"""Boundary checks: bad privacy parameters and batches get one message naming them."""

import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpnmt import core


def _loss(params, example):
    return jnp.sum((example["x"] @ params["w"] - example["y"]) ** 2)


def _problem(rows=8):
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(3, 2)), jnp.float32)}
    batch = {
        "x": jnp.asarray(rng.normal(size=(rows, 3)), jnp.float32),
        "y": jnp.asarray(rng.normal(size=(rows, 2)), jnp.float32),
    }
    return params, batch


@pytest.mark.parametrize("clipping", ["ghost", "vmap"])
def test_traced_negative_clip_is_refused_under_jit(clipping):
    """Regression: a traced C = -1e-3 was never checked and flipped the clipped gradient."""
    params, batch = _problem()

    def step(l2_clip):
        return core.private_grad_sum(
            _loss, params, batch, jnp.ones(8), l2_clip=l2_clip, clipping=clipping
        )

    with pytest.raises(TypeError, match="l2_clip is a traced JAX value.*static"):
        jax.jit(step)(-1e-3)
    # Closed over (concrete), the same value is refused by name as a ValueError.
    with pytest.raises(ValueError, match="l2_clip must be a finite number > 0"):
        jax.jit(lambda: step(-1e-3))()


def test_traced_clip_is_refused_by_clip_and_sum():
    grads = {"w": jnp.ones((4, 3))}
    with pytest.raises(TypeError, match="l2_clip is a traced"):
        jax.jit(lambda g, c: core.clip_and_sum(g, l2_clip=c, params={"w": jnp.ones(3)}))(
            grads, -1.0
        )


@pytest.mark.parametrize("traced", ["noise_multiplier", "l2_clip", "expected_lot_size"])
def test_traced_noise_parameters_are_refused(traced):
    names = ("noise_multiplier", "l2_clip", "expected_lot_size")
    state = core.init_accumulator({"w": jnp.zeros((4,))})
    privacy = {"noise_multiplier": 1.0, "l2_clip": 1.0, "expected_lot_size": 8.0}
    static = tuple(name for name in names if name != traced)
    release = jax.jit(core.noisy_average, static_argnames=static)
    with pytest.raises(TypeError, match=f"{traced} is a traced JAX value"):
        release(state, jax.random.key(0), **privacy)
    # All static: fine.
    out = jax.jit(core.noisy_average, static_argnames=names)(state, jax.random.key(0), **privacy)
    chex.assert_shape(out["w"], (4,))


def test_traced_noise_stddev_is_refused():
    with pytest.raises(TypeError, match="stddev is a traced"):
        jax.jit(core.add_gaussian_noise)({"w": jnp.zeros(3)}, -1.0, jax.random.key(0))


def test_numpy_and_jax_scalars_are_accepted_by_the_accountant():
    """Regression: np.float32 / jnp scalars were rejected or crashed inside dp_accounting."""
    expected = core.compute_epsilon(1.1, 0.01, 100, 1e-5, "rdp")
    for sigma, q, steps, delta in [
        (np.float32(1.1), np.float64(0.01), np.int64(100), np.float32(1e-5)),
        (jnp.float32(1.1), jnp.asarray(0.01), jnp.int32(100), jnp.asarray(1e-5)),
        (1.1, 0.01, 100.0, 1e-5),
    ]:
        got = core.compute_epsilon(sigma, q, steps, delta, "rdp")
        assert got == pytest.approx(expected, rel=1e-5)
    sigma = core.calibrate_noise_multiplier(
        jnp.float32(8.0), np.float32(0.01), np.int64(100), jnp.asarray(1e-5), "rdp"
    )
    assert core.compute_epsilon(sigma, 0.01, 100, 1e-5, "rdp") <= 8.0


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"num_steps": 100.5}, "num_steps must be a positive integer"),
        ({"num_steps": np.float32(2.5)}, "num_steps must be a positive integer"),
        ({"num_steps": jnp.zeros(3, jnp.int32)}, "num_steps must be a scalar"),
        ({"sampling_rate": np.float32(1.5)}, "sampling_rate"),
        ({"delta": jnp.float32(1.0)}, "delta"),
        ({"noise_multiplier": np.float32(-1.0)}, "noise_multiplier"),
    ],
)
def test_bad_scalars_are_named(kwargs, name):
    args = {"noise_multiplier": 1.1, "sampling_rate": 0.01, "num_steps": 100, "delta": 1e-5}
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        core.compute_epsilon(**args)


def test_boolean_parameters_are_refused():
    with pytest.raises(TypeError, match="num_steps"):
        core.compute_epsilon(1.1, 0.01, True, 1e-5)


@pytest.mark.parametrize("clipping", ["ghost", "vmap"])
def test_mask_of_the_wrong_length_names_mask_and_batch_size(clipping):
    params, batch = _problem(rows=8)
    with pytest.raises(ValueError, match=r"mask has shape \(7,\) but the batch has 8 rows"):
        core.private_grad_sum(_loss, params, batch, jnp.ones(7), l2_clip=1.0, clipping=clipping)
    with pytest.raises(ValueError, match=r"mask has shape \(7,\) but the batch has 8 rows"):
        core.clip_and_sum(
            {"w": jnp.ones((8, 3))}, l2_clip=1.0, mask=jnp.ones(7), params={"w": jnp.ones(3)}
        )


@pytest.mark.parametrize("bad", [0.5, 2.0, -1.0])
def test_mask_must_be_an_indicator_not_weights(bad):
    params, batch = _problem(rows=4)
    mask = jnp.array([1.0, bad, 0.0, 1.0])
    with pytest.raises(ValueError, match="mask must hold only 0 and 1"):
        core.private_grad_sum(_loss, params, batch, mask, l2_clip=1.0)
    with pytest.raises(ValueError, match="mask must hold only 0 and 1"):
        core.clip_and_sum(
            {"w": jnp.ones((4, 3))}, l2_clip=1.0, mask=mask, params={"w": jnp.ones(3)}
        )


def test_traced_mask_counts_any_nonzero_entry_as_one():
    """Documented semantics where a mask cannot be checked: an indicator, not weights."""
    params, batch = _problem(rows=4)
    run = jax.jit(lambda m: core.private_grad_sum(_loss, params, batch, m, l2_clip=0.5)[0])
    chex.assert_trees_all_close(
        run(jnp.array([1.0, 0.3, 0.0, 7.0])), run(jnp.array([1.0, 1.0, 0.0, 1.0]))
    )


@pytest.mark.parametrize("clipping", ["ghost", "vmap"])
def test_batch_shaped_loss_is_refused_as_not_per_example(clipping):
    params, batch = _problem(rows=8)

    def batch_loss(p, example):
        return (example["x"] @ p["w"] - example["y"]) ** 2  # [2]: not a scalar.

    with pytest.raises(ValueError, match="loss_fn must return a scalar loss for ONE example"):
        core.private_grad_sum(
            batch_loss, params, batch, jnp.ones(8), l2_clip=1.0, clipping=clipping
        )


def test_calibration_warns_when_its_answer_is_the_search_floor():
    floor_epsilon = core.compute_epsilon(1e-2, 0.5, 1, 1e-5, "rdp")
    with pytest.warns(UserWarning, match="smallest noise multiplier searched"):
        sigma = core.calibrate_noise_multiplier(2 * floor_epsilon, 0.5, 1, 1e-5, "rdp")
    assert sigma == 1e-2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        core.calibrate_noise_multiplier(4.0, 0.01, 100, 1e-5, "rdp")


def test_shuffled_calibration_warns_at_the_search_floor():
    floor_epsilon = core.compute_epsilon_shuffled(1e-2, 1, 1e-5, "rdp")
    with pytest.warns(UserWarning, match="smallest noise multiplier searched"):
        sigma = core.calibrate_noise_multiplier_shuffled(2 * floor_epsilon, 1, 1e-5, "rdp")
    assert sigma == 1e-2
