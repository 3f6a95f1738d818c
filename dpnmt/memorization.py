r"""Measures memorization: duplicated training texts, then EM / TA / MED of continuations.

    python -m dpnmt.memorization --config=configs/pretrain_mono.py:prefix,nonprivate \
        --duplicates=16 --repeats=10 --workdir=runs/memorization_prefix_np
    python -m dpnmt.memorization --config=configs/pretrain_mono.py:prefix,eps8 \
        --duplicates=16 --repeats=10 --workdir=runs/memorization_prefix_eps8

Trains the config with --duplicates training texts (chosen at random) repeated
--repeats times each, then prompts the model with part of each text of three
sets: those duplicated texts, --unique training texts seen once, and
--held_out validation texts. A prefix-LM model gets the first half of the
text's tokens, a span-corruption model the corrupted text, a translation model
the source; exact match, token accuracy and normalised edit distance of the
greedy output against the rest (Ponomareva et al. 2022, Table 3) go to
`memorization.json` (set-level rates; a private run's rates on its training
text only with --training_text_is_public). Which texts were chosen and every
per-text score stay in `<workdir>/private/`. With --duplicates=0 it scores a
run already trained in --workdir as it is. Rerunning resumes with the same
texts. Logic: `dpnmt.auditing.memorization`.
"""

from absl import app, flags
from ml_collections import config_flags

from dpnmt import cli

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "The run's config, e.g. configs/pretrain_mono.py:prefix,nonprivate.",
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output folder (a run workdir); reruns resume.")
_DUPLICATES = flags.DEFINE_integer("duplicates", 16, "D training texts to repeat (0: none).")
_REPEATS = flags.DEFINE_integer("repeats", 10, "Copies of each duplicated text in train (R).")
_UNIQUE = flags.DEFINE_integer("unique", 64, "Training texts seen once to score.")
_HELD_OUT = flags.DEFINE_integer("held_out", 64, "Validation texts to score.")
_PREFIX_PROMPT = flags.DEFINE_enum(
    "prefix_prompt",
    "half",
    ["half", "training"],
    "A prefix-LM model's prompt: the first half of a text, or its split as the run drew it.",
)
_PUBLIC = flags.DEFINE_boolean(
    "training_text_is_public",
    False,
    "The training text is public: a private run's rates on it may be published.",
)


def main(argv):
    """Runs `auditing.memorization.run_memorization` with the flags' config and options."""
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    cli.setup_logging()
    # Here, not at the top: --help and flag errors answer before JAX and torch load.
    from dpnmt import distributed  # noqa: PLC0415
    from dpnmt.auditing import memorization  # noqa: PLC0415
    from dpnmt.errors import raise_problems  # noqa: PLC0415
    from dpnmt.training import preflight  # noqa: PLC0415

    # Every process would draw its own texts and write the same workdir.
    raise_problems(distributed.single_process_problems("dpnmt.memorization"))
    config = preflight.read_config(_CONFIG.value, _WORKDIR.value)  # The one ConfigDict read.
    options = memorization.MemorizationOptions(
        duplicates=_DUPLICATES.value,
        repeats=_REPEATS.value,
        unique=_UNIQUE.value,
        held_out=_HELD_OUT.value,
        training_text_is_public=_PUBLIC.value,
        prefix_prompt=_PREFIX_PROMPT.value,
    )
    # Before the texts are chosen and saved: the trainer checks the rest.
    memorization.check_options(options)
    preflight.check_static(config, _WORKDIR.value)
    memorization.run_memorization(config, _WORKDIR.value, options)


if __name__ == "__main__":
    # Here, not at import: importing this module (tests, other apps) must not
    # make these flags required for every absl app in the process.
    flags.mark_flags_as_required(["config", "workdir"])
    cli.run(main)
