"""The privacy a run can defend: `PrivacyReport`, results.json's "privacy" record.

The guarantee is ε at the PLANNED T steps, fixed before training: early
stopping picks the stop step from validation scores, so ε at the realised step
is chosen adaptively and is reported only as
`epsilon_at_realised_stop_NOT_A_GUARANTEE` (no privacy filter is used).
`to_json` gives results.json's "privacy" object (a published format: its keys
and their order are fixed); `from_json` reads it back.
"""

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from dpnmt import config_lib, privacy
from dpnmt.training import ledger as ledger_lib
from dpnmt.training import ledger_report
from dpnmt.training.composition_rules import (  # noqa: F401 - adjacency, parallel_total re-exported
    JOINT_NOTE,
    PARALLEL_COMPOSITION,
    adjacency,
    mixed_adjacency_note,
    parallel_total,
    parallel_units_note,
    unguarded_export_note,
    units_note,
)
from dpnmt.training.group_claims import (  # noqa: F401 - ASSUMED_PUBLIC re-exported
    ASSUMED_PUBLIC,
    GroupClaim,
    UnitClaim,
    assumed_public,
    group_claim,
    unit_claim,
)
from dpnmt.training.stage_composition import JointDpSgd, joint_dp_sgd

DP_SGD_EPSILON_IS_AT = "the planned T steps (steps_planned), fixed before training"


@dataclasses.dataclass(frozen=True)
class VocabularyClaim:
    """How the vocabulary was made and what it adds to ε (`VocabularyRecord`'s public part)."""

    kind: str
    covered_by_guarantee: bool
    epsilon: float | None
    delta: float | None
    note: str


