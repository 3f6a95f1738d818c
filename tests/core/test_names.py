"""One vocabulary across `dpnmt.core` (issue 30 item 5).

The privacy parameters (`l2_clip`, `noise_multiplier`, `expected_lot_size`)
are keyword-only; `noise_key` is the noise, `dropout_key` the loss's key;
`clipping=` picks the method; `noise_mode=` the noise. Every old spelling still
works, warns (`ArgumentDeprecationWarning`, naming the new one) and gives the
same result; `from_batched_loss` adapts a batch-of-one loss (jax_privacy's).
"""

import inspect
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpnmt import core
from dpnmt.core import deprecation, dp_step

pytestmark = pytest.mark.filterwarnings("ignore:dp_accumulate_aggregate is deprecated")

C, SIGMA, L = 0.7, 1.3, 6.0
NOISE_KEY = core.key_from_seed(2**100 + 3)
DROPOUT_KEY = core.key_from_seed(2**100 + 4)
PARAMS = {"w": jnp.linspace(-1.0, 1.0, 6).reshape(3, 2)}
BATCH = {"x": jnp.asarray(np.random.default_rng(0).normal(size=(4, 3)), jnp.float32)}
MASK = jnp.asarray([1, 1, 0, 1])
GRADS = {"w": jnp.asarray(np.random.default_rng(1).normal(size=(4, 3, 2)) * 3, jnp.float32)}


def _loss(params, example, key=None):
    scale = 1.0 if key is None else jax.random.uniform(key, minval=0.5, maxval=1.5)
    return jnp.sum(jnp.tanh(example["x"] @ params["w"])) * scale


def _lot():
    return core.to_microbatches(jnp.arange(4), MASK.astype(bool), 2, 2, num_examples=4)


def _optax_release(make):
    tx = make()
    state = tx.init(PARAMS)
    extra = {"release": True} if "release" in inspect.signature(tx.update).parameters else {}
    return tx.update(GRADS, state, PARAMS, noise_key=NOISE_KEY, mask=MASK, **extra)[0]


ACC = core.accumulate(core.init_accumulator(PARAMS), {"w": GRADS["w"][0]}, 1)
PRIVACY = {"l2_clip": C, "noise_multiplier": SIGMA, "expected_lot_size": L}

