r"""Audits a training config empirically: canaries, exposure, an ε lower bound.

    python -m dpnmt.audit --config=configs/tiny.py:eps8 --workdir=runs/audit_tiny
    python -m dpnmt.audit --config=configs/tiny.py:nonprivate --repeats=8 \
        --workdir=runs/audit_np     # memorisation when nothing protects it

Trains the config with secret canaries added to its training data (half of
them held out), then writes `audit.json` (membership AUC, the one-run ε lower
bound at --confidence, the largest bound M canaries could reach, and the
outcome: consistent, INCONSISTENT, or UNTESTABLE when even perfect scores could
not contradict the claim (logged before training too, with the M that would
test it); exposure and extraction counts) and `audit_scores.png` into the
workdir, next to the
training run's own outputs. The canaries, their secrets and which were
inserted stay in `<workdir>/private/`. Rerunning resumes with the same
canaries. Logic: `dpnmt.auditing`.
"""

from absl import app, flags
from ml_collections import config_flags

from dpnmt import auditing, cli, distributed
from dpnmt.auditing import canaries
from dpnmt.errors import raise_problems
from dpnmt.training import preflight

_DEFAULTS = auditing.AuditOptions()
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config to audit, e.g. configs/tiny.py:eps8.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output folder (a run workdir); reruns resume.")
_NUM_CANARIES = flags.DEFINE_integer(
    "num_canaries", _DEFAULTS.num_canaries, "M canaries, each inserted with probability 1/2."
)
_REPEATS = flags.DEFINE_integer(
    "repeats", _DEFAULTS.repeats, "Copies of each inserted canary (1 audits the per-example ε)."
)
_KEY_LENGTH = flags.DEFINE_integer(
    "key_length", _DEFAULTS.key_length, "Digits of each canary's source key."
)
_SECRET_LENGTH = flags.DEFINE_integer(
    "secret_length", _DEFAULTS.secret_length, "Digits of each secret."
)
_NUM_CANDIDATES = flags.DEFINE_integer(
    "num_candidates", _DEFAULTS.num_candidates, "Other secrets each secret is ranked against."
)
_CONFIDENCE = flags.DEFINE_float(
    "confidence", _DEFAULTS.confidence, "Confidence of the ε lower bound."
)
_SOURCE_TEMPLATE = flags.DEFINE_string(
    "source_template", canaries.SOURCE_TEMPLATE, "Canary source with one {key}."
)
_TARGET_TEMPLATE = flags.DEFINE_string(
    "target_template", canaries.TARGET_TEMPLATE, "Canary target with one {secret}."
)


def main(argv):
    """Runs `auditing.run_audit` with the flags' config, workdir and options."""
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    cli.setup_logging()
    # Every process would draw its own canaries and write the same workdir.
    raise_problems(distributed.single_process_problems("dpnmt.audit"))
    config = preflight.read_config(_CONFIG.value, _WORKDIR.value)  # The one ConfigDict read.
    # Before the audit writes its canaries: the trainer checks the rest.
    preflight.check_static(config, _WORKDIR.value)
    options = auditing.AuditOptions(
        num_canaries=_NUM_CANARIES.value,
        repeats=_REPEATS.value,
        key_length=_KEY_LENGTH.value,
        secret_length=_SECRET_LENGTH.value,
        num_candidates=_NUM_CANDIDATES.value,
        confidence=_CONFIDENCE.value,
        source_template=_SOURCE_TEMPLATE.value,
        target_template=_TARGET_TEMPLATE.value,
    )
    auditing.run_audit(config, _WORKDIR.value, options)


if __name__ == "__main__":
    # Here, not at import: importing this module (tests, other apps) must not
    # make these flags required for every absl app in the process.
    flags.mark_flags_as_required(["config", "workdir"])
    cli.run(main)
