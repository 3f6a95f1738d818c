r"""Plans a run's privacy before training: σ, steps, q and ε for both samplings.

    python -m dpnmt.plan --n=29000 --lot=1024 --epochs=20 --epsilon=8
    python -m dpnmt.plan --n=29000 --lot=1024 --epochs=20 --sigma=1.1 --delta=1e-6
    python -m dpnmt.plan --config=configs/multi30k.py:eps8     # N counted from its corpus
    python -m dpnmt.plan --config=configs/files.py:eps8 --config.data.corpus=files:my_data

Give N (training pairs after preprocessing: `python -m dpnmt.data.inspect`
counts them), L (`train.expected_lot_size`), the epochs and either a target ε
(σ is calibrated) or σ (ε is computed); or give `--config` and its run's
`dp` and `train` sections are read and N is counted from its corpus (the
flags given override them). It prints the plan a run with those
inputs makes (`dpnmt.privacy.plan_both_samplings`, the trainer's own
`plan_privacy` and checks), for Poisson lots (amplified by sampling) and for
shuffled lots (composition over epochs, no amplification). DP-SGD's ε only: a
DP-SentencePiece vocabulary or a private pretrained model adds its own.
An impossible target is one line naming the fix, in the flags' words.
From Python: `dpnmt.planning.plan`, `dpnmt.planning.get_noise_multiplier`.
"""

import dataclasses

from absl import app, flags
from ml_collections import config_flags

from dpnmt import cli
from dpnmt.config import PrivacyConfig, TrainConfig
from dpnmt.errors import ConfigError

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Or plan this config's run (N from its corpus), e.g. configs/multi30k.py:eps8."
)
_N = flags.DEFINE_integer("n", None, "N: training pairs after preprocessing (default: counted).")
_LOT = flags.DEFINE_integer("lot", None, "L: train.expected_lot_size (default: the config's).")
_EPOCHS = flags.DEFINE_integer("epochs", None, "train.num_epochs (default: the config's).")
_EPSILON = flags.DEFINE_float("epsilon", None, "Target ε (dp.target_epsilon): σ is calibrated.")
_SIGMA = flags.DEFINE_float("sigma", None, "Or σ (dp.noise_multiplier): ε is computed.")
_DELTA = flags.DEFINE_float("delta", None, "δ of DP-SGD (dp.delta; default: the config's, 1e-8).")
_ACCOUNTANT = flags.DEFINE_enum("accountant", None, ["pld", "rdp"], "dp.accountant (pld).")
# Config fields as this app's flags name them: its errors speak the flags' language.
_FLAG_OF_FIELD = {
    "train.expected_lot_size": "--lot",
    "train.num_epochs": "--epochs",
    "dp.target_epsilon": "--epsilon",
    "dp.noise_multiplier": "--sigma",
    "dp.delta": "--delta",
    "dp.accountant": "--accountant",
}


def _in_flag_words(message: str) -> str:
    for field, flag in _FLAG_OF_FIELD.items():
        message = message.replace(field, flag)
    return message


def _sections() -> tuple[PrivacyConfig, TrainConfig, int]:
    """(dp, train, N): the config's (N counted from its corpus) or the defaults, then the flags."""
    if _CONFIG.value is None:
        if _N.value is None:
            raise ConfigError(
                "Give --n (training pairs after preprocessing), or --config=FILE:VARIANT to "
                "plan that config's run with N counted from its corpus."
            )
        dp, train, n = PrivacyConfig(), TrainConfig(), _N.value
    else:
        from dpnmt.data import checks  # noqa: PLC0415 - heavy: not for --help.
        from dpnmt.training import pieces, preflight  # noqa: PLC0415

        run = preflight.read_config(_CONFIG.value)
        if not run.dp.enabled or run.dp.unit != "example":
            kind = "non-private" if not run.dp.enabled else "a dp.unit=group run"
            raise ConfigError(
                f"--config's run is {kind}: dpnmt.plan plans per-pair DP runs "
                "(dpnmt.train logs a group run's plan before training)."
            )
        dp, train = run.dp, run.train
        n = _N.value or checks.kept_pairs(pieces.load_corpus(run.data)["train"], run.data.pair)
    if (_EPSILON.value is None) != (_SIGMA.value is None):  # A flag's target replaces the config's.
        dp = dataclasses.replace(dp, target_epsilon=_EPSILON.value, noise_multiplier=_SIGMA.value)
    elif _EPSILON.value is not None:
        raise ConfigError("Give exactly one of --epsilon (σ is calibrated) or --sigma.")
    given = {"delta": _DELTA.value, "accountant": _ACCOUNTANT.value}
    dp = dataclasses.replace(dp, **{k: v for k, v in given.items() if v is not None})
    given = {"expected_lot_size": _LOT.value, "num_epochs": _EPOCHS.value}
    train = dataclasses.replace(train, **{k: v for k, v in given.items() if v is not None})
    return dp, train, n


def main(argv):
    """Prints both plans."""
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    from dpnmt import privacy  # noqa: PLC0415 - heavy (JAX, dp_accounting): not for --help.
    from dpnmt.errors import raise_problems  # noqa: PLC0415

    dp, train, n = _sections()
    if dp.target_epsilon is None and dp.noise_multiplier is None:
        raise ConfigError("Give exactly one of --epsilon (σ is calibrated) or --sigma.")
    try:
        raise_problems([*dp.problems(), *train.problems()])
        poisson, shuffled = privacy.plan_both_samplings(dp, train, n)
    except ConfigError as error:
        if _CONFIG.value is not None:
            raise
        raise ConfigError(_in_flag_words(str(error))) from None
    epochs = f"{train.num_epochs} epoch{'' if train.num_epochs == 1 else 's'}"
    print(f"N={n:,}, L={train.expected_lot_size:,}, {epochs}, {dp.accountant}")
    for plan in (poisson, shuffled):
        print("\n".join(privacy.describe_plan(plan)))


if __name__ == "__main__":
    cli.run(main)