# (function, old spelling) -> (old call, new call); each pair must agree exactly.
CASES = {
    ("noisy_average", "positional noise_multiplier"): (
        lambda: core.noisy_average(ACC, NOISE_KEY, SIGMA, C, L),
        lambda: core.noisy_average(ACC, NOISE_KEY, **PRIVACY),
    ),
    ("noisy_average", "key"): (
        lambda: core.noisy_average(ACC, key=NOISE_KEY, **PRIVACY),
        lambda: core.noisy_average(ACC, noise_key=NOISE_KEY, **PRIVACY),
    ),
    ("dp_aggregate", "positional l2_clip"): (
        lambda: _optax_release(lambda: core.dp_aggregate(C, SIGMA, L)),
        lambda: _optax_release(lambda: core.dp_aggregate(**PRIVACY)),
    ),
    ("dp_accumulate_aggregate", "positional l2_clip"): (
        lambda: _optax_release(lambda: core.dp_accumulate_aggregate(C, SIGMA, L)),
        lambda: _optax_release(lambda: core.dp_accumulate_aggregate(**PRIVACY)),
    ),
    ("private_grad_sum", "positional l2_clip"): (
        lambda: core.private_grad_sum(_loss, PARAMS, BATCH, MASK, C, clipping="vmap"),
        lambda: core.private_grad_sum(_loss, PARAMS, BATCH, MASK, l2_clip=C, clipping="vmap"),
    ),
    ("private_grad_sum", "key"): (
        lambda: core.private_grad_sum(
            _loss, PARAMS, BATCH, MASK, l2_clip=C, key=DROPOUT_KEY, clipping="vmap"
        ),
        lambda: core.private_grad_sum(
            _loss, PARAMS, BATCH, MASK, l2_clip=C, dropout_key=DROPOUT_KEY, clipping="vmap"
        ),
    ),
    ("clip_and_sum", "positional l2_clip"): (
        lambda: core.clip_and_sum(GRADS, C, MASK, params=PARAMS),
        lambda: core.clip_and_sum(GRADS, l2_clip=C, mask=MASK, params=PARAMS),
    ),
    ("private_lot_gradient", "key"): (
        lambda: core.private_lot_gradient(_loss, PARAMS, BATCH, _lot(), key=NOISE_KEY, **PRIVACY),
        lambda: core.private_lot_gradient(
            _loss, PARAMS, BATCH, _lot(), noise_key=NOISE_KEY, **PRIVACY
        ),
    ),
    ("private_lot_gradient", "clipping_method"): (
        lambda: core.private_lot_gradient(
            _loss, PARAMS, BATCH, _lot(), NOISE_KEY, clipping_method="vmap", **PRIVACY
        ),
        lambda: core.private_lot_gradient(
            _loss, PARAMS, BATCH, _lot(), NOISE_KEY, clipping="vmap", **PRIVACY
        ),
    ),
    ("private_lot_gradient", "example_key"): (
        lambda: core.private_lot_gradient(
            _loss, PARAMS, BATCH, _lot(), NOISE_KEY, example_key=DROPOUT_KEY, **PRIVACY
        ),
        lambda: core.private_lot_gradient(
            _loss, PARAMS, BATCH, _lot(), NOISE_KEY, dropout_key=DROPOUT_KEY, **PRIVACY
        ),
    ),
    ("add_gaussian_noise", "key"): (
        lambda: core.add_gaussian_noise(PARAMS, 0.5, key=NOISE_KEY),
        lambda: core.add_gaussian_noise(PARAMS, 0.5, noise_key=NOISE_KEY),
    ),
    ("add_gaussian_noise", "mode"): (
        lambda: core.add_gaussian_noise(PARAMS, 0.5, NOISE_KEY, mode="secure", l2_sensitivity=C),
        lambda: core.add_gaussian_noise(
            PARAMS, 0.5, NOISE_KEY, noise_mode="secure", l2_sensitivity=C
        ),
    ),
    ("noise_key_for_step", "base_key"): (
        lambda: jax.random.key_data(core.noise_key_for_step(base_key=NOISE_KEY, step=3)),
        lambda: jax.random.key_data(core.noise_key_for_step(noise_base=NOISE_KEY, step=3)),
    ),
    ("add_microbatch", "key"): (
        lambda: dp_step.add_microbatch(
            dp_step.init(PARAMS),
            _loss,
            PARAMS,
            BATCH,
            MASK,
            l2_clip=C,
            key=DROPOUT_KEY,
            clipping="vmap",
        ),
        lambda: dp_step.add_microbatch(
            dp_step.init(PARAMS),
            _loss,
            PARAMS,
            BATCH,
            MASK,
            l2_clip=C,
            dropout_key=DROPOUT_KEY,
            clipping="vmap",
        ),
    ),
}


def _new_name(function: str, old: str) -> str:
    return next(d.new for d in deprecation.DEPRECATED if (d.function, d.old) == (function, old))


@pytest.mark.parametrize("case", sorted(CASES), ids=lambda case: f"{case[0]}({case[1]})")
def test_an_old_spelling_warns_naming_the_new_one_and_gives_the_same_result(case):
    old_call, new_call = CASES[case]
    with pytest.warns(core.ArgumentDeprecationWarning) as record:
        old = old_call()
    ours = [w for w in record if issubclass(w.category, core.ArgumentDeprecationWarning)]
    assert f"{_new_name(*case)}=" in str(ours[0].message), str(ours[0].message)
    # The warning points at the caller's line (this file), not at the core.
    assert ours[0].filename == __file__
    chex.assert_trees_all_equal(old, new_call())


def test_every_deprecated_spelling_is_tested():
    # dp_accumulate_aggregate's other positional names share the one call above.
    listed = {(d.function, d.old) for d in deprecation.DEPRECATED}
    positional_rest = {
        (f, f"positional {n}")
        for f in ("noisy_average", "dp_aggregate", "dp_accumulate_aggregate")
        for n in ("l2_clip", "noise_multiplier", "expected_lot_size")
    } | {("clip_and_sum", "positional mask")}
    assert listed - positional_rest <= set(CASES), sorted(listed - positional_rest - set(CASES))


