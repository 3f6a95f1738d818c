"""The privacy plan of a run: one source of truth for L, q, T and σ.

`plan_privacy` turns a config and the training-set size N into a `PrivacyPlan`
that the lot sampler (L), the DP step (σ, C, L) and the accountant (q, T, σ, δ)
all read, so the ε reported always describes the sampling that ran.
"""

import dataclasses
import math

from dpnmt import config, config_lib, core, sigma_hints
from dpnmt.errors import raise_problems

POISSON, SHUFFLE = "poisson", "shuffle"
# The privacy unit: one example (a sentence pair), or one group (a user, a case report).
EXAMPLE, GROUP = "example", "group"
UNITS = (EXAMPLE, GROUP)


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
      largest_group: k, pairs in the largest group (privacy unit: a case report,
        a dialogue, a user) the train split names (`dpnmt.data.groups`), before
        preprocessing; None when it names none. Assumed public, like N.
      unit: "example" (the default) or "group" (user-level DP-SGD: groups are
        Poisson-sampled and each group's summed gradient is clipped to C as one
        contribution, `core.group_clipping`). For "group", `dataset_size` is
        N_groups, `expected_lot_size` L_groups (groups per lot), q = L_groups /
        N_groups, and every ε of the plan is per group.
      group_cap: k, the most examples one sampled group adds to a lot ("group"
        only; None otherwise).
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
    largest_group: int | None = None
    unit: str = EXAMPLE
    group_cap: int | None = None

    @property
    def num_groups(self) -> int | None:
        """N_groups for a group-level plan (None for an example-level one)."""
        return self.dataset_size if self.unit == GROUP else None

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
        if self.sampling == POISSON and self.unit == GROUP:
            return (
                f"Poisson-sampled Gaussian over groups (user-level), "
                f"{self.accountant.upper()} accountant"
            )
        if self.sampling == POISSON:
            return f"Poisson-sampled Gaussian, {self.accountant.upper()} accountant"
        return (
            "shuffled fixed-size lots, composition over epochs without amplification "
            f"by sampling, {self.accountant.upper()} accountant"
        )

    @property
    def lots_per_epoch(self) -> float:
        """Lots in one pass over the data: N / L for Poisson lots (expected), N // L shuffled."""
        if self.sampling == POISSON:
            return self.dataset_size / self.expected_lot_size
        return max(self.steps_per_epoch, 1)

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

    def group_epsilon_after(self, steps_done: int) -> float | None:
        """DP-SGD's ε for the largest group as a whole after `steps_done` steps (group privacy).

        None without groups, privacy or steps. `core.compute_group_epsilon`
        (Poisson) or `core.compute_group_epsilon_shuffled` (its accountant).
        """
        k = self.largest_group
        if k is None or not self.private or not self.seed_is_secret or steps_done == 0:
            return None
        if self.unit == GROUP:  # epsilon_after is already per group.
            return None
        if self.sampling == POISSON:
            return core.compute_group_epsilon(
                noise_multiplier=self.noise_multiplier,
                sampling_rate=self.sampling_rate,
                num_steps=steps_done,
                delta=self.delta,
                group_size=k,
            )
        return core.compute_group_epsilon_shuffled(
            noise_multiplier=self.noise_multiplier,
            num_epochs=self.epochs_started(steps_done),
            delta=self.delta,
            group_size=k,
            accountant=self.accountant,
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
    dp_config,
    train_config,
    dataset_size: int,
    *,
    seed_is_secret: bool = True,
    largest_group: int | None = None,
    num_groups: int | None = None,
) -> PrivacyPlan:
    """Builds the plan: T from epochs, σ calibrated to the target ε or taken as given.

    Args:
      dp_config: `config.dp` (enabled, target_epsilon | noise_multiplier, l2_clip,
        delta, accountant, sampling).
      train_config: `config.train` (expected_lot_size, num_epochs).
      dataset_size: N.
      seed_is_secret: False for a fixed (test-only) noise seed: ε = ∞.
      largest_group: k of the train split's largest group (None: no groups).
      num_groups: N_groups, groups in the train split; needed for
        `dp_config.unit == "group"`, where it replaces N (`dataset_size`) and
        L is L_groups, groups per lot: `dp.group_lot_size`, or when unset
        `train.expected_lot_size` (`dpnmt.config.lot_size`, the one rule).

    Returns:
      The `PrivacyPlan`.

    Raises:
      ValueError: L > N, neither or both of target_epsilon / noise_multiplier,
        an unreachable target, an unknown sampling or unit; for unit "group":
        no groups, no cap k >= 1, or shuffled sampling.
    """
    lot_size, lot_field = config.lot_size(dp_config, train_config)
    lot_size, epochs = int(lot_size), int(train_config.num_epochs)
    unit = getattr(dp_config, "unit", EXAMPLE)
    group_cap = None
    if unit not in UNITS:
        raise ValueError(f"dp.unit={unit!r} must be one of {UNITS}.")
    if unit == GROUP:
        group_cap = _check_group_unit(dp_config, num_groups)
        dataset_size = num_groups
    if dataset_size < 1:
        raise ValueError("The training split is empty after preprocessing.")
    if not 1 <= lot_size < dataset_size:
        raise ValueError(_lot_size_message(lot_size, lot_field, unit, dataset_size))
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
            sigma = sigma_hints.calibrate(
                core.calibrate_noise_multiplier,
                (POISSON, float(target), lot_size / dataset_size, num_steps),
                dp_config,
                dataset_size,
            )
        else:
            sigma = sigma_hints.calibrate(
                core.calibrate_noise_multiplier_shuffled,
                (SHUFFLE, float(target), epochs),
                dp_config,
                dataset_size,
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
        noise_mode=getattr(dp_config, "noise_mode", "float"),
        largest_group=largest_group,
        unit=unit,
        group_cap=group_cap,
    )


