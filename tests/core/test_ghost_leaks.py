"""A linen loss_fn calling its layers inside `jax.checkpoint` falls back to vmap, under jit too.

The checkpointed function closes over the parameters, so the Dense call is
recognised, but its input is a tracer of the checkpoint's trace and cannot be
captured. Eagerly, JAX raised UnexpectedTracerError inside ghost clipping (and
`private_grad_sum` fell back); under `jax.jit` the escaped tracer became a
constant of the per-example trace and UnexpectedTracerError came only when
the jitted step was lowered, past the fallback. `ghost_trace.check_not_leaked`
now refuses it in the checked pass (`LeakedInputError`), for linen as for NNX.
"""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpnmt import core
from dpnmt.core import ghost

ROWS, L2_CLIP = 5, 1.0


class _Mlp(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(3, name="out")(jnp.tanh(nn.Dense(6, name="hidden")(x)))


def _checkpointed_loss(p, x):
    logits = jax.checkpoint(lambda x: _Mlp().apply({"params": p}, x))(x)
    return jnp.sum(jnp.sin(logits))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_layers_inside_jax_checkpoint_fall_back_to_vmap(jit):
    x = jax.random.normal(jax.random.key(0), (ROWS, 2, 4))
    params = _Mlp().init(jax.random.key(1), x[0])["params"]
    mask = jnp.ones((ROWS,)).at[1].set(0.0)

    def step(clipping):
        def grad_sum(params, x, mask):
            return core.private_grad_sum(
                _checkpointed_loss, params, x, mask, l2_clip=L2_CLIP, clipping=clipping
            )

        return jax.jit(grad_sum) if jit else grad_sum

    want = step("vmap")(params, x, mask)
    with pytest.warns(ghost.GhostClippingWarning, match="jax.checkpoint.*LeakedInputError"):
        got = step("ghost")(params, x, mask)
    chex.assert_trees_all_close(got.grad_sum, want.grad_sum, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got.norms, want.norms, rtol=1e-6)
    np.testing.assert_allclose(got.mean_loss, want.mean_loss, rtol=1e-6)


def test_ghost_clipped_sum_refuses_the_escaped_input_under_jit():
    x = jax.random.normal(jax.random.key(0), (ROWS, 2, 4))
    params = _Mlp().init(jax.random.key(1), x[0])["params"]

    @jax.jit
    def clipped(params, x):
        return ghost.ghost_clipped_sum(_checkpointed_loss, params, x, jnp.ones((ROWS,)), 1.0, None)

    with pytest.raises(ghost.LeakedInputError, match="jax.checkpoint"):
        clipped(params, x)
