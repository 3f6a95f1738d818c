"""End to end on the shared WMT sample: train, checkpoint, resume, decode.

Small overrides of configs/tiny.py keep each run to well under a minute.
"""

import dataclasses
import json
import math
import shutil

import chex
import dp_accounting
import jax
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant

from dpnmt import bridge
from dpnmt.config import RunConfig
from dpnmt.errors import InputError
from dpnmt.evaluation import decode as decode_lib
from dpnmt.training import loop, metrics
from tests.markers import needs_data
from tests.small_configs import small_config

pytestmark = [pytest.mark.slow, needs_data]


def claimed(privacy_report):
    """The ε the run would claim with a secret seed (the tests fix theirs)."""
    # A fixed seed: no guarantee (results.json stores ∞ as the string "inf").
    assert math.isinf(float(privacy_report["dp_sgd_epsilon"]))
    return privacy_report["epsilon_if_seed_were_secret_NOT_A_GUARANTEE"]


def independent_poisson_epsilon(privacy_report):
    accountant = pld_privacy_accountant.PLDAccountant()
    event = dp_accounting.PoissonSampledDpEvent(
        privacy_report["sampling_rate"],
        dp_accounting.GaussianDpEvent(privacy_report["noise_multiplier"]),
    )
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, privacy_report["steps_planned"]))
    return accountant.get_epsilon(privacy_report["dp_sgd_delta"])


@pytest.fixture(scope="module")
def poisson_runs(tmp_path_factory):
    """The same eps8 run twice: uninterrupted, and stopped after 5 steps then resumed."""
    whole = tmp_path_factory.mktemp("whole")
    split = tmp_path_factory.mktemp("split")
    config = small_config("eps8")
    results = loop.train_and_evaluate(RunConfig.of(config), str(whole))
    partial = loop.train_and_evaluate(
        RunConfig.of(small_config("eps8")), str(split), stop_after_steps=5
    )
    resumed = loop.train_and_evaluate(RunConfig.of(small_config("eps8")), str(split))
    return whole, split, results, partial, resumed


def test_poisson_run_reports_fields_and_an_epsilon_dp_accounting_confirms(poisson_runs):
    whole, _, results, _, _ = poisson_runs
    on_disk = json.loads((whole / "results.json").read_text())
    report = on_disk["privacy"]
    assert report["sampling"] == "poisson" and "add/remove" in report["adjacency"]
    assert report["steps_done"] == report["steps_planned"] == round(600 / 48)
    assert report["sampling_rate"] == pytest.approx(48 / report["dataset_size"])
    assert claimed(report) == pytest.approx(independent_poisson_epsilon(report), rel=1e-9)
    assert 0.99 * 8 <= claimed(report) <= 8.0
    assert report["vocabulary"]["kind"] == "dp_sentencepiece"
    # The fixed seed voids every figure: the total and the log say so.
    assert report["total_epsilon"] == "inf" and "fixed seed" in report["composition"]
    assert "fixed seed" in report["bound"]
    for key in ("bleu", "bleu_signature", "chrf", "num_sentences"):
        assert key in on_disk["test"]
    assert on_disk["test"]["num_sentences"] == 16
    assert '"noise_seed"' not in json.dumps(on_disk)  # No seed field (the switch's name is).
    # The seed stays in private/: the published config.json has none.
    assert json.loads((whole / "config.json").read_text())["noise_seed"] is None
    assert (whole / "private" / "noise_seed").read_text() == "7"
    assert results["finished"]
    # Progress and metrics files.
    lines = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    assert any("privacy/epsilon_spent" in line for line in lines)
    assert list((whole / "tensorboard").iterdir())


def test_resume_continues_the_same_run(poisson_runs):
    whole, split, results, partial, resumed = poisson_runs
    assert not partial["finished"] and partial["steps_done"] == 5
    assert resumed["finished"] and resumed["steps_done"] == results["steps_done"]
    params_whole, _, _ = decode_lib.load_trained_params(str(whole))
    params_split, _, _ = decode_lib.load_trained_params(str(split))
    chex.assert_trees_all_close(params_whole, params_split, rtol=1e-5, atol=1e-6)
    assert resumed["privacy"]["dp_sgd_epsilon"] == results["privacy"]["dp_sgd_epsilon"]


