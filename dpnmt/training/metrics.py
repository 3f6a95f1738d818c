"""Training metrics: progress lines, rates over long windows, metrics.jsonl and TensorBoard.

Rates use the EXPECTED lot size L (realised sizes are private) and are
published only as means over at least `MIN_RATE_WINDOW_LOTS` lots: a shorter
window could time one lot (how many micro-batches it took).
"""

import json
import logging
import math
import os
import struct
import time

from dpnmt import atomic_file, privacy
from dpnmt.training.run_dir import METRICS_FILE, TENSORBOARD_DIR, RunDir

MIN_RATE_WINDOW_LOTS = 50


class RateWindow:
    """Lots per second, measured only over windows of at least `MIN_RATE_WINDOW_LOTS` lots.

    A rate over a few lots could reveal how many micro-batches one lot took (its
    private size); `update` returns a rate only when a window closes, and the
    same (stale) rate until the next one closes.
    """

    def __init__(self, start_step: int, start_time: float):
        """Opens the first window at `start_step`, `start_time` (seconds)."""
        self._step, self._time = start_step, start_time
        self._rate: float | None = None
        self._closed_lots, self._closed_seconds = 0, 0.0

    def update(self, step: int, now: float) -> float | None:
        """The last closed window's lots/s (None before the first one closes)."""
        if step - self._step >= MIN_RATE_WINDOW_LOTS:
            seconds = max(now - self._time, 1e-9)
            self._rate = (step - self._step) / seconds
            self._closed_lots += step - self._step
            self._closed_seconds += seconds
            self._step, self._time = step, now
        return self._rate

    def closed(self) -> tuple[int, float]:
        """(lots, seconds) of all closed windows together: the session's only publishable timing.

        A total over the whole session would, with the windows' published rates,
        time the lots after the last closed window (fewer than the minimum).
        """
        return self._closed_lots, self._closed_seconds


def log_progress(
    writer,
    plan,
    step,
    lots_per_second: float | None,
    train_loss: float | None,
    *,
    total_epsilon: float | None = None,
):
    """Logs one progress line and its scalars.

    Rates use the EXPECTED lot size L (realised sizes are private) and come only
    from windows of at least `MIN_RATE_WINDOW_LOTS` lots (`RateWindow`);
    tokens/s is not shown. The training loss is shown for non-private runs only.
    ε spent is DP-SGD's after `step` lots and, when given, the run's total then
    (`privacy_report.total_epsilon_after`: with the vocabulary and a composed
    pretrained export, or the max with a DP export declared disjoint).
    """
    epsilon = plan.epsilon_after(step)
    loss_text = "" if train_loss is None else f"  train loss {train_loss:.4f}"
    rate_text = f"  (rates over >= {MIN_RATE_WINDOW_LOTS} lots only)"
    scalars = {"privacy/epsilon_spent": epsilon}
    epsilon_text = f"ε spent {epsilon:.4g}"
    if math.isinf(epsilon):
        epsilon_text = "non-private (ε ∞)"
    elif total_epsilon is not None:
        scalars["privacy/total_epsilon_spent"] = total_epsilon
        # What the total holds is said once, in the plan line (`training.setup._log_plan`).
        epsilon_text = f"ε spent: DP-SGD {epsilon:.4g}, total {total_epsilon:.4g}"
    if lots_per_second is not None:
        eta = (plan.num_steps - step) / max(lots_per_second, 1e-9)
        counted = "groups" if plan.unit == privacy.GROUP else "examples"  # L counts these.
        rate_text = (
            f"  {lots_per_second:.3f} lots/s  ~{lots_per_second * plan.expected_lot_size:.1f} "
            f"{counted}/s (L x lots/s, mean over >= {MIN_RATE_WINDOW_LOTS} lots)  ETA {eta:.0f} s"
        )
        scalars["train/lots_per_second"] = lots_per_second
    logging.info("step %d/%d%s%s  %s", step, plan.num_steps, rate_text, loss_text, epsilon_text)
    if train_loss is not None:
        scalars["train/loss"] = train_loss
    writer.write(step, scalars)