def test_the_new_spellings_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error", core.ArgumentDeprecationWarning)
        for (function, _), (_, new_call) in CASES.items():
            if function != "dp_accumulate_aggregate":  # deprecated as a whole
                new_call()


def test_both_spellings_at_once_is_an_error():
    with pytest.raises(TypeError, match="noise_key twice"):
        core.noisy_average(ACC, key=NOISE_KEY, noise_key=NOISE_KEY, **PRIVACY)
    with pytest.raises(TypeError, match="l2_clip twice"):
        core.clip_and_sum(GRADS, C, l2_clip=C)
    with pytest.raises(TypeError, match="positional arguments"):
        core.clip_and_sum(GRADS, C, MASK, 1)


@pytest.mark.parametrize(
    "function",
    [
        core.noisy_average,
        core.dp_aggregate,
        core.dp_multi_steps,
        core.private_grad_sum,
        core.clip_and_sum,
        core.private_lot_gradient,
        core.add_gaussian_noise,
        core.noise_key_for_step,
        dp_step.add_microbatch,
        dp_step.add_per_example_grads,
        dp_step.release,
        dp_step.apply_lot,
    ],
    ids=lambda f: f.__name__,
)
def test_privacy_parameters_are_keyword_only_and_named_alike(function):
    parameters = inspect.signature(function).parameters
    for name in ("l2_clip", "noise_multiplier", "expected_lot_size"):
        if name in parameters:
            assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY, (function, name)
    assert not {"key", "clipping_method", "example_key", "mode", "base_key"} & set(parameters)


def test_from_batched_loss_matches_jax_privacy_on_its_batch_of_one_loss():
    jax_privacy = pytest.importorskip("jax_privacy")
    nn = pytest.importorskip("flax.linen")
    model = nn.Sequential([nn.Dense(5), nn.tanh, nn.Dense(2)])
    params = model.init(jax.random.key(0), BATCH["x"])["params"]

    def batched_loss(params, batch):  # jax_privacy's convention: leaves [1, ...], a mean
        return jnp.mean(jnp.sum(model.apply({"params": params}, batch["x"]), axis=-1))

    def one_example_loss(params, example):
        return jnp.sum(model.apply({"params": params}, example["x"]))

    theirs = jax_privacy.clipped_grad(batched_loss, l2_clip_norm=C, batch_argnums=1)(params, BATCH)
    loss_fn = core.from_batched_loss(batched_loss)
    ones = jnp.ones(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", core.ghost.GhostClippingWarning)  # no fallback
        for fn in (loss_fn, one_example_loss):
            for clipping in ("vmap", "ghost"):
                ours = core.private_grad_sum(fn, params, BATCH, ones, l2_clip=C, clipping=clipping)
                chex.assert_trees_all_close(ours.grad_sum, theirs, rtol=1e-5, atol=1e-6)


def test_from_batched_loss_passes_the_key_and_refuses_a_vector_loss():
    seen = []

    def batched(params, batch, key):
        seen.append(batch["x"].shape)
        return _loss(params, {"x": batch["x"][0]}, key)

    loss_fn = core.from_batched_loss(batched)
    got = core.private_grad_sum(
        loss_fn, PARAMS, BATCH, MASK, l2_clip=C, dropout_key=DROPOUT_KEY, clipping="vmap"
    )
    want = core.private_grad_sum(
        _loss, PARAMS, BATCH, MASK, l2_clip=C, dropout_key=DROPOUT_KEY, clipping="vmap"
    )
    chex.assert_trees_all_close(got, want)
    assert seen and seen[-1] == (1, 3)
    per_row = core.from_batched_loss(lambda p, b: jnp.tanh(b["x"] @ p["w"]).reshape(-1))
    with pytest.raises(ValueError, match="one value"):
        per_row(PARAMS, {"x": BATCH["x"][0]})
