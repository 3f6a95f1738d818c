r"""How loud a DP run's noise is against its clipped gradients (public validation data).

    python -m dpnmt.noise_to_signal --workdir=runs/m30k/eps8-poisson/seed0
    python -m dpnmt.noise_to_signal --config=configs/multi30k_from_public_lora.py:eps8
                                                # before training: nothing spent

With `--workdir`: prints, at the run's initial and trained parameters, the
validation loss, the median per-example gradient norm, the share clipped, the
norm of the mean clipped gradient and the noise norm σC√d/L against it; writes
`noise_to_signal.json` to the workdir (to `private/` when the validation split
was carved from train). With `--config` (a private, per-example config): after
every check training makes before it spends privacy, the same table at the
parameters training would start from, σ from the config's plan (N counted as
training counts it, assumed public), on the public validation split (refused
when validation would be carved from train); for choosing what to train (LoRA
or the whole model, L, epochs) before any privacy is spent; writes nothing.
Logic: `dpnmt.evaluation.noise_to_signal`.
"""

from absl import app, flags
from ml_collections import config_flags

from dpnmt import cli

_WORKDIR = flags.DEFINE_string("workdir", None, "A trained run's folder.")
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Or a private config: measured at its start, before training."
)
_MAX_EXAMPLES = flags.DEFINE_integer(
    "max_examples", None, "Validation examples averaged (default: the lot size L)."
)


def main(argv):
    """Measures the run (or the config's start) and prints its table."""
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if (_WORKDIR.value is None) == (_CONFIG.value is None):
        cli.fail("give exactly one of --workdir (a trained DP run) or --config (its start).")
    cli.setup_logging()
    from dpnmt.config import RunConfig  # noqa: PLC0415 - heavy: not for --help.
    from dpnmt.evaluation import noise_to_signal  # noqa: PLC0415

    if _CONFIG.value is not None:
        result = noise_to_signal.measure_start(RunConfig.of(_CONFIG.value), _MAX_EXAMPLES.value)
        print(noise_to_signal.format_table(result))
        return
    path, result = noise_to_signal.write_run(_WORKDIR.value, _MAX_EXAMPLES.value)
    print(noise_to_signal.format_table(result))
    print(f"Wrote {path}")


if __name__ == "__main__":
    cli.run(main)
