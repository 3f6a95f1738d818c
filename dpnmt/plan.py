r"""Plans a run's privacy before training: σ, steps, q and ε for both samplings.

    python -m dpnmt.plan --n=29000 --lot=1024 --epochs=20 --epsilon=8
    python -m dpnmt.plan --n=29000 --lot=1024 --epochs=20 --sigma=1.1 --delta=1e-6

Give N (training pairs after preprocessing: `python -m dpnmt.data.inspect`
counts them), L (`train.expected_lot_size`), the epochs and either a target ε
(σ is calibrated) or σ (ε is computed). It prints the plan a run with those
inputs makes (`dpnmt.privacy.plan_both_samplings`, the trainer's own
`plan_privacy` and checks), for Poisson lots (amplified by sampling) and for
shuffled lots (composition over epochs, no amplification). DP-SGD's ε only: a
DP-SentencePiece vocabulary or a private pretrained model adds its own.
An impossible target is one line naming the fix.
"""

from absl import app, flags

from dpnmt import cli
from dpnmt.config import PrivacyConfig, TrainConfig

_DEFAULTS = PrivacyConfig()
_N = flags.DEFINE_integer("n", None, "N: training pairs after preprocessing.")
_LOT = flags.DEFINE_integer("lot", TrainConfig.expected_lot_size, "L: train.expected_lot_size.")
_EPOCHS = flags.DEFINE_integer("epochs", TrainConfig.num_epochs, "train.num_epochs.")
_EPSILON = flags.DEFINE_float("epsilon", None, "Target ε (dp.target_epsilon): σ is calibrated.")
_SIGMA = flags.DEFINE_float("sigma", None, "Or σ (dp.noise_multiplier): ε is computed.")
_DELTA = flags.DEFINE_float("delta", _DEFAULTS.delta, "δ of DP-SGD (dp.delta).")
_ACCOUNTANT = flags.DEFINE_enum(
    "accountant", _DEFAULTS.accountant, ["pld", "rdp"], "dp.accountant."
)


def main(argv):
    """Prints both plans."""
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    from dpnmt import privacy  # noqa: PLC0415 - heavy (JAX, dp_accounting): not for --help.
    from dpnmt.errors import ConfigError, raise_problems  # noqa: PLC0415

    if (_EPSILON.value is None) == (_SIGMA.value is None):
        raise ConfigError("Give exactly one of --epsilon (σ is calibrated) or --sigma.")
    dp = PrivacyConfig(
        target_epsilon=_EPSILON.value,
        noise_multiplier=_SIGMA.value,
        delta=_DELTA.value,
        accountant=_ACCOUNTANT.value,
    )
    train = TrainConfig(expected_lot_size=_LOT.value, num_epochs=_EPOCHS.value)
    raise_problems([*dp.problems(), *train.problems()])
    poisson, shuffled = privacy.plan_both_samplings(dp, train, _N.value)
    epochs = f"{_EPOCHS.value} epoch{'' if _EPOCHS.value == 1 else 's'}"
    print(f"N={_N.value:,}, L={_LOT.value:,}, {epochs}, {_ACCOUNTANT.value}")
    for plan in (poisson, shuffled):
        print("\n".join(privacy.describe_plan(plan)))


if __name__ == "__main__":
    flags.mark_flags_as_required(["n"])
    cli.run(main)
