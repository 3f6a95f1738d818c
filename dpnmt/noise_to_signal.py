r"""How loud a DP run's noise was against its clipped gradients (public validation data).

    python -m dpnmt.noise_to_signal --workdir=runs/m30k/eps8-poisson/seed0

Prints, at the run's initial and trained parameters, the validation loss, the
median per-example gradient norm, the share clipped, the norm of the mean
clipped gradient and the noise norm σC√d/L against it; writes
`noise_to_signal.json` to the workdir (to `private/` when the validation split
was carved from train). Logic: `dpnmt.evaluation.noise_to_signal`.
"""

from absl import app, flags

from dpnmt import cli
from dpnmt.evaluation import noise_to_signal

_WORKDIR = flags.DEFINE_string("workdir", None, "A trained run's folder.")
_MAX_EXAMPLES = flags.DEFINE_integer(
    "max_examples", None, "Validation examples averaged (default: the lot size L)."
)


def main(argv):
    """Measures the run and prints its table."""
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    cli.setup_logging()
    path, result = noise_to_signal.write_run(_WORKDIR.value, _MAX_EXAMPLES.value)
    print(noise_to_signal.format_table(result))
    print(f"Wrote {path}")


if __name__ == "__main__":
    # Here, not at import: importing this module (tests, other apps) must not
    # make these flags required for every absl app in the process.
    flags.mark_flags_as_required(["workdir"])
    cli.run(main)
