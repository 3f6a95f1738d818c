"""What a private run publishes (its workdir minus `private/`) on the shared WMT sample.

One short DP run with a secret seed from the OS (about 60 lots of a tiny T5):
no seed material anywhere published, no rate over fewer than 50 lots, exact
counts of the private training split only in `private/` (and not in the log),
no local path, checkpoints without times, what `dpnmt.decode` computes on the
carved validation split under `private/`, and a privacy report that says what
it assumes public and that validation was carved from train.
"""

import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import tempfile

import pytest

from dpnmt.config import RunConfig
from dpnmt.training import loop, run_dir
from tests.markers import needs_data
from tests.small_configs import smaller_config

pytestmark = [pytest.mark.slow, needs_data]


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("secret")
    c = smaller_config("eps8")
    c.noise_seed, c.testing_only_fixed_noise_seed_NO_PRIVACY = None, False  # Seed from the OS.
    c.data.max_train_examples = 240
    c.train.expected_lot_size = 4
    c.train.checkpoint_every_steps = 20
    c.train.log_every_steps = 5
    c.train.profile = True  # Its timings depend on the realised lot sizes.
    handler, root = _Lines(), logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        results = loop.train_and_evaluate(RunConfig.of(c), str(workdir))
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    return workdir, results, handler.lines


def _published_files(workdir):
    for folder, dirs, files in os.walk(workdir):
        dirs[:] = [d for d in dirs if d != run_dir.PRIVATE_DIR]
        for name in files:
            yield os.path.join(folder, name)