def test_workdir_with_a_different_config_is_refused(poisson_runs):
    whole = poisson_runs[0]
    other = small_config("eps8")
    other.train.learning_rate = 0.5
    with pytest.raises(ValueError, match="different config.*learning_rate"):
        loop.train_and_evaluate(RunConfig.of(other), str(whole))


def test_decode_writes_hypotheses_scores_and_privacy(poisson_runs):
    whole = poisson_runs[0]
    results = decode_lib.decode_and_score(
        decode_lib.load_run_config(str(whole)), str(whole), split="test", max_examples=8
    )
    out = whole / "decode_test"
    assert len((out / "hypotheses.test.txt").read_text().splitlines()) == 8
    scores = json.loads((out / "results.json").read_text())["scores"]
    assert {"bleu", "bleu_signature", "chrf", "bertscore"} <= set(scores)
    assert 0 <= scores["bertscore"]["f1"] <= 1
    assert claimed(results["privacy"]) == pytest.approx(
        independent_poisson_epsilon(results["privacy"]), rel=1e-9
    )


def test_decode_without_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        decode_lib.load_run_config(str(tmp_path))


def test_shuffle_run_reports_the_no_amplification_bound(tmp_path):
    results = loop.train_and_evaluate(RunConfig.of(small_config("eps8,shuffle")), str(tmp_path))
    report = results["privacy"]
    assert report["sampling"] == "shuffle" and "replace one" in report["adjacency"]
    assert report["steps_done"] == 600 // 48  # One epoch of full lots.
    gaussian = dp_accounting.get_epsilon_gaussian(
        report["noise_multiplier"], report["dp_sgd_delta"]
    )
    assert claimed(report) == pytest.approx(gaussian, rel=2e-3)
    assert "epsilon_if_poisson_NOT_A_GUARANTEE" not in report  # No figure under a fixed seed.


def test_nonprivate_run_learns(tmp_path):
    config = small_config("nonprivate")
    config.train.num_epochs = 3
    config.train.profile = True
    results = loop.train_and_evaluate(RunConfig.of(config), str(tmp_path))
    assert not results["privacy"]["private"]
    # A non-private run's profile is published beside results.json.
    profile = json.loads((tmp_path / "profile.json").read_text())
    rows = {row["phase"]: row for row in profile["phases"]}
    assert rows["device steps"]["count"] == results["steps_done"]
    assert rows["device steps"]["compile_seconds"] > 0  # The first lot compiles the step.
    assert sum(row["fraction"] for row in profile["phases"]) == pytest.approx(1.0)
    assert not (tmp_path / "private" / "profile.json").exists()
    assert math.isinf(results["privacy"]["dp_sgd_epsilon"])
    start = results["history"][0]
    assert start["step"] == 0
    assert "bleu" not in start  # Before training: the loss only, no full-length decode.
    # Nats per target token: well beyond run-to-run noise.
    assert results["validation"]["loss"] < start["loss"] - 1.0


def test_secure_lots_publish_validation_only_after_its_checkpoint(tmp_path, monkeypatch):
    """os.urandom lots are not replayable: a resume redraws the lots after its
    checkpoint, so scores published from later steps would be releases the
    accountant never counted. Every published validation step is checkpointed
    first."""
    events = []
    save, write = loop.checkpointing.save_state, metrics.MetricsWriter.write

    def recording_save(manager, run_dir, state, **kwargs):
        events.append(("save", state.step))
        return save(manager, run_dir, state, **kwargs)

    def recording_write(self, step, scalars):
        if any(name.startswith("validation/") for name in scalars):
            events.append(("publish", step))
        return write(self, step, scalars)

    monkeypatch.setattr(loop.checkpointing, "save_state", recording_save)
    monkeypatch.setattr(metrics.MetricsWriter, "write", recording_write)
    config = small_config("eps8")
    config.dp.secure_rng = True
    config.train.eval_every_steps = 2
    config.train.checkpoint_every_steps = 1000
    loop.train_and_evaluate(RunConfig.of(config), str(tmp_path), stop_after_steps=5)
    published = [step for kind, step in events if kind == "publish"]
    assert published == [0, 2, 4]  # Step 0: the initial model's loss, before any lot.
    published.remove(0)
    for step in published:
        position = events.index(("publish", step))
        assert ("save", step) in events[:position], events
    # checkpoints/ deleted: the start silently trained again from lot 1 with fresh lots and
    # noise, a second release of the data beside the first's published scores.
    shutil.rmtree(tmp_path / "checkpoints")
    with pytest.raises(InputError, match="this workdir already trained; restore its checkpoints"):
        loop.train_and_evaluate(RunConfig.of(config), str(tmp_path), stop_after_steps=1)


