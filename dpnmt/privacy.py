"""The privacy plan of a run: one source of truth for L, q, T and σ.

`plan_privacy` turns a config and the training-set size N into a `PrivacyPlan`
that the lot sampler (L), the DP step (σ, C, L) and the accountant (q, T, σ, δ)
all read, so the ε reported always describes the sampling that ran.
"""

import dataclasses
import math

from dpnmt import config_lib, core

POISSON, SHUFFLE = "poisson", "shuffle"


@dataclasses.dataclass(frozen=True)
class PrivacyPlan:
    """What a run will do and which bound its ε comes from.

    Attributes:
      private: False for non-private training (no clipping, no noise, ε = ∞).
      sampling: "poisson" or "shuffle".
      dataset_size: N, training examples after preprocessing.
      expected_lot_size: L; Poisson lots have this expected size, shuffled lots
        exactly this size; the noisy sum is divided by it.
      num_steps: T, planned optimizer steps (lots), empty lots included.
      steps_per_epoch: N // L (shuffled: full lots per epoch).
      noise_multiplier: σ (0 when not private).
      l2_clip: C.
      delta: δ of DP-SGD.
      accountant: "pld" or "rdp".
      seed_is_secret: False when the noise seed was fixed by the config (tests
        only, `config.testing_only_fixed_noise_seed_NO_PRIVACY`): anyone holding
        it rebuilds the noise, so every ε of the run is ∞.
      noise_mode: "float" or "secure" (`core.noise.NOISE_MODES`): how the noise
        is drawn; plans saved before the field existed were "float".
    """

    private: bool
    sampling: str
    dataset_size: int
    expected_lot_size: int
    num_steps: int
    steps_per_epoch: int
    noise_multiplier: float
    l2_clip: float
    delta: float
    accountant: str
    seed_is_secret: bool = True
    noise_mode: str = "float"

    @property
    def sampling_rate(self) -> float:
        """Q = L / N."""
        return self.expected_lot_size / self.dataset_size

    @property
    def bound(self) -> str:
        """Which bound `epsilon_after` reports, in words."""
        if not self.private:
            return "none (non-private training)"
        if not self.seed_is_secret:
            return f"none ({config_lib.FIXED_SEED_NOTE}: the noise seed was fixed for a test)"
        if self.sampling == POISSON:
            return f"Poisson-sampled Gaussian, {self.accountant.upper()} accountant"
        return (
            "shuffled fixed-size lots, composition over epochs without amplification "
            f"by sampling, {self.accountant.upper()} accountant"
        )

    def epochs_started(self, steps_done: int) -> int:
        """Epochs begun after `steps_done` steps (a started epoch counts whole)."""
        return max(1, math.ceil(steps_done / self.steps_per_epoch))

    def epsilon_after(self, steps_done: int) -> float:
        """ε of DP-SGD after `steps_done` steps (inf: not private or a fixed seed)."""
        if not self.private or not self.seed_is_secret:
            return math.inf
        if steps_done == 0:
            return 0.0
        if self.sampling == POISSON:
            return core.compute_epsilon(
                self.noise_multiplier, self.sampling_rate, steps_done, self.delta, self.accountant
            )
        return core.compute_epsilon_shuffled(
            self.noise_multiplier, self.epochs_started(steps_done), self.delta, self.accountant
        )

    def poisson_figure_not_a_guarantee(self, steps_done: int) -> float | None:
        """For shuffled runs only: the Poisson ε papers report, NOT a guarantee."""
        if not self.private or not self.seed_is_secret:
            return None
        if self.sampling != SHUFFLE or steps_done == 0:
            return None
        return core.epsilon_if_poisson_not_a_guarantee(
            self.noise_multiplier, self.sampling_rate, steps_done, self.delta, self.accountant
        )


def plan_privacy(
    dp_config, train_config, dataset_size: int, *, seed_is_secret: bool = True
) -> PrivacyPlan:
    """Builds the plan: T from epochs, σ calibrated to the target ε or taken as given.

    Args:
      dp_config: `config.dp` (enabled, target_epsilon | noise_multiplier, l2_clip,
        delta, accountant, sampling).
      train_config: `config.train` (expected_lot_size, num_epochs).
      dataset_size: N.
      seed_is_secret: False for a fixed (test-only) noise seed: ε = ∞.

    Returns:
      The `PrivacyPlan`.

    Raises:
      ValueError: L > N, neither or both of target_epsilon / noise_multiplier,
        an unreachable target, an unknown sampling.
    """
    lot_size, epochs = int(train_config.expected_lot_size), int(train_config.num_epochs)
    if dataset_size < 1:
        raise ValueError("The training split is empty after preprocessing.")
    if not 1 <= lot_size < dataset_size:
        raise ValueError(
            f"train.expected_lot_size={lot_size} must be in [1, N={dataset_size}) "
            "(N: training examples after preprocessing); lower it."
        )
    if epochs < 1:
        raise ValueError(f"train.num_epochs={epochs} must be >= 1.")
    if dp_config.sampling not in (POISSON, SHUFFLE):
        raise ValueError(f"dp.sampling={dp_config.sampling!r} must be 'poisson' or 'shuffle'.")
    steps_per_epoch = dataset_size // lot_size
    if dp_config.sampling == POISSON:
        num_steps = max(1, round(epochs * dataset_size / lot_size))
    else:
        num_steps = epochs * steps_per_epoch
    private = bool(dp_config.enabled)
    sigma = 0.0
    if private:
        target, given = dp_config.target_epsilon, dp_config.noise_multiplier
        if target is None and given is None:
            raise ValueError(
                "A private run needs dp.target_epsilon (σ is calibrated) or "
                "dp.noise_multiplier (ε is reported)."
            )
        if given is not None:  # A given σ wins over a variant's target ε.
            sigma = float(given)
            if not sigma > 0:
                raise ValueError(
                    f"dp.noise_multiplier={given} must be > 0 for a private run "
                    "(use the :nonprivate variant for no noise)."
                )
        elif dp_config.sampling == POISSON:
            sigma = core.calibrate_noise_multiplier(
                float(target),
                lot_size / dataset_size,
                num_steps,
                dp_config.delta,
                dp_config.accountant,
                dataset_size=dataset_size,
            )
        else:
            sigma = core.calibrate_noise_multiplier_shuffled(
                float(target),
                epochs,
                dp_config.delta,
                dp_config.accountant,
                dataset_size=dataset_size,
            )
    return PrivacyPlan(
        private=private,
        sampling=dp_config.sampling,
        dataset_size=dataset_size,
        expected_lot_size=lot_size,
        num_steps=num_steps,
        steps_per_epoch=steps_per_epoch,
        noise_multiplier=sigma,
        l2_clip=float(dp_config.l2_clip),
        delta=float(dp_config.delta),
        accountant=dp_config.accountant,
        seed_is_secret=seed_is_secret,
        noise_mode=dp_config.get("noise_mode", "float"),
    )
