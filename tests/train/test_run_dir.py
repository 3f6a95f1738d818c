"""The run directory's records (`dpnmt.training.run_dir`): derived seeds, strict JSON."""

import json
import math
import os

import pytest

from dpnmt import config_lib, privacy
from dpnmt.config import RunConfig
from dpnmt.data.tokenizers import VocabularyRecord
from dpnmt.errors import InputError
from dpnmt.training import run_dir
from dpnmt.training.privacy_report import privacy_report


def test_derived_seeds_keep_128_bits_and_every_bit_of_the_run_seed():
    """_derived_seed returned 63 bits: the noise key, sampler and vocabulary noise
    had at most 63 bits of secret however long the run seed."""
    seed = 2**127 + 12345
    for purpose in ("noise", "sampler", "vocabulary"):
        derived = [run_dir.derived_seed(seed + k * 2**100, purpose) for k in range(8)]
        assert max(d.bit_length() for d in derived) > 120
        assert len(set(derived)) == 8  # Bits above 64 of the run seed matter.
    assert run_dir.derived_seed(seed, "noise") != run_dir.derived_seed(seed, "sampler")


def test_results_privacy_report_is_strict_json_for_a_nonprivate_run(tmp_path):
    """ε = ∞ must not be written as the bare token Infinity (not JSON; jq and
    JavaScript reject it): write_json stores it as the string "inf"."""
    config = config_lib.make_config("nonprivate")
    plan = privacy.plan_privacy(config.dp, config.train, dataset_size=1_000)
    vocabulary = VocabularyRecord("pretrained", True)
    path = tmp_path / "results.json"
    run_dir.write_json(
        str(path), {"privacy": privacy_report(plan, plan.num_steps, vocabulary).to_json()}
    )
    text = path.read_text()

    def reject(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    json.loads(text, parse_constant=reject)
    assert math.isinf(plan.epsilon_after(plan.num_steps))


def test_declaring_pretrained_data_disjoint_is_refused_once_the_run_has_started(tmp_path):
    """`model.pretrained_data_disjoint` was not binding: a run planned with the export's ε
    composed resumed with the declaration set and reported a smaller ε."""
    import pytest  # noqa: PLC0415

    from dpnmt.errors import ConfigError  # noqa: PLC0415

    config = config_lib.make_config("eps8")
    config.model.name_or_path = "someone/dp-export"
    workdir = run_dir.RunDir(str(tmp_path / "run"))
    workdir.bind_config(RunConfig.of(config))
    config.model.pretrained_data_disjoint = True  # Before any checkpoint: a corrected config.
    workdir.bind_config(RunConfig.of(config))
    config.model.pretrained_data_disjoint = False
    workdir.bind_config(RunConfig.of(config))
    (tmp_path / "run" / run_dir.CHECKPOINT_DIR / "2").mkdir(parents=True)  # Started.
    config.model.pretrained_data_disjoint = True
    with pytest.raises(ConfigError, match=r"model\.pretrained_data_disjoint: run False, now True"):
        workdir.bind_config(RunConfig.of(config))
    # A run from before the field existed resumes with it at its default, not set.
    published = json.loads((tmp_path / "run" / run_dir.CONFIG_FILE).read_text())
    del published["model"]["pretrained_data_disjoint"]
    (tmp_path / "run" / run_dir.CONFIG_FILE).write_text(json.dumps(published))
    with pytest.raises(ConfigError, match=r"pretrained_data_disjoint: run '\(absent\)', now True"):
        workdir.bind_config(RunConfig.of(config))
    config.model.pretrained_data_disjoint = False
    workdir.bind_config(RunConfig.of(config))


def _events(path):
    """The `Event` protos of a TFRecord event file (length, its CRC, data, its CRC)."""
    import struct  # noqa: PLC0415

    from tensorboardX.proto.event_pb2 import Event  # noqa: PLC0415

    data, events, offset = path.read_bytes(), [], 0
    while offset < len(data):
        (length,) = struct.unpack("<Q", data[offset : offset + 8])
        events.append(Event.FromString(data[offset + 12 : offset + 12 + length]))
        offset += 12 + length + 4
    assert offset == len(data)
    return events


def test_tensorboard_files_name_no_host_or_time_and_each_session_adds_one(tmp_path):
    """tensorboardX named the published file `events.out.tfevents.<start second>.<hostname>`
    and stamped its first event with the exact start time."""
    import re  # noqa: PLC0415
    import socket  # noqa: PLC0415

    from dpnmt.training.metrics import MetricsWriter  # noqa: PLC0415

    for session in range(2):  # A run, then its resume.
        writer = MetricsWriter(str(tmp_path))
        writer.write(5 + 5 * session, {"privacy/epsilon_spent": 0.5, "train/loss": math.inf})
        writer.close()
    folder = tmp_path / run_dir.TENSORBOARD_DIR
    names = sorted(os.listdir(folder))
    assert names == ["events.out.tfevents.session-0001", "events.out.tfevents.session-0002"]
    for name in names:
        assert socket.gethostname() not in name.split(".") and not re.search(r"\d{10}", name)
    for step, name in zip((5, 10), names, strict=True):
        first, scalars = _events(folder / name)
        assert first.file_version == "brain.Event:2" and first.wall_time == int(first.wall_time)
        assert scalars.step == step and scalars.wall_time == first.wall_time
        assert (
            first.wall_time == 0
        )  # Private (the default): two start seconds would time a session.
        assert [(v.tag, v.simple_value) for v in scalars.summary.value] == [
            ("privacy/epsilon_spent", 0.5)  # The infinite loss is not an event.
        ]


class _KilledWhileWriting:
    """A value whose serialisation stops the process half-way (a kill mid-write)."""

    def __str__(self):
        raise KeyboardInterrupt


def test_records_are_written_atomically_and_a_cut_short_claim_is_refused(tmp_path):
    """pretrained.json was rewritten in place on every resume: a kill left it empty."""
    workdir = run_dir.RunDir(str(tmp_path))
    claim = {"name": "files:base", "epsilon": 1.0}
    workdir.write_pretrained(claim)
    try:
        workdir.write_pretrained({"name": "files:base", "epsilon": _KilledWhileWriting()})
    except KeyboardInterrupt:
        pass
    assert workdir.read_pretrained() == claim  # The old record, whole.
    path = tmp_path / run_dir.PRETRAINED_FILE
    for broken in ("", '{"name": "files:ba', "[1, 2]"):
        path.write_text(broken)
        with pytest.raises(InputError, match="pretrained.json is not the JSON object") as error:
            workdir.read_pretrained()
        assert "Restore it" in str(error.value)


def test_a_nonprivate_run_keeps_its_session_start_second(tmp_path):
    from dpnmt.training.metrics import MetricsWriter  # noqa: PLC0415

    writer = MetricsWriter(str(tmp_path), private=False)
    writer.write(5, {"train/loss": 1.0})
    writer.close()
    (name,) = os.listdir(tmp_path / run_dir.TENSORBOARD_DIR)
    first, scalars = _events(tmp_path / run_dir.TENSORBOARD_DIR / name)
    assert first.wall_time > 1e9 and scalars.wall_time == first.wall_time


def test_app_log_lines_carry_no_timestamp():
    """A private run's log is published: stamped progress lines would time a few lots."""
    import logging  # noqa: PLC0415
    import re  # noqa: PLC0415

    from absl import logging as absl_logging  # noqa: PLC0415

    from dpnmt import cli  # noqa: PLC0415

    handler = absl_logging.get_absl_handler()
    record = logging.LogRecord("dpnmt", logging.INFO, __file__, 7, "step 10/71", None, None)
    before = handler.formatter
    try:
        cli.untimed_logging()
        line = handler.format(record)
    finally:
        handler.setFormatter(before)
    assert line.endswith("step 10/71") and not re.search(r"\d\d:\d\d:\d\d", line), line


def test_published_records_get_the_usual_file_mode_and_private_ones_the_owners_only(tmp_path):
    """results.json was written 0600 (mkstemp's mode) while the other published files are 0644."""
    umask = os.umask(0o022)
    try:
        run = run_dir.RunDir(str(tmp_path))
        run.write_results({"finished": True})
        run.write_private_json("preprocessing.json", {"n": 1})
        run_dir.write_json(str(tmp_path / "other.json"), {})
    finally:
        os.umask(umask)
    assert os.stat(run.results_path).st_mode & 0o777 == 0o644
    assert os.stat(tmp_path / "other.json").st_mode & 0o777 == 0o644
    assert os.stat(run.private_file("preprocessing.json")).st_mode & 0o777 == 0o600
