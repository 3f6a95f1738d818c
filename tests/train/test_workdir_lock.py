"""One writer per workdir (`training.workdir_lock`) and a secret seed created once.

Two `dpnmt.train` on one workdir both trained (two independently noised runs
on the same private data behind one ε), and the seed was `exists` then
`open("w")`: two processes starting at once could draw different seeds.
"""

import os
import socket
import subprocess
import sys
import threading

import pytest

from dpnmt.config import RunConfig
from dpnmt.errors import ConfigError, InputError
from dpnmt.training import run_dir, workdir_lock
from tests.markers import needs_data
from tests.small_configs import smaller_config

# A process that holds the lock of argv[1] until its stdin closes.
HOLDER = (
    "import sys; from dpnmt.training import workdir_lock; "
    "workdir_lock.acquire(sys.argv[1], 'a test holder'); print('held', flush=True); "
    "sys.stdin.read()"
)


def _hold(workdir) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(workdir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_process_is_refused_in_one_line_naming_the_holder(tmp_path):
    holder = _hold(tmp_path / "run")
    try:
        with pytest.raises(ConfigError) as refused:
            workdir_lock.acquire(str(tmp_path / "run"), "test")
        message = str(refused.value)
        assert f"process {holder.pid}: a test holder)" in message
        assert "\n" not in message and "use another --workdir" in message
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    workdir_lock.acquire(str(tmp_path / "run"), "test")  # The holder ended: free again.
    workdir_lock.release(str(tmp_path / "run"))


@needs_data
def test_training_a_locked_workdir_is_refused_before_anything_is_written(tmp_path):
    from dpnmt.training import loop  # noqa: PLC0415 - JAX, flax: only this test trains.

    config = smaller_config("eps8")
    config.data.max_train_examples, config.train.expected_lot_size = 96, 16
    config.tokenizer.vocab_size = 1000
    workdir = tmp_path / "run"
    holder = _hold(workdir)
    try:
        with pytest.raises(ConfigError, match=f"in use by another process \\(process {holder.pid}"):
            loop.train_and_evaluate(RunConfig.of(config), str(workdir), stop_after_steps=1)
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert os.listdir(workdir) == ["private"]  # No config.json; the lock is private.
    assert os.listdir(workdir / "private") == [os.path.basename(workdir_lock.LOCK_FILE)]


def test_the_lock_file_is_private_and_names_no_host_or_path(tmp_path, monkeypatch):
    """`.dpnmt.lock` sat in the published part of the workdir holding the host name and
    sys.argv[0] (an absolute path), its mtime the start to the nanosecond."""
    monkeypatch.setattr(sys, "argv", ["/home/someone/bin/train_wrapper.py"])
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", None)
    workdir = tmp_path / "run"
    workdir_lock.acquire(str(workdir), workdir_lock.this_command())
    try:
        assert os.listdir(workdir) == ["private"]
        (text,) = [p.read_text() for p in (workdir / "private").iterdir()]
    finally:
        workdir_lock.release(str(workdir))
    assert text == f"process {os.getpid()}: train_wrapper.py\n"
    assert socket.gethostname() not in text


def test_processes_starting_at_once_get_one_secret_seed(tmp_path):
    config = RunConfig()  # No fixed seed: each would draw its own.
    for trial in range(100):
        records = run_dir.RunDir(str(tmp_path / str(trial)))
        start, seeds = threading.Barrier(4), []

        def draw(records=records, start=start, seeds=seeds):
            start.wait()
            seeds.append((records.noise_seed(config, False), records.run_id()))

        threads = [threading.Thread(target=draw) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(set(seeds)) == 1, f"trial {trial}: {len(set(seeds))} different seeds"


def test_a_cut_short_seed_is_refused_in_one_line_never_replaced(tmp_path):
    records = run_dir.RunDir(str(tmp_path))
    os.makedirs(tmp_path / "private")
    (tmp_path / "private" / "noise_seed").write_text("")  # A kill of older code.
    with pytest.raises(InputError, match="noise_seed holds the run's secret noise seed but"):
        records.noise_seed(RunConfig(), False)
    assert (tmp_path / "private" / "noise_seed").read_text() == ""


def test_a_garbled_seed_is_refused_without_showing_its_digits(tmp_path):
    """The error names the file, never its content: a garbled seed may still be most of one."""
    records = run_dir.RunDir(str(tmp_path))
    os.makedirs(tmp_path / "private")
    (tmp_path / "private" / "noise_seed").write_text("918273645546372819x")
    with pytest.raises(InputError) as raised:
        records.noise_seed(RunConfig(), False)
    assert "9182736455" not in str(raised.value)
    assert "19 characters, not shown" in str(raised.value)


def test_private_folder_is_its_owners_alone(tmp_path):
    """Files under private/ (seed, sampler states, logs quoting private text) are unreadable
    to other local users whatever their own mode: the folder is 0700, also one made before."""
    records = run_dir.RunDir(str(tmp_path))
    (tmp_path / "private").mkdir(mode=0o755)
    records.noise_seed(RunConfig(), False)
    assert (tmp_path / "private").stat().st_mode & 0o777 == 0o700
