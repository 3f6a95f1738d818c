"""The pieces of a training run, as typed records built once per session by `build_run`.

`RunPieces` groups them by who reads them: the workdir (`RunFiles`), the
secret seed (`RunSecrets`), the data (`RunData`), what the privacy report
reads (`RunPrivacy`), the model (`RunModel`) and the DP lot step with its
sampler (`RunStep`).
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import datasets
import jax
import optax
import orbax.checkpoint as ocp

from dpnmt import privacy
from dpnmt.config import RunConfig
from dpnmt.data import preprocess, tokenizers
from dpnmt.training import steps
from dpnmt.training.privacy_report import PretrainedClaim
from dpnmt.training.run_dir import RunDir


@dataclasses.dataclass(frozen=True)
class RunFiles:
    """The run's folder and checkpoints.

    Attributes:
      run_dir: the run's folder.
      manager: the checkpoint manager over `run_dir`'s checkpoints/.
      resuming: whether a checkpoint exists (the vocabulary was reloaded).
      run_id: the random nonce (independent of the seed, published in each
        checkpoint) that binds checkpoints to `private/`.
    """

    run_dir: RunDir
    manager: ocp.CheckpointManager
    resuming: bool
    run_id: int


@dataclasses.dataclass(frozen=True)
class RunSecrets:
    """SECRET: never log, publish or checkpoint any of it.

    Attributes:
      noise_seed: the run's secret seed (from `private/`): noise, dropout,
        sampler and vocabulary seeds derive from it (`run_dir.derived_seed`).
    """

    noise_seed: int

    def __repr__(self) -> str:
        return "RunSecrets(<secret>)"


@dataclasses.dataclass(frozen=True)
class RunData:
    """The corpus and its tokenized forms.

    Attributes:
      corpus: the loaded corpus (text), after `corpus_transform`.
      tokenizer: the run's tokenizer.
      tokenized: the tokenized splits (all but train when train is tokenized per lot).
      train_examples: the N training examples (a torch Dataset).
      split_stats: split -> `preprocess.SplitStats` (exact counts; private ones stay private).
    """

    corpus: datasets.DatasetDict
    tokenizer: tokenizers.Tokenizer
    tokenized: datasets.DatasetDict
    train_examples: Any
    split_stats: dict[str, preprocess.SplitStats]


@dataclasses.dataclass(frozen=True)
class RunPrivacy:
    """What the privacy report (`privacy_report.privacy_report`) reads.

    Attributes:
      plan: the privacy plan (σ, q = L/N, T) the sampler, step and accountant read.
      vocabulary: how the vocabulary was made (`tokenizers.VocabularyRecord`).
      pretrained: what the starting model adds to ε (None: from scratch).
      validation_is_private: whether validation was carved from the private train split.
    """

    plan: privacy.PrivacyPlan
    vocabulary: tokenizers.VocabularyRecord
    pretrained: PretrainedClaim | None
    validation_is_private: bool

    @property
    def private_splits(self) -> set[str]:
        """Splits whose exact counts and scores are private data."""
        return {"train", "validation"} if self.validation_is_private else {"train"}


@dataclasses.dataclass(frozen=True)
class RunModel:
    """The model, its initial parameters and its per-example losses.

    Attributes:
      model, model_config: the flax module and its config.
      root_key: PRNG key from the public `config.seed` (init; dropout keys are secret).
      trainable, frozen: the initial parameters, split by `model.trainable`.
      loss_fn: `(params, example, dropout_key) -> loss` of one example (training:
        label-smoothed when `train.label_smoothing` > 0).
      eval_loss_fn: the same signature, plain cross-entropy (validation loss);
        None: `loss_fn`.
    """

    model: Any
    model_config: Any
    root_key: jax.Array
    trainable: Any
    frozen: Any
    loss_fn: Callable
    eval_loss_fn: Callable | None = None


@dataclasses.dataclass(frozen=True)
class RunStep:
    """The DP lot step, its optimizer and the lot sampler.

    Attributes:
      tx, opt_state: the optimizer and its initial state.
      mesh: the data mesh the lot step runs on.
      step_fns: the DP lot step (`steps.LotStep`).
      lots: the lot sampler over example indices (Poisson or shuffled).
    """

    tx: optax.GradientTransformation
    opt_state: Any
    mesh: jax.sharding.Mesh
    step_fns: steps.LotStep
    lots: Any


@dataclasses.dataclass(frozen=True)
class RunPieces:
    """Everything the training loop needs, built once per session by `build_run`.

    Attributes:
      config: the resolved run config.
      files, secrets, data, privacy, model, step: the records above.
    """

    config: RunConfig
    files: RunFiles
    secrets: RunSecrets
    data: RunData
    privacy: RunPrivacy
    model: RunModel
    step: RunStep
