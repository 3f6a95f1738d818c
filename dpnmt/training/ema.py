"""An exponential moving average of the trained parameters (`train.ema_decay`).

DP-SGD's last iterate carries the last lots' noise; an average over the
iterates carries less (Polyak averaging; De et al. 2022 use this average for
DP image classifiers). Every iterate is already a released output of the
mechanism, so their average is post-processing: it spends no privacy and is
not secret. With `train.ema_decay` > 0 the average is the run's model: it is
validated, tested, checkpointed beside the iterate (exact resume), decoded
and exported; the iterate stays what each lot's gradient is taken at.
"""

import functools

import jax
import jax.numpy as jnp
import optax

# The average's warm-up: early on it weighs recent iterates more, so that the
# initial parameters (step 0) fade within tens of lots, not 1 / (1 - decay).
_WARMUP = 10.0


def decay_at(decay: float, step: jax.Array) -> jax.Array:
    """The decay used after `step` lots: min(decay, (1 + step) / (10 + step)).

    Args:
      decay: `train.ema_decay`, in [0, 1).
      step: lots done, including the one just applied (int scalar, >= 1).

    Returns:
      A float32 scalar in [0, decay].
    """
    step = jnp.asarray(step, jnp.float32)
    return jnp.minimum(jnp.float32(decay), (1.0 + step) / (_WARMUP + step))


@functools.partial(jax.jit, static_argnames="decay", donate_argnums=0)
def update(average, params, step: jax.Array, *, decay: float):
    """The average after the lot that produced `params`: d · average + (1 − d) · params.

    Args:
      average: the average so far (pytree like `params`; donated).
      params: the parameters after lot `step`.
      step: lots done, including this one (int scalar).
      decay: `train.ema_decay`; d = `decay_at(decay, step)`.

    Returns:
      The new average (`optax.incremental_update`).
    """
    return optax.incremental_update(params, average, 1.0 - decay_at(decay, step))
