"""`RunConfig`: the whole run's configuration, parsed from a ConfigDict at the edge.

`RunConfig.parse(config_dict)` builds every section, then raises every
problem at once (unknown fields with the closest known one, each section's
`problems()`, and the rules across sections) as one `ConfigError`. Fields a
config.json from an older version lacks take their defaults, so old runs load.
"""

import dataclasses
import math
import typing
from typing import Any

import ml_collections

from dpnmt.config import sections
from dpnmt.config.fields import lot_size, range_problems, unknown_field_message, whole_at_least
from dpnmt.errors import ConfigError, raise_problems

FIXED_SEED_SWITCH = "testing_only_fixed_noise_seed_NO_PRIVACY"
EVALUATIONS_PER_RUN = 10  # train.eval_every_steps=None: at most this many a run...
# ...and at most one per this many times data.max_eval_examples trained examples.
# Measured on Multi30K (README, "Where a run's time goes"): validating (decoding
# and scoring K pairs) costs about as long as training on K examples, so
# validations then take at most ~1/10 of the training time.
EVAL_EXAMPLE_RATIO = 10


def _frozen(value: Any) -> Any:
    """Lists (JSON, ConfigDict tuples) as tuples, so a section stays hashable."""
    return tuple(value) if isinstance(value, (list, tuple)) else value


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Every setting of a run: the public seed, the secret seed's source, six sections."""

    data: sections.DataConfig = sections.DataConfig()
    tokenizer: sections.TokenizerConfig = sections.TokenizerConfig()
    model: sections.ModelConfig = sections.ModelConfig()
    dp: sections.PrivacyConfig = sections.PrivacyConfig()
    train: sections.TrainConfig = sections.TrainConfig()
    eval: sections.EvalConfig = sections.EvalConfig()
    variant: str = ""
    seed: int = 0
    noise_seed: int | None = None  # Never published (config_lib.published_config).
    testing_only_fixed_noise_seed_NO_PRIVACY: bool = False

    @property
    def privacy(self) -> sections.PrivacyConfig:
        """The `dp` section."""
        return self.dp

    @classmethod
    def fields(cls) -> list[str]:
        """Every dotted field ("dp.delta"), as in the ConfigDict."""
        out = []
        for field in dataclasses.fields(cls):
            section = _section_type(field.name)
            if section is None:
                out.append(field.name)
            else:
                out += [f"{field.name}.{f.name}" for f in dataclasses.fields(section)]
        return sorted(out)

    @classmethod
    def build(cls, config: ml_collections.ConfigDict | dict) -> tuple["RunConfig", list[str]]:
        """(the config as sections, a line per field this version does not know).

        Fields the ConfigDict lacks (a config.json from before they existed)
        take their defaults. Nothing is checked beyond the field names.
        """
        tree = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else config
        known, unknown, values = cls.fields(), [], {}
        for key, value in tree.items():
            section = _section_type(key)
            if section is None and key not in {f.name for f in dataclasses.fields(cls)}:
                unknown.append(unknown_field_message(key, known))
            elif section is None:
                values[key] = _frozen(value)
            elif not isinstance(value, dict):
                unknown.append(f"{key}={value!r} must be a group of fields ({key}.<field>).")
            else:
                names = {f.name for f in dataclasses.fields(section)}
                unknown += [
                    unknown_field_message(f"{key}.{name}", known)
                    for name in value
                    if name not in names
                ]
                values[key] = section(
                    **{name: _frozen(v) for name, v in value.items() if name in names}
                )
        return cls(**values), unknown

    @classmethod
    def of(cls, config: "RunConfig | ml_collections.ConfigDict | dict") -> "RunConfig":
        """`config` as a RunConfig, unchecked (fields this version does not know ignored).

        For records already checked when written (a run's config.json) and
        tests; a user's config goes through `parse` (or the apps'
        `preflight.read_config`), which refuses a misspelt field.
        """
        return config if isinstance(config, RunConfig) else cls.build(config)[0]

    @classmethod
    def parse(cls, config: ml_collections.ConfigDict | dict) -> "RunConfig":
        """The config as sections, checked: every problem raised at once.

        Raises:
          ConfigError: unknown fields (with the closest known one) and every
            problem of `problems()`, one per line.
        """
        run, unknown = cls.build(config)
        raise_problems([*unknown, *run.problems()])
        return run

    def problems(self) -> list[str]:
        """Every problem the config alone shows (no file system, corpus or devices)."""
        problems = []
        for field in dataclasses.fields(self):
            if _section_type(field.name) is not None:
                problems += getattr(self, field.name).problems()
        return (
            problems
            + self._tokenizer_problems()
            + self.noise_seed_problems()
            + self._group_unit_problems()
        )

    def _group_unit_problems(self) -> list[str]:
        """`dp.unit="group"`: L_groups, a per-pair DP vocabulary, explicit length buckets.

        `dp.group_lot_size` (like `dp.group_cap`) is read only with `dp.unit="group"`:
        configs state it for `--config.dp.unit=group`, and a per-pair run ignores it.
        """
        if self.dp.unit != "group":
            return []
        problems = range_problems(
            "dp.group_lot_size",
            self.dp.group_lot_size,
            whole_at_least(1),
            "an int >= 1: L_groups, the expected groups per lot (q = L_groups / N_groups)",
        )
        try:
            kind = self.tokenizer_kind
        except ConfigError:
            kind = None  # Named by the tokenizer problems.
        if kind == "dp_sentencepiece":
            problems.append(
                "dp.unit='group' with tokenizer.kind='dp_sentencepiece': DP-SentencePiece's ε "
                "is per sentence pair, and a group adds all its pairs to the vocabulary's "
                "counts, so the run's total ε per group would not be the one reported. Use a "
                "public vocabulary: tokenizer.kind='pretrained' (a pretrained model) or "
                "'sentencepiece_public' with tokenizer.public_corpora."
            )
        buckets = str(self.data.length_buckets).strip().lower()
        if buckets not in ("auto", "none", ""):
            problems.append(
                f"data.length_buckets={self.data.length_buckets!r} with dp.unit='group': "
                "micro-batches hold whole groups at the max lengths; set "
                "data.length_buckets='auto' or 'none'."
            )
        return problems

    def noise_seed_problems(self) -> list[str]:
        """A fixed `noise_seed` in a private run, unless the test-only switch is on.

        Each line names `noise_seed` and the fix; the seed's value is not
        repeated (logs may be published).
        """
        fixed, switch = self.noise_seed is not None, self.testing_only_fixed_noise_seed_NO_PRIVACY
        if switch and not fixed:
            return [
                f"config.{FIXED_SEED_SWITCH}=True needs config.noise_seed; drop the switch for a "
                "run with a secret seed."
            ]
        if fixed and self.dp.enabled and not switch:
            return [
                "config.noise_seed is set for a private run: anyone holding it rebuilds every "
                "noise draw, lot and the vocabulary noise (true ε = ∞). Drop --config.noise_seed "
                f"(a 128-bit seed is drawn from the OS), or for tests only set config."
                f"{FIXED_SEED_SWITCH}=True (every report then says ε = ∞)."
            ]
        return []

    @property
    def tokenizer_kind(self) -> str:
        """`tokenizer.kind` resolved: "auto" is the model's own tokenizer for a pretrained model.

        Raises:
          ConfigError: a learnt vocabulary asked for a pretrained model.
        """
        kind, name = self.tokenizer.kind, self.model.name_or_path
        if kind == "auto":
            return "pretrained" if name is not None else "dp_sentencepiece"
        if name is not None and kind != "pretrained":
            raise ConfigError(
                f"tokenizer.kind={kind!r} with model.name_or_path={name!r}: a pretrained model's "
                "embedding rows belong to its own vocabulary, so a new vocabulary would give them "
                "other meanings. Use tokenizer.kind=pretrained (or auto), or unset "
                "model.name_or_path to train from scratch with your own vocabulary."
            )
        return kind

    def _tokenizer_problems(self) -> list[str]:
        if self.tokenizer.kind not in self.tokenizer.choices()["kind"]:
            return []  # Named by the choice check.
        problems = []
        if self.model.name_or_path is None and self.tokenizer.kind == "pretrained":
            problems.append(
                "tokenizer.kind='pretrained' needs model.name_or_path (a pretrained model); "
                "set it, or use tokenizer.kind='dp_sentencepiece' for a model from scratch."
            )
        try:
            kind = self.tokenizer_kind
        except ConfigError as error:
            return [*problems, str(error)]
        if kind == "dp_sentencepiece":
            problems += self.tokenizer.dp_problems()
        tokenizer = self.tokenizer
        if kind == "sentencepiece_public" and not tokenizer.public_text_paths:
            if not tokenizer.public_corpora:
                problems.append(
                    "tokenizer.kind='sentencepiece_public' needs tokenizer.public_corpora (public "
                    "corpora, e.g. 'files:tatoeba_de_en,detok:wmt16') or "
                    "tokenizer.public_text_paths (public text files) to learn the vocabulary from."
                )
        if kind == "sentencepiece_private" and not tokenizer.private_data_ok:
            problems.append(
                "tokenizer.kind='sentencepiece_private' learns the vocabulary from private data "
                "WITHOUT DP: set tokenizer.private_data_ok=True to accept that, or use "
                "dp_sentencepiece."
            )
        return problems

    @property
    def fixed_noise_seed(self) -> bool:
        """True when the run's noise seed is fixed by the config (no guarantee)."""
        return self.noise_seed is not None

    def eval_every_steps(self, num_steps: int) -> int:
        """`train.eval_every_steps` resolved for a run of `num_steps` lots (0: only at the end).

        Unset (None): every max(ceil(T / EVALUATIONS_PER_RUN), ceil(EVAL_EXAMPLE_RATIO *
        data.max_eval_examples / L)) lots: a long run validates about ten times, a
        short one rarely enough that validation does not dominate it. With
        `dp.unit="group"`, L here is L_groups x k (`fields.lot_size`, `dp.group_cap`):
        the most examples a lot of L_groups groups holds on average.
        """
        every = self.train.eval_every_steps
        if every is not None:
            return every
        per_run = math.ceil(num_steps / EVALUATIONS_PER_RUN)
        examples_per_lot, _ = lot_size(self.dp, self.train)
        if self.dp.unit == "group" and self.dp.group_cap:
            examples_per_lot *= self.dp.group_cap
        eval_examples = EVAL_EXAMPLE_RATIO * self.data.max_eval_examples
        per_examples = math.ceil(eval_examples / examples_per_lot)
        return max(1, per_run, per_examples)

    def to_dict(self) -> dict:
        """The nested dict a ConfigDict (and config.json) holds; tuples stay tuples."""
        return dataclasses.asdict(self)


def _section_type(name: str) -> type[sections.Section] | None:
    hint = typing.get_type_hints(RunConfig).get(name)
    return hint if isinstance(hint, type) and issubclass(hint, sections.Section) else None
