"""The audit on real (tiny) training runs of the shared WMT sample.

Small overrides of configs/tiny.py: 8 corpus pairs plus 64 canaries (2-digit
keys and secrets), a 1-layer d_model=64 T5 and many cheap epochs, so that a
run without noise memorises its canaries. The vocabulary is public
SentencePiece (test split + the public templates), so the claimed ε is
DP-SGD's alone and a small claim is possible.
"""

import json

import pytest

from dpnmt import auditing, core
from dpnmt.config import RunConfig
from dpnmt.training import pieces, run_dir
from tests.markers import needs_data
from tests.small_configs import load_config

pytestmark = [pytest.mark.slow, needs_data]

EPS1_CLAIM = 1.0  # configs/tiny.py:eps1, DP-SGD's ε (the vocabulary is public).
OPTIONS = dict(num_canaries=64, key_length=2, secret_length=2, num_candidates=99)
# Stands in for the OS's 128-bit draws (core.fresh_seed: the noise seed, the run id).
OS_SEED = 0xD1B54A32D192ED03AEF0C4F5B7E36A21


@pytest.fixture
def fixed_os_seed(monkeypatch):
    """Makes the DP runs reproducible: `core.fresh_seed` returns OS_SEED, OS_SEED + 1, ...

    The config still leaves `noise_seed` unset, so the run takes its seed as an OS
    draw and claims a finite ε; only the test knows the value. The seed also fixes
    the Poisson lots (`dp.secure_rng` is off in these configs) and dropout keys.
    """
    draws = iter(range(OS_SEED, OS_SEED + 1000))
    monkeypatch.setattr(core, "fresh_seed", lambda: next(draws))


@pytest.fixture(scope="module")
def public_text(tmp_path_factory):
    """Public vocabulary text: the corpus's test split and the canary templates."""
    path = tmp_path_factory.mktemp("vocab") / "public.txt"
    corpus = pieces.load_corpus(RunConfig.of(audit_config("nonprivate", None)).data)
    lines = [text for row in corpus["test"]["translation"] for text in row.values()]
    templates = ["customer 0 1 2 account number", "my account number is 3 4 5 6 7 8 9"]
    path.write_text("\n".join(lines + templates * 20) + "\n")
    return str(path)


def audit_config(variant, vocabulary_text, *, epochs=200, learning_rate=1e-2):
    c = load_config("tiny", variant)
    # A fixed seed voids a private run's claim (ε = ∞, nothing to audit): only the
    # non-private run fixes it; the DP runs draw theirs "from the OS" (fixed_os_seed).
    c.noise_seed = 7 if variant == "nonprivate" else None
    c.data.max_train_examples = 8
    c.data.max_source_length = c.data.max_target_length = 16
    c.data.max_eval_examples = c.data.max_test_examples = 8
    c.tokenizer.kind = "sentencepiece_public"
    c.tokenizer.public_text_paths = (vocabulary_text,) if vocabulary_text else ()
    c.tokenizer.vocab_size = 600
    c.model.d_model, c.model.d_ff, c.model.d_kv = 64, 128, 16
    c.model.num_layers = c.model.num_decoder_layers = 1
    c.model.dropout_rate = 0.0
    c.model.source_prefix = ""
    c.train.expected_lot_size = 16
    c.train.physical_batch_size = 24  # Most lots in one micro-batch.
    c.train.num_epochs = epochs
    c.train.learning_rate = learning_rate
    c.train.decay = "constant"
    c.train.warmup_steps = 2
    c.train.eval_every_steps = 0
    c.train.checkpoint_every_steps = 10_000
    c.train.log_every_steps = 100
    c.eval.max_new_tokens = c.eval.batch_size = 16
    return c


