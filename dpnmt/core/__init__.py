"""dpnmt.core: pure, jit-able DP-SGD building blocks for any JAX project.

Per-example clipping, Gaussian noise, gradient accumulation over micro-batches,
and privacy accounting. Imports only jax, chex, optax, dp_accounting, scipy and
numpy; flax (the optional `ghost` extra, `pip install "dpnmt[ghost]"`) only to
find the layers of a Flax loss for book-keeping clipping (`dpnmt.core.ghost`).
"""

from dpnmt.core import dp_step  # noqa: F401 - the one DP lot step, as `dpnmt.core.dp_step` (its own API page)
from dpnmt.core.accounting import (
    Accountant,
    calibrate_noise_multiplier,
    calibrate_noise_multiplier_shuffled,
    compute_epsilon,
    compute_epsilon_shuffled,
    epsilon_if_poisson_not_a_guarantee,
)
from dpnmt.core.accumulation import (
    AccumulatorState,
    accumulate,
    init_accumulator,
    noisy_average,
)
from dpnmt.core.aggregation import DpAggregateState, dp_aggregate
from dpnmt.core.clipping import clip_and_sum, count_nonfinite, per_example_l2_norms
from dpnmt.core.dp_step import TrainState, dropout_key, init_train_state
from dpnmt.core.group_accounting import compute_group_epsilon, compute_group_epsilon_shuffled
from dpnmt.core.group_clipping import group_clipped_sum
from dpnmt.core.noise import add_gaussian_noise, fresh_seed, key_from_seed, noise_key_for_step
from dpnmt.core.private_grad import PrivateGradSum, private_grad_sum

__all__ = [
    "Accountant",
    "AccumulatorState",
    "DpAggregateState",
    "PrivateGradSum",
    "TrainState",
    "accumulate",
    "add_gaussian_noise",
    "calibrate_noise_multiplier",
    "calibrate_noise_multiplier_shuffled",
    "clip_and_sum",
    "compute_epsilon",
    "compute_epsilon_shuffled",
    "compute_group_epsilon",
    "compute_group_epsilon_shuffled",
    "count_nonfinite",
    "dp_aggregate",
    "dropout_key",
    "epsilon_if_poisson_not_a_guarantee",
    "fresh_seed",
    "group_clipped_sum",
    "init_accumulator",
    "init_train_state",
    "key_from_seed",
    "noise_key_for_step",
    "noisy_average",
    "per_example_l2_norms",
    "private_grad_sum",
]

# --- JAX-native lot sampling and per-lot accumulation (issue 19) ---
from dpnmt.core.aggregation import (  # noqa: E402
    DpAccumulateState,
    DpMultiStepsState,
    dp_accumulate_aggregate,
    dp_multi_steps,
)
from dpnmt.core.lot_gradient import private_lot_gradient  # noqa: E402
from dpnmt.core.sampling import (  # noqa: E402
    MicroBatches,
    lot_capacity,
    poisson_lot,
    poisson_mask,
    shuffled_lots,
    to_microbatches,
)

__all__ += [
    "DpAccumulateState",
    "DpMultiStepsState",
    "MicroBatches",
    "dp_accumulate_aggregate",
    "dp_multi_steps",
    "lot_capacity",
    "poisson_lot",
    "poisson_mask",
    "private_lot_gradient",
    "shuffled_lots",
    "to_microbatches",
]