def test_nothing_published_holds_the_seed_or_a_hash_of_it(run):
    workdir, results, lines = run
    seed = int((workdir / run_dir.PRIVATE_DIR / "noise_seed").read_text())
    assert seed.bit_length() > 64  # 128 bits from the OS (2**-64 chance of a false fail).
    secrets = {seed} | {run_dir.derived_seed(seed, p) for p in ("noise", "sampler", "vocabulary")}
    secrets.add(run_dir.derived_seed(seed, "sampler") % 2**64)  # What torch is given.
    needles = set()
    for value in secrets:
        needles |= {str(value), f"{value:x}", f"{value:X}"}
        needles.add(value.to_bytes((value.bit_length() + 7) // 8, "little").hex())
        needles.add(hashlib.sha256(str(value).encode()).hexdigest())
        needles.add(hashlib.sha256(f"dpnmt-noise-seed:{value}".encode()).hexdigest())
    binary = {value.to_bytes(16, "little") for value in secrets if value < 2**128}
    files = list(_published_files(workdir))
    kinds = {os.path.relpath(f, workdir).split(os.sep)[0] for f in files}
    assert {"config.json", "results.json", "metrics.jsonl", "tensorboard", "checkpoints"} <= kinds
    for path in files:
        with open(path, "rb") as f:
            data = f.read()
        text = data.decode("latin-1")
        for needle in needles:
            assert needle not in text, f"{path} holds seed material"
        for raw in binary:
            assert raw not in data, f"{path} holds the seed's bytes"
    assert not any(str(seed) in line for line in lines)  # Nor the log.
    assert json.loads((workdir / "config.json").read_text())["noise_seed"] is None


def test_no_rate_is_written_before_50_lots(run):
    workdir, results, lines = run
    assert results["steps_done"] >= 55
    metrics = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    rated = [m["step"] for m in metrics if "train/lots_per_second" in m]
    logged = [m["step"] for m in metrics if "privacy/epsilon_spent" in m]
    assert logged[:3] == [5, 10, 15]  # Progress is logged every 5 lots...
    assert rated and min(rated) >= 50  # ...rates only once 50 lots have run.
    progress = [line for line in lines if line.startswith("step ")]
    early = [line for line in progress if int(re.match(r"step (\d+)/", line)[1]) < 50]
    assert early and not any("lots/s" in line or "examples/s" in line for line in early)
    assert results["seconds_per_epoch"] is not None  # >= 50 lots in this session.
    # The session's published time is that of its closed windows, derivable from
    # their published rates: never the lots after the last window.
    rates = {}
    for m in metrics:
        if "train/lots_per_second" in m:
            rates.setdefault(m["train/lots_per_second"], m["step"])  # Window end: first step.
    ends = sorted(rates.items(), key=lambda item: item[1])
    starts = [0] + [end for _, end in ends[:-1]]
    window_seconds = sum(
        (end - start) / rate for (rate, end), start in zip(ends, starts, strict=True)
    )
    assert ends[-1][1] < results["steps_done"]  # Lots ran after the last window...
    assert results["train_seconds_this_session"] == pytest.approx(window_seconds, rel=1e-6)
    # An epoch of Poisson lots is N / L lots in expectation, not N // L.
    report = results["privacy"]
    assert report["sampling"] == "poisson"
    epoch_lots = report["dataset_size"] / report["expected_lot_size"]
    assert results["seconds_per_epoch"] == pytest.approx(
        window_seconds / ends[-1][1] * epoch_lots, rel=1e-6
    )


def test_private_counts_stay_private_and_the_report_states_its_assumptions(run):
    workdir, results, _ = run
    on_disk = json.loads((workdir / "results.json").read_text())
    report = on_disk["privacy"]
    assert math.isfinite(report["dp_sgd_epsilon"]) and report["dp_sgd_epsilon"] > 0
    assert "add/remove one" in report["adjacency"]
    assert any(item.startswith("dataset_size") for item in report["assumed_public"])
    # The WMT sample has no validation file: validation is carved from train.
    assert on_disk["validation_is_private"] is True and report["validation_is_private"] is True
    assert on_disk["preprocessing"]["train"] == {"num_kept": report["dataset_size"]}
    assert "validation" not in on_disk["preprocessing"]
    exact = json.loads((workdir / run_dir.PRIVATE_DIR / run_dir.PREPROCESSING_FILE).read_text())
    assert exact["train"]["num_kept"] == report["dataset_size"]
    assert {"num_examples", "num_dropped", "num_source_truncated"} <= set(exact["train"])


def test_a_private_runs_profile_is_private_and_unlogged(run):
    workdir, _, lines = run
    profile = json.loads((workdir / run_dir.PRIVATE_DIR / run_dir.PROFILE_FILE).read_text())
    phases = {row["phase"] for row in profile["phases"]}
    assert {"device steps", "lot preparation (waiting on the prefetcher)"} <= phases
    published = {os.path.basename(path) for path in _published_files(workdir)}
    assert run_dir.PROFILE_FILE not in published
    assert not any("device steps" in line or "| phase |" in line for line in lines)


def test_progress_lines_show_dp_sgd_and_total_epsilon_spent(run):
    """The total adds the DP vocabulary's ε: showing DP-SGD's alone understates the spend."""
    workdir, results, lines = run
    report = results["privacy"]
    vocabulary = report["vocabulary"]["epsilon"]
    assert report["vocabulary"]["kind"] == "dp_sentencepiece" and vocabulary > 0
    progress = [line for line in lines if line.startswith("step ")]
    pattern = r"step (\d+)/\d+ .*ε spent: DP-SGD (\S+), total (\S+)$"
    spent = [re.search(pattern, line) for line in progress]
    assert spent and all(spent), progress[:2]
    for match in spent:
        assert float(match[3]) == pytest.approx(float(match[2]) + vocabulary, rel=1e-3)
    last = spent[-1]
    assert int(last[1]) == report["steps_planned"]
    assert float(last[3]) == pytest.approx(report["total_epsilon"], rel=1e-3)
    metrics = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    totals = [m for m in metrics if "privacy/total_epsilon_spent" in m]
    assert totals[-1]["privacy/total_epsilon_spent"] == pytest.approx(report["total_epsilon"])


@pytest.fixture(scope="module")
def decoded(run):
    """The run decoded by `dpnmt.decode`: the public test split and the carved validation."""
    from dpnmt.evaluation import decode

    workdir = run[0]
    config = decode.load_run_config(str(workdir))
    for split in ("test", "validation"):
        decode.decode_and_score(RunConfig.of(config), str(workdir), split=split, max_examples=2)
    banned = dataclasses.replace(
        config, eval=dataclasses.replace(config.eval, no_repeat_ngram_size=2)
    )
    for split in ("test", "validation"):
        decode.decode_and_score(banned, str(workdir), split=split, max_examples=2, tag="norepeat2")
    return workdir


def test_decoding_a_carved_validation_split_writes_under_private(decoded):
    """`dpnmt.decode --split=validation` wrote the hypotheses of validation pairs carved
    from the private train split into the published workdir; noise_to_signal already
    wrote to private/. Both now follow `RunDir.output_path`."""
    assert not (decoded / "decode_validation").exists()
    private = decoded / run_dir.PRIVATE_DIR / "decode_validation"
    assert len((private / "hypotheses.validation.txt").read_text().splitlines()) == 2
    assert (decoded / "decode_test" / "hypotheses.test.txt").exists()  # Public split.


def test_a_tagged_decoding_follows_the_same_privacy_rule(decoded):
    """`--tag` names another folder; a carved validation split's still goes under private/."""
    assert not (decoded / "decode_validation_norepeat2").exists()
    private = decoded / run_dir.PRIVATE_DIR / "decode_validation_norepeat2"
    assert len((private / "hypotheses.validation.txt").read_text().splitlines()) == 2
    results = json.loads((decoded / "decode_test_norepeat2" / "results.json").read_text())
    assert results["decoding"]["no_repeat_ngram_size"] == 2


def test_published_files_hold_no_local_path(decoded):
    """Published files held absolute local paths: orbax's commit_success.txt, BERTScore's
    encoder folder in decode results, SentencePiece's training input in tokenizer.model."""
    bertscore = json.loads((decoded / "decode_test" / "results.json").read_text())["scores"]
    assert "bertscore" in bertscore
    needles = {str(decoded), os.path.realpath(decoded), "site-packages", tempfile.gettempdir()}
    needles.add(os.environ["DPNMT_DATA_DIR"])
    for path in _published_files(decoded):
        with open(path, "rb") as f:
            text = f.read().decode("latin-1")
        for needle in needles:
            assert needle not in text, f"{path} holds the local path {needle}"


def test_no_published_file_name_holds_the_hostname_or_a_time(run):
    """tensorboardX named its event file `events.out.tfevents.<start second>.<hostname>`."""
    import socket  # noqa: PLC0415

    workdir = run[0]
    names = [os.path.relpath(path, workdir) for path in _published_files(workdir)]
    assert any("tfevents" in name for name in names)
    for name in names:
        assert socket.gethostname() not in re.split(r"[./]", name), name
        assert not re.search(r"\d{10}", name), name


def test_checkpoints_carry_no_time(run):
    """Orbax's nanosecond init/commit times and the files' modification times timed the
    few lots between two kept checkpoints (20 here, fewer at a session's end)."""
    workdir = run[0]
    folder = workdir / run_dir.CHECKPOINT_DIR
    steps = sorted(int(name) for name in os.listdir(folder))
    assert len(steps) == 2
    for step in steps:
        metadata = json.loads((folder / str(step) / "_CHECKPOINT_METADATA").read_text())
        assert metadata["init_timestamp_nsecs"] is None
        assert metadata["commit_timestamp_nsecs"] is None
    for folder_name, dirs, files in os.walk(folder):
        for name in dirs + files:
            assert os.lstat(os.path.join(folder_name, name)).st_mtime == 0
        assert not any(name.endswith(".ocdbt") for name in files)  # OCDBT records a time.


def test_the_log_holds_no_exact_private_count(run):
    """The log printed "238 of 239 training targets are longer than ...": exact counts of
    the private train split that private/preprocessing.json says never to publish, and a
    length percentile of the validation split carved from it."""
    workdir, results, lines = run
    exact = json.loads((workdir / run_dir.PRIVATE_DIR / run_dir.PREPROCESSING_FILE).read_text())
    data = json.loads((workdir / "config.json").read_text())["data"]
    public = {results["privacy"]["dataset_size"], data["max_train_examples"]}  # N, the config...
    public.add(data["validation_size"])  # ...and how many pairs validation takes from train.
    counts = {
        value
        for split in ("train", "validation")  # Validation is carved from train here.
        for value in exact[split].values()
        if isinstance(value, int) and value >= 10 and value not in public
    }
    assert counts, "the run should have private counts to look for"
    for line in lines:
        for count in counts:
            for text in (str(count), f"{count:,}"):
                pattern = rf"(?<![\w.,]){re.escape(text)}(?![\w.,])"
                assert not re.search(pattern, line), f"the log shows private count {count}: {line}"
        assert "of validation" not in line  # No statistic of the carved validation split.
    # The warning still shows (a threshold, 10% or 50% of N, never a count).
    assert any(re.search(r"More than (10|50)% of the", line) for line in lines)
