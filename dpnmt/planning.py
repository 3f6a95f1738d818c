"""A run's privacy plan from Python, as the trainer makes it: σ, T, q and ε before training.

    from dpnmt import planning
    poisson = planning.plan(29_000, expected_lot_size=1024, num_epochs=20, target_epsilon=8)
    sigma = planning.get_noise_multiplier(
        target_epsilon=8, target_delta=1e-8, sample_rate=1024 / 29_000, epochs=20
    )

`plan` is what `python -m dpnmt.plan` prints (`privacy.plan_both_samplings`:
the trainer's `plan_privacy` after its checks); `get_noise_multiplier` takes
Opacus' `get_noise_multiplier` arguments and returns σ for Poisson lots, T =
round(epochs / q) as the trainer counts it. DP-SGD's ε only: a DP-SentencePiece
vocabulary or a private pretrained model adds its own.
"""

from dpnmt import core, privacy
from dpnmt.config import PrivacyConfig, TrainConfig
from dpnmt.errors import ConfigError, raise_problems


def plan(
    dataset_size: int,
    *,
    expected_lot_size: int,
    num_epochs: int,
    target_epsilon: float | None = None,
    noise_multiplier: float | None = None,
    delta: float = PrivacyConfig.delta,
    accountant: str = PrivacyConfig.accountant,
    sampling: str = privacy.POISSON,
) -> privacy.PrivacyPlan:
    """The trainer's plan for N, L, epochs and a target ε (σ calibrated) or σ (ε computed).

    Args:
        dataset_size: N, training pairs after preprocessing (`python -m dpnmt.data.inspect`).
        expected_lot_size: L (`train.expected_lot_size`).
        num_epochs: `train.num_epochs`.
        target_epsilon: ε to reach (`dp.target_epsilon`); or give `noise_multiplier`.
        noise_multiplier: σ (`dp.noise_multiplier`).
        delta: DP-SGD's δ (`dp.delta`).
        accountant: "pld" or "rdp" (`dp.accountant`).
        sampling: "poisson" (amplified by sampling) or "shuffle".

    Returns:
        The plan (`privacy.PrivacyPlan`: σ, T, q; `epsilon_after(T)` is its ε).

    Raises:
        ConfigError: What the trainer would refuse, one line each (by config field).
    """
    if (target_epsilon is None) == (noise_multiplier is None):
        raise ConfigError(
            "Give exactly one of target_epsilon (σ is calibrated) or noise_multiplier."
        )
    dp = PrivacyConfig(
        target_epsilon=target_epsilon,
        noise_multiplier=noise_multiplier,
        delta=delta,
        accountant=accountant,
    )
    train = TrainConfig(expected_lot_size=expected_lot_size, num_epochs=num_epochs)
    raise_problems([*dp.problems(), *train.problems()])
    poisson, shuffled = privacy.plan_both_samplings(dp, train, dataset_size)
    if sampling not in (privacy.POISSON, privacy.SHUFFLE):
        raise ConfigError(f"sampling={sampling!r} must be 'poisson' or 'shuffle'.")
    return poisson if sampling == privacy.POISSON else shuffled


def get_noise_multiplier(
    *,
    target_epsilon: float,
    target_delta: float,
    sample_rate: float,
    epochs: float | None = None,
    steps: int | None = None,
    accountant: str = PrivacyConfig.accountant,
) -> float:
    """σ for Poisson lots reaching `target_epsilon` at `target_delta`: Opacus' arguments.

    Args:
        target_epsilon: ε to spend, > 0 and finite.
        target_delta: δ in (0, 1).
        sample_rate: q = L/N in (0, 1].
        epochs: Passes over the data (T = round(epochs / q), the trainer's count); or `steps`.
        steps: T, lots in the run.
        accountant: "pld" (the trainer's default, tight) or "rdp" (Opacus' default).

    Returns:
        The smallest σ (within 0.1 %) whose ε is at most the target
        (`core.calibrate_noise_multiplier`).

    Raises:
        ConfigError: Neither or both of `epochs` and `steps`.
    """
    if (epochs is None) == (steps is None):
        raise ConfigError("Give exactly one of epochs or steps.")
    num_steps = steps if steps is not None else max(1, round(epochs / sample_rate))
    return core.calibrate_noise_multiplier(
        target_epsilon, sample_rate, num_steps, target_delta, accountant
    )