def _lot_size_message(lot_size: int, field: str, unit: str, dataset_size: int) -> str:
    """Why L is refused (outside [1, N)) and the fix, naming the field L came from."""
    if unit != GROUP:
        return (
            f"train.expected_lot_size={lot_size} must be in [1, N={dataset_size}) "
            "(N: training examples after preprocessing); lower it."
        )
    bound = f"[1, N_groups={dataset_size}) (groups of the train pairs kept after preprocessing)"
    if field == "dp.group_lot_size":
        return f"dp.group_lot_size={lot_size} (groups per lot) must be in {bound}; lower it."
    return (
        f"dp.unit='group' with dp.group_lot_size unset reads train.expected_lot_size={lot_size} "
        f"as groups per lot, which must be in {bound}: set dp.group_lot_size, the expected "
        f"groups per lot (e.g. --config.dp.group_lot_size={max(1, dataset_size // 5)})."
    )


def _check_group_unit(dp_config, num_groups: int | None) -> int:
    """The cap k of a group-level plan; ValueError naming the fix for what it lacks."""
    if num_groups is None:
        raise ValueError(
            "dp.unit='group' needs a corpus whose pairs name their group (ClinSpEn's case "
            "report, BSD's scenario, a `group` column in data.files): this one names none; "
            "use dp.unit='example' or add the column."
        )
    cap = getattr(dp_config, "group_cap", None)
    if cap is None or isinstance(cap, bool) or int(cap) != cap or cap < 1:
        raise ValueError(
            f"dp.group_cap={cap!r}: dp.unit='group' needs an int k >= 1, the most "
            "examples one group adds to a lot (e.g. --config.dp.group_cap=8)."
        )
    if dp_config.sampling != POISSON:
        raise ValueError(
            f"dp.unit='group' needs dp.sampling='poisson', not {dp_config.sampling!r}."
        )
    return int(cap)


def size_problems(dp, train, dataset_size: int, num_groups: int | None = None) -> list[str]:
    """Problems that need N: the lot size below N, a reachable target ε.

    Reachability is one accountant evaluation at the largest σ the calibration
    tries (the run calibrates σ itself, once). `num_groups`: N_groups, for
    `dp.unit="group"` (None: the corpus names no groups).
    """
    calibrate = dp.enabled and dp.noise_multiplier is None and dp.target_epsilon is not None
    if calibrate:  # Stand-in σ: the plan's L, N, q and T do not depend on it.
        dp = dataclasses.replace(dp, noise_multiplier=1.0)
    try:
        plan = plan_privacy(dp, train, dataset_size, num_groups=num_groups)
    except ValueError as error:
        return [str(error)]
    if not calibrate:
        return []
    largest = core.accounting.MAX_NOISE_MULTIPLIER  # The calibration's range.
    reached = dataclasses.replace(plan, noise_multiplier=largest).epsilon_after(plan.num_steps)
    if reached > dp.target_epsilon:
        return [
            f"dp.target_epsilon={dp.target_epsilon:g} is unreachable: even σ={largest:g} gives "
            f"ε={reached:.4g} (N={plan.dataset_size}, q={plan.sampling_rate:.4g}, "
            f"T={plan.num_steps}, {plan.sampling}); raise dp.target_epsilon or dp.delta, or "
            "lower train.num_epochs."
        ]
    return []


# Below these, a private run most likely is not what was meant (a wrong or truncated
# folder, a typo in epochs or L): noted before anything is written.
SMALL_PRIVATE_N = 1_000
FEW_LOTS = 10