class MetricsWriter:
    """Scalars to `workdir/metrics.jsonl` and a TensorBoard event file in `workdir/tensorboard`.

    The event file is written here (tensorboardX's record writer and protos),
    not by tensorboardX's `SummaryWriter`, which names its file by the
    session's start second and the machine's hostname and stamps its first
    event with the exact start time: published, both identify and time the
    session. Each session writes its own numbered file
    (`RunDir.new_tensorboard_file`); every event carries one wall time.
    """

    def __init__(self, workdir: str, *, private: bool = True, resumed_step: int | None = None):
        """Opens both outputs; a resumed session first cuts metrics.jsonl to `resumed_step`.

        The rows a killed session wrote after its last checkpoint are written again
        when its lots are redone: kept, each such step would appear twice.
        """
        if resumed_step is not None:
            keep_rows_through(os.path.join(workdir, METRICS_FILE), resumed_step)
        # Deferred: only the app writes events.
        from tensorboardX.proto.event_pb2 import Event  # noqa: PLC0415
        from tensorboardX.proto.summary_pb2 import Summary  # noqa: PLC0415
        from tensorboardX.record_writer import RecordWriter  # noqa: PLC0415

        self._event, self._summary = Event, Summary
        self._jsonl = open(os.path.join(workdir, METRICS_FILE), "a")  # noqa: SIM115
        self._tensorboard = RecordWriter(RunDir(workdir).new_tensorboard_file())
        # One wall time for every event: per-event times would time the lots
        # between two log steps (see `RateWindow`). A private run's is 0: two
        # sessions' start seconds would time the first (maybe < 50 lots).
        self._walltime = 0.0 if private else float(int(time.time()))
        self._write_event(Event(wall_time=self._walltime, file_version="brain.Event:2"))

    def _write_event(self, event) -> None:
        self._tensorboard.write(event.SerializeToString())
        self._tensorboard.flush()

    def write(self, step: int, scalars: dict) -> None:
        """Appends one JSON line and one TensorBoard event (its finite scalars)."""
        numeric = {k: float(v) for k, v in scalars.items() if isinstance(v, (int, float))}
        self._jsonl.write(json.dumps({"step": step, **numeric}) + "\n")
        self._jsonl.flush()
        values = [
            self._summary.Value(tag=name, simple_value=value)
            for name, value in numeric.items()
            if math.isfinite(value)
        ]
        if values:
            summary = self._summary(value=values)
            self._write_event(self._event(wall_time=self._walltime, step=step, summary=summary))

    def close(self) -> None:
        """Flushes and closes both outputs."""
        self._jsonl.close()
        self._tensorboard.close()


def keep_rows_through(path: str, step: int) -> None:
    """Rewrites metrics.jsonl (atomically) without its rows after `step` or cut short by a kill."""
    if not os.path.exists(path):
        return
    kept = [
        line if line.endswith("\n") else line + "\n"
        for line, row in _rows(path)
        if row.get("step", 0) <= step
    ]
    atomic_file.write_atomic(path, "".join(kept))


def _rows(path: str):
    """(line, row) of each line of metrics.jsonl that is a JSON object (none if no file)."""
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                yield line, row


VALIDATION_PREFIX = "validation/"  # The scalars `actions.Validate` publishes.


def _event_steps(path: str):
    """(step, tags) of each event of a TFRecord event file; stops at a record cut short."""
    from tensorboardX.proto.event_pb2 import Event  # noqa: PLC0415 - deferred, as above.

    with open(path, "rb") as f:
        data = f.read()
    offset = 0
    while offset + 12 <= len(data):  # Length (8 bytes), its CRC, the event, its CRC.
        (length,) = struct.unpack("<Q", data[offset : offset + 8])
        if offset + 16 + length > len(data):
            return
        event = Event.FromString(data[offset + 12 : offset + 12 + length])
        yield event.step, [value.tag for value in event.summary.value]
        offset += 16 + length


def validation_published_after(workdir: str, step: int) -> int | None:
    """The first step past `step` whose validation scores are published, or None.

    Published: a metrics.jsonl row or a TensorBoard event (every session's
    file) with a `validation/` scalar. Progress rows (ε spent, rates) are not
    scores of the model and do not count.
    """
    found = [
        row.get("step", 0)
        for _, row in _rows(os.path.join(workdir, METRICS_FILE))
        if any(k.startswith(VALIDATION_PREFIX) for k in row)
    ]
    folder = os.path.join(workdir, TENSORBOARD_DIR)
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        for event_step, tags in _event_steps(os.path.join(folder, name)):
            if any(t.startswith(VALIDATION_PREFIX) for t in tags):
                found.append(event_step)
    later = [s for s in found if isinstance(s, int) and s > step]
    return min(later, default=None)
