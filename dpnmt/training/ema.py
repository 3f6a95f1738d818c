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


def decay_at(decay: float, step: jax.Array) -> jax.Array:
    """The bias-corrected decay after `step` lots: 1 − (1 − d) / (1 − d^step).

    The average after t lots is then Σ_{s=1..t} d^(t−s) θ_s / Σ_{s=1..t} d^(t−s):
    every iterate weighted by d^(lots since), the start θ_0 with weight 0 (Adam's
    bias correction, for parameters), so that d matters from the first lot on
    and the decay tends to d.

    Args:
      decay: `train.ema_decay` d, in [0, 1).
      step: lots done, including the one just applied (int scalar, >= 1).

    Returns:
      A float32 scalar in [0, d] (0 at step 1: the average is θ_1).
    """
    d = jnp.float32(decay)
    return 1.0 - (1.0 - d) / (1.0 - d ** jnp.asarray(step, jnp.float32))


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
    new = optax.incremental_update(params, average, 1.0 - decay_at(decay, step))
    return jax.tree.map(lambda n, a: n.astype(a.dtype), new, average)