def small_run_note(dp, train, dataset_size: int, num_groups: int | None = None) -> str | None:
    """A note for a private plan on fewer than 1,000 units or in fewer than 10 lots, else None.

    For the operator's log only (it names N). `num_groups`: N_groups for `dp.unit="group"`.
    """
    if not dp.enabled:
        return None
    if dp.noise_multiplier is None:  # Stand-in σ: N, q and T do not depend on it.
        dp = dataclasses.replace(dp, noise_multiplier=1.0)
    try:
        plan = plan_privacy(dp, train, dataset_size, num_groups=num_groups)
    except ValueError:
        return None  # Refused by `size_problems`.
    if plan.dataset_size >= SMALL_PRIVATE_N and plan.num_steps >= FEW_LOTS:
        return None
    units = "groups" if num_groups is not None and dp.unit == GROUP else "training pairs"
    few = [f"so few {units}"] * (plan.dataset_size < SMALL_PRIVATE_N)
    few += ["so few lots"] * (plan.num_steps < FEW_LOTS)
    return (
        f"A private run on N={plan.dataset_size:,} {units} in T={plan.num_steps} lots "
        f"(q={plan.sampling_rate:.3g}): DP-SGD's noise swamps what {' in '.join(few)} can "
        "teach (docs/hyperparameters.md). If that is not what you meant, check "
        "data.corpus (a wrong or truncated folder?), data.max_train_examples, "
        "train.num_epochs and train.expected_lot_size."
    )


def suggested_delta(dataset_size: int) -> float:
    """1/(10N) rounded down to a power of ten: a δ well below 1/N."""
    return 10.0 ** math.floor(math.log10(1.0 / (10 * dataset_size)))


def delta_problems(
    dp,
    dataset_size: int,
    other_deltas: tuple[tuple[str, float], ...] = (),
    counted: str = "training pairs",
) -> list[str]:
    """A private run's total δ at or above 1/N is refused unless `dp.allow_large_delta`.

    δ ≥ 1/N admits a mechanism that publishes a random training example in full.
    The total is DP-SGD's δ plus the DP vocabulary's and a composed pretrained
    export's (`training.pretrained_privacy`).

    Args:
      dp: `config.dp` (a `dpnmt.config.PrivacyConfig`).
      dataset_size: N.
      other_deltas: (what it is, δ) of each mechanism composed with DP-SGD.
      counted: what N counts ("groups" for `dp.unit="group"`: N = N_groups).
    """
    if not dp.enabled or dp.allow_large_delta or not isinstance(dp.delta, (int, float)):
        return []
    parts = [f"dp.delta={dp.delta:g}"]
    total = float(dp.delta)
    for what, delta in other_deltas:
        total += float(delta)
        parts.append(what)
    if total * dataset_size < 1:
        return []
    parts_text = parts[0] if len(parts) == 1 else f"{' + '.join(parts)}: total δ={total:g}"
    return [
        f"{parts_text} is at least 1/N = {1 / dataset_size:.3g} (N={dataset_size} {counted} "
        "after preprocessing): such a δ allows publishing a random training example "
        f"in full. Use e.g. dp.delta={suggested_delta(dataset_size):g} (1/(10N) rounded "
        "down to a power of ten), or set dp.allow_large_delta=True to accept it."
    ]


def plan_both_samplings(dp, train, dataset_size: int) -> tuple[PrivacyPlan, PrivacyPlan]:
    """The trainer's plans for `dp`, `train` and N, with Poisson and with shuffled lots.

    What `python -m dpnmt.plan` prints: each is `plan_privacy(dp, train, N)` with
    `dp.sampling` set, after the trainer's own checks (L < N, a reachable ε, δ
    below 1/N), so its σ, T, q and ε are those a run with these inputs reports.

    Args:
      dp: `config.dp` (a `dpnmt.config.PrivacyConfig`; `sampling` is replaced).
      train: `config.train` (expected_lot_size, num_epochs).
      dataset_size: N, training pairs after preprocessing.

    Returns:
      (the Poisson plan, the shuffled plan).

    Raises:
      ConfigError: what the trainer would refuse, one line each.
    """
    plans = []
    for sampling in (POISSON, SHUFFLE):
        sampled = dataclasses.replace(dp, sampling=sampling)
        problems = size_problems(sampled, train, dataset_size)
        raise_problems(problems or delta_problems(sampled, dataset_size))
        plans.append(plan_privacy(sampled, train, dataset_size))
    return plans[0], plans[1]


def describe_plan(plan: PrivacyPlan) -> list[str]:
    """A plan in a few lines: σ, T, q, ε at the planned T, and which bound ε comes from."""
    epsilon = plan.epsilon_after(plan.num_steps)
    lines = [
        f"{plan.sampling}: σ={plan.noise_multiplier:.4g}, T={plan.num_steps:,} steps "
        f"({plan.steps_per_epoch:,} full lots an epoch), q=L/N={plan.sampling_rate:.4g}, "
        f"ε={epsilon:.4g} at δ={plan.delta:g}",
        f"  bound: {plan.bound}",
    ]
    poisson = plan.poisson_figure_not_a_guarantee(plan.num_steps)
    if poisson is not None:
        lines.append(
            f"  shuffled lots get no amplification by sampling: the Poisson figure for the same "
            f"σ, q and T, ε={poisson:.4g}, is NOT a guarantee (the run reports it as "
            "epsilon_if_poisson_NOT_A_GUARANTEE)"
        )
    return lines