def test_secret_dropout_keys_and_every_bucket_compiled_before_the_first_lot(
    tmp_path, monkeypatch, caplog
):
    """An example's dropout key follows its row in the lot; adding an example
    shifts the others' rows. Were the keys public (config.seed), their masks
    would be known and the clipped sum would move by more than C; the keys
    derive from the secret seed instead: the same public seed with another
    secret seed gives other keys.
    And the step compiles for every length bucket before the first lot, and
    never during it, so which shapes compile (and when) does not depend on the
    lots; the log names each bucket's compile (public shapes only)."""
    build_run = loop.build_run
    events = []  # ("compiled",) per add_microbatch program, ("call", shape, real rows, key).

    def recording_build_run(*args, **kwargs):
        run = build_run(*args, **kwargs)
        add = run.step.step_fns.add_microbatch

        def recording_add(acc, trainable, frozen, micro, key):
            shape = (micro["input_ids"].shape[1], micro["labels"].shape[1])
            real = float(np.asarray(micro["mask"]).sum())
            events.append(("call", shape, real, np.asarray(jax.random.key_data(key))))
            return add(acc, trainable, frozen, micro, key)

        recording_add.lower = add.lower  # Compiling ahead goes through the same jit.
        step_fns = dataclasses.replace(run.step.step_fns, add_microbatch=recording_add)
        return dataclasses.replace(run, step=dataclasses.replace(run.step, step_fns=step_fns))

    def on_duration(event, duration, fun_name="", **_):
        # XLA's compile (or a persistent-cache load) of one add_microbatch program.
        if event == "/jax/core/compile/backend_compile_duration":
            if "add_microbatch" in fun_name:
                events.append(("compiled",))
            elif "apply_lot" in fun_name:
                events.append(("compiled update",))

    monkeypatch.setattr(loop, "build_run", recording_build_run)
    config = small_config("eps8")
    config.train.eval_every_steps = 0
    config.data.length_buckets = "auto"
    # Two buckets, (8, 8) and (16, 16), are enough to see the order (CI time: each compiles).
    config.data.max_source_length = config.data.max_target_length = 16
    # 340 pieces whatever the secret seed (its DP vocabulary holds ~380): both runs
    # build the same programs, so the second loads them from the cache (CI time).
    config.tokenizer.vocab_size = 340
    buckets = bridge.resolve_length_buckets(
        config.data.length_buckets,
        config.data.max_source_length,
        config.data.max_target_length,
        lengths_known=True,
    )
    count = len(buckets.shapes)
    assert count > 1

    def first_lot_key(noise_seed, name):
        config.noise_seed = noise_seed
        events.clear()
        caplog.clear()
        jax.monitoring.register_event_duration_secs_listener(on_duration)
        try:
            with caplog.at_level("INFO"):
                loop.train_and_evaluate(
                    RunConfig.of(config), str(tmp_path / name), stop_after_steps=1
                )
        finally:
            jax.monitoring.unregister_event_duration_listener(on_duration)
        first = next(i for i, event in enumerate(events) if event[0] == "call" and event[2] > 0)
        assert events[:first].count(("compiled",)) == count  # One program per bucket, ahead.
        assert ("compiled",) not in events[first:]  # None while the lot runs.
        assert events[:first].count(("compiled update",)) == 1  # The update's too (speed).
        assert ("compiled update",) not in events[first:]
        for index, (source, target) in enumerate(buckets.shapes, start=1):
            what = f"length bucket {index}/{count} (source {source}, target {target} tokens)"
            assert f"Compiled the training step for {what} in " in caplog.text
        return events[first][3]

    # Same secret seed, same keys: the resume tests above (bit-identical runs).
    assert not np.array_equal(first_lot_key(1, "first"), first_lot_key(2, "other"))