def test_nonprivate_run_memorises_repeated_canaries(tmp_path, public_text):
    config = audit_config("nonprivate", public_text, epochs=20, learning_rate=3e-3)
    options = auditing.AuditOptions(repeats=8, **OPTIONS)
    report = auditing.run_audit(RunConfig.of(config), str(tmp_path), options, canary_seed=3)
    membership = report["membership"]
    # Held-out secrets sit near the unlearnt mean of 1/ln 2 = 1.44 bits (max 6.64).
    assert report["held_out"]["exposure_mean"] < 2.5
    assert report["inserted"]["exposure_mean"] > 4.0
    assert membership["auc"] > 0.95
    assert membership["epsilon_lower_bound"] > 1.0
    assert membership["outcome"] == auditing.NO_CLAIM
    assert membership["claimed_epsilon"] == float("inf")
    assert report["inserted"]["exact_match"] > report["held_out"]["exact_match"]
    # Files: the public report and plot; secrets only under private/.
    on_disk = json.loads((tmp_path / auditing.AUDIT_FILE).read_text())
    assert on_disk["membership"]["auc"] == pytest.approx(membership["auc"])
    assert (tmp_path / auditing.PLOT_FILE).read_bytes()[:4] == b"\x89PNG"
    private = tmp_path / run_dir.PRIVATE_DIR
    saved = json.loads((private / auditing.CANARY_FILE).read_text())["canaries"]
    rows = json.loads((private / auditing.CANARY_SCORES_FILE).read_text())
    assert len(saved) == len(rows) == 64
    public = (tmp_path / auditing.AUDIT_FILE).read_text()
    assert not any(c["target"] in public or c["source"] in public for c in saved)
    # The run trained on the corpus plus 8 copies of each inserted canary.
    inserted = sum(c["inserted"] for c in saved)
    results = json.loads((tmp_path / run_dir.RESULTS_FILE).read_text())
    train = json.loads((private / run_dir.PREPROCESSING_FILE).read_text())["train"]
    assert train["num_examples"] == 8 + 8 * inserted
    assert results["privacy"]["dataset_size"] == train["num_kept"]
    assert results["preprocessing"]["train"] == {"num_kept": train["num_kept"]}


def test_dp_run_lower_bound_respects_its_claim(tmp_path, public_text, fixed_os_seed):
    """A DP run's bound stays under its claim: 0.00 (claim 1.00) for OS seeds 0x9e37…,
    0xd1b5…, 0x7f4a… (measured on 1 host device; see the test below)."""
    # Fewer epochs than the noise-free run below (time); still a DP run claiming ε = 1.
    config = audit_config("eps1", public_text, epochs=20)
    report = auditing.run_audit(
        RunConfig.of(config), str(tmp_path), auditing.AuditOptions(**OPTIONS), canary_seed=3
    )
    membership = report["membership"]
    assert membership["claimed_epsilon"] == pytest.approx(EPS1_CLAIM, rel=1e-2)
    assert membership["epsilon_lower_bound"] <= membership["claimed_epsilon"]
    # 64 canaries can show up to about 2 > 1: the claim is testable, and holds.
    assert membership["reachable_epsilon_lower_bound"] > membership["claimed_epsilon"]
    assert membership["outcome"] == auditing.CONSISTENT and not membership["contradicted"]


def test_a_step_without_noise_is_caught(tmp_path, public_text, monkeypatch, fixed_os_seed):
    """The same eps1 run with its noise switched off: the claim must be refuted.

    Noise off, the true ε is ∞, but the bound needs the canaries memorised, and how
    well depends chaotically on the lots (the OS seed) and the device count. Bounds
    measured under the tests' 8 host devices (claim 1.00; 64 canaries can show at
    most 2.09) for OS seeds 0xd1b5… (OS_SEED), 0x9e37…, 0x7f4a…: here (300 epochs,
    learning rate 5e-3; about 75 s) 2.09, 1.62, 1.62; the former 200 epochs at 1e-2
    (about 61 s) gave 1.76, 1.23, 1.30, and 300 epochs at 1e-2 gave 0.47 for 0x9e37….
    """
    real = core.dp_step.release  # The one release every DP step goes through.

    def noiseless(lot, key, *, noise_multiplier, **kwargs):
        return real(lot, key, noise_multiplier=0.0, **kwargs)

    monkeypatch.setattr(core.dp_step, "release", noiseless)
    config = audit_config("eps1", public_text, epochs=300, learning_rate=5e-3)
    report = auditing.run_audit(
        RunConfig.of(config), str(tmp_path), auditing.AuditOptions(**OPTIONS), canary_seed=3
    )
    membership = report["membership"]
    assert membership["claimed_epsilon"] == pytest.approx(EPS1_CLAIM, rel=1e-2)
    assert membership["epsilon_lower_bound"] > membership["claimed_epsilon"]
    assert membership["outcome"] == auditing.INCONSISTENT and membership["contradicted"]
    assert "INCONSISTENT" in membership["verdict"]


def test_rerun_with_other_options_is_refused(tmp_path):
    auditing.canary_seed_and_list(str(tmp_path), auditing.AuditOptions(**OPTIONS), 3)
    seed, again = auditing.canary_seed_and_list(
        str(tmp_path), auditing.AuditOptions(**OPTIONS), None
    )
    assert seed == 3 and len(again) == 64  # Reloaded, not redrawn.
    other = auditing.AuditOptions(**{**OPTIONS, "num_canaries": 32})
    with pytest.raises(ValueError, match="other options"):
        auditing.canary_seed_and_list(str(tmp_path), other, None)
