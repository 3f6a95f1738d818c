"""dpnmt.core: pure, jit-able DP-SGD building blocks for any JAX project.

Per-example clipping, Gaussian noise, gradient accumulation over micro-batches,
and privacy accounting. Imports only jax, chex, optax, dp_accounting, scipy and
numpy; flax (the optional `ghost` extra, `pip install "dpnmt[ghost]"`) only to
find the layers of a Flax loss for book-keeping clipping (`dpnmt.core.ghost`).

The public API is `__all__` (and the `dp_step` module); `__version__` is the
package's. Renamed or removed names warn for at least one minor release first
(`ArgumentDeprecationWarning`, listed in CHANGELOG.md; docs/core.md states the
policy).
"""

from importlib import metadata as _metadata

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
from dpnmt.core.aggregation import (
    DpAccumulateState,
    DpAggregateState,
    DpMultiStepsState,
    dp_accumulate_aggregate,
    dp_aggregate,
    dp_multi_steps,
)
from dpnmt.core.clipping import clip_and_sum, count_nonfinite, per_example_l2_norms
from dpnmt.core.deprecation import ArgumentDeprecationWarning
from dpnmt.core.dp_step import TrainState, dropout_key, init_train_state
from dpnmt.core.group_accounting import compute_group_epsilon, compute_group_epsilon_shuffled
from dpnmt.core.group_clipping import group_clipped_sum
from dpnmt.core.lot_gradient import private_lot_gradient
from dpnmt.core.noise import add_gaussian_noise, fresh_seed, key_from_seed, noise_key_for_step
from dpnmt.core.private_grad import PrivateGradSum, from_batched_loss, private_grad_sum
from dpnmt.core.private_grad_nnx import private_grad_sum_nnx
from dpnmt.core.sampling import (
    MicroBatches,
    lot_capacity,
    poisson_lot,
    poisson_mask,
    shuffled_lots,
    to_microbatches,
)

# The public API: what docs/core_api.md renders and the stability promise covers.
__all__ = [
    "Accountant",
    "AccumulatorState",
    "ArgumentDeprecationWarning",
    "DpAccumulateState",
    "DpAggregateState",
    "DpMultiStepsState",
    "MicroBatches",
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
    "dp_accumulate_aggregate",
    "dp_aggregate",
    "dp_multi_steps",
    "dropout_key",
    "epsilon_if_poisson_not_a_guarantee",
    "fresh_seed",
    "from_batched_loss",
    "group_clipped_sum",
    "init_accumulator",
    "init_train_state",
    "key_from_seed",
    "lot_capacity",
    "noise_key_for_step",
    "noisy_average",
    "per_example_l2_norms",
    "poisson_lot",
    "poisson_mask",
    "private_grad_sum",
    "private_grad_sum_nnx",
    "private_lot_gradient",
    "shuffled_lots",
    "to_microbatches",
]

try:
    __version__ = _metadata.version("dpnmt")
except _metadata.PackageNotFoundError:  # a source tree on sys.path, never installed
    __version__ = "0+unknown"
