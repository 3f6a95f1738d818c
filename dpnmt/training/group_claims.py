"""What a run's guarantee means for groups: the group-privacy statement and the unit record.

A per-pair run over a corpus with groups states DP-SGD's ε for the largest
group as a whole (`GroupClaim`, results.json "group_privacy"); a group-level
run (`dp.unit="group"`) records its unit, N_groups and k (`UnitClaim`,
"privacy_unit"). Both are parts of `privacy_report.PrivacyReport`.
"""

import dataclasses

from dpnmt import privacy

ASSUMED_PUBLIC = (
    "dataset_size (N, training examples after preprocessing: q = L/N, σ and T derive from it)",
    "expected_lot_size (L), noise_multiplier (σ), l2_clip (C), steps_planned (T), the config",
    "the validation and test splits, unless validation_is_private",
    "largest_group (k, pairs in the largest group the corpus names), when group_privacy is given",
)
# dp.unit="group": N and L count groups (the privacy_unit record names k and N_groups).
ASSUMED_PUBLIC_GROUPS = (
    "dataset_size (N = N_groups, groups of the training pairs kept after preprocessing: "
    "q = L/N, σ and T derive from it), group_cap (k)",
    *ASSUMED_PUBLIC[1:],
)


def assumed_public(plan: privacy.PrivacyPlan) -> tuple[str, ...]:
    """What the report assumes public: N and L count groups for a group-level plan."""
    return ASSUMED_PUBLIC_GROUPS if plan.unit == privacy.GROUP else ASSUMED_PUBLIC


@dataclasses.dataclass(frozen=True)
class GroupClaim:
    """What a per-pair guarantee means for the largest group the corpus names (group privacy).

    Attributes:
      unit: the run's privacy unit ("pair": one sentence pair).
      largest_group: k, pairs in the largest group (assumed public, like N).
      dp_sgd_epsilon: DP-SGD's ε for such a group as a whole at the planned T,
        at dp_sgd_delta (`PrivacyPlan.group_epsilon_after`).
      note: the statement in words.
    """

    unit: str
    largest_group: int
    dp_sgd_epsilon: float
    note: str


def group_claim(plan: privacy.PrivacyPlan, steps: int) -> GroupClaim | None:
    """The group statement of a per-pair run over a corpus with groups (None otherwise)."""
    epsilon = plan.group_epsilon_after(steps)
    if epsilon is None:
        return None
    k = plan.largest_group
    note = (
        f"The guarantee protects one sentence pair. A group of {k} pairs (the largest "
        "group in the training data: one case report, dialogue or user) is protected as a "
        f"whole only with DP-SGD ε = {epsilon:.3g} at δ = {plan.delta:g} at the planned T "
        "steps (group privacy; the vocabulary's share for a group is not included). "
        "Assumes k is public, like N."
    )
    return GroupClaim(unit="pair", largest_group=k, dp_sgd_epsilon=epsilon, note=note)


@dataclasses.dataclass(frozen=True)
class UnitClaim:
    """The privacy unit of a group-level (user-level) run: results.json's "privacy_unit".

    Attributes:
      unit: "group": one whole group (a user, a case report) is the neighbour.
      num_groups: N_groups, groups in the training split (assumed public, like N).
      group_cap: k, the most examples one sampled group adds to a lot.
      expected_groups_per_lot: L_groups.
      sampling_rate: q = L_groups / N_groups.
      steps_planned: T.
      noise_multiplier: σ (noise stddev / C, C bounding one group's contribution).
      epsilon_per_group: DP-SGD's ε for one whole group at the planned T, at
        `delta`: `dp_accounting`'s PoissonSampledDpEvent(q, GaussianDpEvent(σ))
        composed T times (`core.compute_epsilon` with the plan's accountant).
      delta: δ of DP-SGD.
      note: the statement in words.
    """

    unit: str
    num_groups: int
    group_cap: int
    expected_groups_per_lot: int
    sampling_rate: float
    steps_planned: int
    noise_multiplier: float
    epsilon_per_group: float
    delta: float
    note: str


def unit_claim(plan: privacy.PrivacyPlan) -> UnitClaim | None:
    """The unit record of a group-level plan (None for an example-level one)."""
    if plan.unit != privacy.GROUP:
        return None
    epsilon = plan.epsilon_after(plan.num_steps)
    note = (
        f"The guarantee protects one whole group (all its examples; at most k = {plan.group_cap} "
        f"of them in any lot): DP-SGD ε = {epsilon:.3g} per group at δ = {plan.delta:g}, "
        f"over N_groups = {plan.num_groups} groups sampled with q = {plan.sampling_rate:.4g}. "
        "Assumes N_groups and k are public, like N. Validation is the corpus's own split, "
        "assumed public like its test split (a validation carved from train is refused: it "
        "would split groups and publish some of their pairs' scores unnoised)."
    )
    return UnitClaim(
        unit=plan.unit,
        num_groups=plan.num_groups,
        group_cap=plan.group_cap,
        expected_groups_per_lot=plan.expected_lot_size,
        sampling_rate=plan.sampling_rate,
        steps_planned=plan.num_steps,
        noise_multiplier=plan.noise_multiplier,
        epsilon_per_group=epsilon,
        delta=plan.delta,
        note=note,
    )