@dataclasses.dataclass(frozen=True)
class PretrainedClaim:
    """What the starting model (`model.name_or_path`) adds to ε (`training.pretrained_privacy`).

    Attributes:
      dpnmt_export: whether it is a dpnmt export (its `dpnmt.json` holds a privacy record).
      composed: whether its (ε, δ) is composed into this run's total.
      declared_disjoint: `model.pretrained_data_disjoint` was set: its training
        data were declared to share no example (dp.unit="group": no group) with this run's.
      epsilon: the export's total ε on its training data (inf: no guarantee), or None.
      delta: its total δ, or None.
      note: one line for the report.
      record: the export's own privacy record (its results.json "privacy"), or None.
      adjacency: the neighbouring datasets the export's ε is stated for (its
        record's "adjacency"), or None when its record gives none.
      parallel: declared disjoint from this run's data and the export's record
        is private (a DP run: its data were someone's): parallel composition,
        the run's total (ε, δ) is the maximum of the export's and this run's
        (`parallel_total`). A claim recorded before it existed (no "parallel"
        key) is read as parallel when declared disjoint with a private record.
      ledger: the export's whole lineage (`training.ledger`: each stage's corpora
        and events), or None in a claim recorded before the ledger (the report
        then composes as it did).
    """

    dpnmt_export: bool
    composed: bool
    declared_disjoint: bool
    epsilon: float | None
    delta: float | None
    note: str
    record: dict[str, Any] | None = None
    adjacency: str | None = None
    parallel: bool = False
    ledger: tuple[ledger_lib.Stage, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        """Its JSON object (results.json's "privacy"/"pretrained", pretrained.json)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if self.ledger is None:
            del out["ledger"]  # A claim without one keeps its former JSON.
        else:
            out["ledger"] = [stage.to_json() for stage in self.ledger]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "PretrainedClaim":
        """Reads `to_json`'s object back (inf stored as "inf")."""
        values = dict(data)
        for key in ("epsilon", "delta"):  # write_json stores inf as "inf".
            if isinstance(values.get(key), str):
                values[key] = float(values[key])
        if "parallel" not in values and _left_out_private(values):
            # Recorded before parallel composition (its ε dropped): a resumed run, decode
            # or export now takes the max. Its ε, the record's total plus any left-out earlier
            # stage's, is at least what `pretrained_privacy.parallel_by_export` would give.
            values["parallel"] = True
            values["note"] = (
                f"{values.get('note')} (read as parallel composition: recorded before it)"
            )
        if values.get("ledger") is not None:
            values["ledger"] = ledger_lib.parse_stages(values["ledger"], "the recorded claim")
        return cls(**values)

    @property
    def composed_epsilon(self) -> float:
        """ε it adds to this run's total (0 when not composed)."""
        return float(self.epsilon) if self.composed and self.epsilon is not None else 0.0

    @property
    def composed_delta(self) -> float:
        """δ it adds to this run's total (0 when not composed)."""
        return float(self.delta) if self.composed and self.delta is not None else 0.0


def _left_out_private(claim: Mapping[str, Any]) -> bool:
    """A dpnmt export declared disjoint, not composed, whose own record is private."""
    record = claim.get("record")
    return bool(
        claim.get("dpnmt_export")
        and claim.get("declared_disjoint")
        and not claim.get("composed")
        and isinstance(record, Mapping)
        and record.get("private") is True
    )


@dataclasses.dataclass(frozen=True)
class PrivacyReport:
    """The run's claim: DP-SGD's (ε, δ) at the planned T, composed with the vocabulary's.

    Attributes (units: ε in nats of privacy loss, δ a probability, sizes in
    examples): as results.json's "privacy" object. The `*_NOT_A_GUARANTEE`
    figures and `total_delta` are None when they do not apply (then absent
    from the JSON). `noise_mode` is how the noise was drawn ("float": float32
    Gaussian, the raw noisy sums exposed to floating-point attacks; "secure":
    a discrete Gaussian on a grid, `dpnmt.core.secure_noise`); results written
    before it existed read back as "float".
    """

    private: bool
    bound: str
    sampling: str
    adjacency: str
    noise_multiplier: float
    l2_clip: float
    expected_lot_size: int
    dataset_size: int
    sampling_rate: float
    assumed_public: tuple[str, ...]
    steps_done: int
    steps_planned: int
    dp_sgd_epsilon: float
    dp_sgd_epsilon_is_at: str
    dp_sgd_delta: float
    validation_is_private: bool
    vocabulary: VocabularyClaim
    total_epsilon: float
    composition: str
    total_delta: float | None = None
    pretrained: PretrainedClaim | None = None
    epsilon_at_realised_stop_NOT_A_GUARANTEE: float | None = None
    epsilon_if_poisson_NOT_A_GUARANTEE: float | None = None
    epsilon_if_seed_were_secret_NOT_A_GUARANTEE: float | None = None
    noise_mode: str = "float"
    group_privacy: GroupClaim | None = None
    privacy_unit: UnitClaim | None = None
    example: str | None = None
    joint_dp_sgd: JointDpSgd | None = None
    ledger: ledger_report.Composition | None = None

    # results.json's key order (a published format).
    _ORDER = (
        "private",
        "bound",
        "sampling",
        "adjacency",
        "example",
        "noise_multiplier",
        "l2_clip",
        "noise_mode",
        "expected_lot_size",
        "dataset_size",
        "sampling_rate",
        "assumed_public",
        "steps_done",
        "steps_planned",
        "dp_sgd_epsilon",
        "dp_sgd_epsilon_is_at",
        "dp_sgd_delta",
        "validation_is_private",
        "vocabulary",
        "pretrained",
        "epsilon_at_realised_stop_NOT_A_GUARANTEE",
        "epsilon_if_poisson_NOT_A_GUARANTEE",
        "epsilon_if_seed_were_secret_NOT_A_GUARANTEE",
        "total_epsilon",
        "total_delta",
        "composition",
        "joint_dp_sgd",
        "group_privacy",
        "privacy_unit",
        "ledger",
    )
    _OPTIONAL = (
        "example",
        "ledger",
        "joint_dp_sgd",
        "group_privacy",
        "privacy_unit",
        "total_delta",
        "pretrained",
        "epsilon_at_realised_stop_NOT_A_GUARANTEE",
        "epsilon_if_poisson_NOT_A_GUARANTEE",
        "epsilon_if_seed_were_secret_NOT_A_GUARANTEE",
    )

    @property
    def claimed(self) -> tuple[float, float]:
        """The (ε, δ) the run claims in total: ε inf without a guarantee."""
        epsilon = self.total_epsilon if self.private else math.inf
        delta = self.total_delta if self.total_delta is not None else self.dp_sgd_delta
        return float(epsilon), float(delta)

    def to_json(self) -> dict[str, Any]:
        """results.json's "privacy" object (non-finite floats stay floats: `write_json`)."""
        out = {}
        for key in self._ORDER:
            value = getattr(self, key)
            if key in self._OPTIONAL and value is None:
                continue
            if key in ("vocabulary", "group_privacy", "privacy_unit", "joint_dp_sgd"):
                value = dataclasses.asdict(value)
            elif key in ("pretrained", "ledger"):
                value = value.to_json()
            elif key == "assumed_public":
                value = list(value)
            out[key] = value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "PrivacyReport":
        """Reads `to_json`'s object back (as loaded from results.json: inf as "inf")."""
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        values["vocabulary"] = VocabularyClaim(**data["vocabulary"])
        if data.get("pretrained") is not None:
            values["pretrained"] = PretrainedClaim.from_json(data["pretrained"])
        if data.get("group_privacy") is not None:
            group = dict(data["group_privacy"])
            if isinstance(group.get("dp_sgd_epsilon"), str):  # write_json stores inf as "inf".
                group["dp_sgd_epsilon"] = float(group["dp_sgd_epsilon"])
            values["group_privacy"] = GroupClaim(**group)
        if data.get("privacy_unit") is not None:
            unit = dict(data["privacy_unit"])
            if isinstance(unit.get("epsilon_per_group"), str):  # write_json stores inf as "inf".
                unit["epsilon_per_group"] = float(unit["epsilon_per_group"])
            values["privacy_unit"] = UnitClaim(**unit)
        if data.get("joint_dp_sgd") is not None:
            joint = dict(data["joint_dp_sgd"])
            for key in ("epsilon", "delta", "other_epsilon", "other_delta"):
                joint[key] = float(joint[key])  # write_json stores inf as "inf".
            values["joint_dp_sgd"] = JointDpSgd(**joint)
        if data.get("ledger") is not None:
            values["ledger"] = ledger_report.Composition.from_json(data["ledger"])
        values["assumed_public"] = tuple(data["assumed_public"])
        for field in dataclasses.fields(cls):  # write_json stores inf as "inf".
            if "float" in str(field.type) and isinstance(values.get(field.name), str):
                values[field.name] = float(values[field.name])
        return cls(**values)


def vocabulary_epsilon(vocabulary) -> float:
    """The vocabulary's ε (0 when it spent none; the larger of its two bounds when DP)."""
    epsilon = vocabulary.epsilon or 0.0
    analytic = (vocabulary.details or {}).get("epsilon_analytic")
    if analytic is not None:  # The classical formula can understate ε above 1.
        epsilon = max(epsilon, analytic)
    return epsilon


def epsilon_before_training(vocabulary, pretrained: PretrainedClaim | None = None) -> float:
    """ε spent before the first lot: the vocabulary's, plus a composed pretrained export's.

    inf when the vocabulary was learnt from private data without DP.
    """
    if not vocabulary.covered_by_guarantee:
        return math.inf
    return vocabulary_epsilon(vocabulary) + (pretrained.composed_epsilon if pretrained else 0.0)


def total_epsilon_after(
    plan: privacy.PrivacyPlan,
    steps_done: int,
    vocabulary,
    pretrained: PretrainedClaim | None = None,
) -> float:
    """The run's total ε after `steps_done` lots: DP-SGD's then plus `epsilon_before_training`.

    With a pretrained export under parallel composition (`PretrainedClaim.parallel`),
    the larger of that and the export's own total.
    """
    epsilon = plan.epsilon_after(steps_done) + epsilon_before_training(vocabulary, pretrained)
    if pretrained is not None and pretrained.parallel:
        return parallel_total(pretrained, epsilon, 0.0)[0]
    return epsilon


def privacy_report(
    plan: privacy.PrivacyPlan,
    steps_done: int,
    vocabulary,
    *,
    validation_is_private: bool = False,
    pretrained: PretrainedClaim | None = None,
    example: str | None = None,
) -> PrivacyReport:
    """The ε the run can defend, by which bound, composed with the vocabulary's.

    Args:
      plan: the run's privacy plan (σ, q, T, the accountant).
      steps_done: lots trained so far.
      vocabulary: the `tokenizers.VocabularyRecord` of the run's vocabulary.
      validation_is_private: whether validation pairs were carved from train.
      pretrained: what the starting model adds (`pretrained_privacy.pretrained_claim`);
        None when trained from scratch.
      example: what one training example is (`data.text_objective.example_unit`), or None.
    """
    sgd_epsilon = plan.epsilon_after(plan.num_steps)
    optional: dict[str, Any] = {}
    if pretrained is not None:
        optional["pretrained"] = pretrained
    if plan.private and steps_done < plan.num_steps:
        optional["epsilon_at_realised_stop_NOT_A_GUARANTEE"] = plan.epsilon_after(steps_done)
    poisson_figure = plan.poisson_figure_not_a_guarantee(plan.num_steps)
    if poisson_figure is not None:
        optional["epsilon_if_poisson_NOT_A_GUARANTEE"] = poisson_figure
    if (group := group_claim(plan, plan.num_steps)) is not None:
        optional["group_privacy"] = group
    if (unit := unit_claim(plan)) is not None:
        optional["privacy_unit"] = unit
    if plan.private and not plan.seed_is_secret:
        # What the run would claim with a secret seed: for tests to check the accounting.
        as_if_secret = dataclasses.replace(plan, seed_is_secret=True)
        optional["epsilon_if_seed_were_secret_NOT_A_GUARANTEE"] = as_if_secret.epsilon_after(
            plan.num_steps
        )
        total_epsilon = math.inf
        composition = (
            f"{config_lib.FIXED_SEED_NOTE} (config.{config_lib.FIXED_SEED_SWITCH}: tests only)"
        )
    elif not vocabulary.covered_by_guarantee:
        total_epsilon = math.inf
        composition = "vocabulary learnt from private data without DP: no guarantee"
    else:
        # This run's own total; a parallel export's max is taken below.
        total_epsilon = plan.epsilon_after(plan.num_steps) + epsilon_before_training(
            vocabulary, pretrained
        )
        optional["total_delta"] = plan.delta + (vocabulary.delta or 0.0)
        composition = "basic composition (ε and δ add) of DP-SGD and the vocabulary"
        if pretrained is not None and pretrained.ledger is not None:
            spent = vocabulary_epsilon(vocabulary), vocabulary.delta or 0.0
            total = ledger_report.composition(plan, spent, pretrained)
            ours = total_epsilon, optional["total_delta"]
            optional["ledger"] = total
            total_epsilon, optional["total_delta"] = total.epsilon, total.delta
            composition = ledger_report.describe(total, pretrained, ours, adjacency(plan), example)
        elif pretrained is not None and pretrained.composed:
            optional["total_delta"] += pretrained.composed_delta
            composition = (
                "basic composition (ε and δ add) of DP-SGD, the vocabulary and the pretrained "
                "export's own total (its training data may overlap this run's)"
            )
            if pretrained.adjacency != adjacency(plan):
                composition += mixed_adjacency_note(pretrained.adjacency, adjacency(plan))
            joint = joint_dp_sgd(plan, pretrained, adjacency(plan))
            if joint is not None:
                optional["joint_dp_sgd"] = joint
                joint_total = joint.epsilon + joint.other_epsilon + vocabulary_epsilon(vocabulary)
                if joint_total < total_epsilon:
                    total_epsilon, composition = joint_total, JOINT_NOTE.format(joint.accountant)
            composition += units_note(pretrained.record, example)
        elif pretrained is not None and pretrained.parallel:
            ours = total_epsilon, optional["total_delta"]
            total_epsilon, optional["total_delta"] = parallel_total(pretrained, *ours)
            theirs = math.inf if pretrained.epsilon is None else pretrained.epsilon
            composition = PARALLEL_COMPOSITION.format(theirs, pretrained.delta or 0.0, *ours)
            composition += parallel_units_note(pretrained.record, example)
        elif (
            pretrained is not None
            and pretrained.dpnmt_export
            and pretrained.declared_disjoint
            and (pretrained.record or {}).get("private") is not True
        ):
            composition += unguarded_export_note(pretrained.record)
    if example is not None:
        optional["example"] = example
    return PrivacyReport(
        private=plan.private,
        bound=plan.bound,
        sampling=plan.sampling,
        adjacency=adjacency(plan),
        noise_multiplier=plan.noise_multiplier,
        l2_clip=plan.l2_clip,
        noise_mode=plan.noise_mode,
        expected_lot_size=plan.expected_lot_size,
        dataset_size=plan.dataset_size,
        sampling_rate=plan.sampling_rate,
        assumed_public=assumed_public(plan),
        steps_done=steps_done,
        steps_planned=plan.num_steps,
        dp_sgd_epsilon=sgd_epsilon,
        dp_sgd_epsilon_is_at=DP_SGD_EPSILON_IS_AT,
        dp_sgd_delta=plan.delta,
        validation_is_private=validation_is_private,
        vocabulary=VocabularyClaim(
            kind=vocabulary.kind,
            covered_by_guarantee=vocabulary.covered_by_guarantee,
            epsilon=vocabulary.epsilon,
            delta=vocabulary.delta,
            note=vocabulary.note,
        ),
        total_epsilon=total_epsilon,
        composition=composition,
        **optional,
    )
