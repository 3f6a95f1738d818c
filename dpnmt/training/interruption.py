"""Ctrl-C or SIGTERM during training: finish the lot, commit a checkpoint at its boundary, stop.

The loop (`dpnmt.training.loop`) runs its lots inside a `StopRequest`. The
first SIGINT (Ctrl-C) or SIGTERM (what SLURM, Kubernetes and systemd send
first) only sets a flag: the lot in progress finishes (its noise is drawn and
applied, so it is spent and counted), the loop commits a checkpoint of the
state after it and raises `TrainingInterrupted`. A saved state is always one
at a lot boundary: its step is the number of lots applied to its parameters,
which is what the accountant counts. A second signal abandons the lot at
once (`Stopped`, a `KeyboardInterrupt`): nothing of it is saved, and a resume
redoes it from the last committed checkpoint, as after a crash. Outside the
lots (start-up, compiling, the final evaluation) SIGTERM stops at once as
Ctrl-C does (`dpnmt.train` raises `Stopped`). `dpnmt.train` exits with 128 + the
signal's number: 130 for SIGINT, 143 for SIGTERM.
"""

import logging
import signal
import threading

import jax

from dpnmt import distributed

MULTI_PROCESS_EVERY = 10  # Lots between two Ctrl-C agreements of several processes.


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


class Stopped(KeyboardInterrupt):
    """A signal that stops at once: outside the lots, or the second (nothing since a checkpoint).

    Attributes:
      signum: the signal (`signal.SIGINT` or `signal.SIGTERM`).
    """

    def __init__(self, signum: int):
        super().__init__(f"stopped by {_NAMES.get(signum, signum)}")
        self.signum = signum


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on Ctrl-C or SIGTERM after committing the checkpoint of lot `step`.

    Attributes:
      step: lots done and committed; a resume starts with lot `step`.
      num_steps: the run's planned lots T.
      signum: the signal that asked for it.
    """

    def __init__(self, step: int, num_steps: int, signum: int = signal.SIGINT):
        super().__init__(f"interrupted after lot {step} of {num_steps}; checkpoint saved")
        self.step, self.num_steps, self.signum = step, num_steps, signum


class StopRequest:
    """A context in which a first SIGINT or SIGTERM asks the loop to stop at the next lot boundary.

    Outside the main thread (signals cannot be caught there) it changes nothing.
    In a multi-process run process 0's request decides (`distributed.agree`),
    at most `MULTI_PROCESS_EVERY` lots later.
    """

    def __init__(self):
        """Not yet installed; `with` installs the handlers and restores the old ones."""
        self._requested = self._stopping = False
        self._previous, self._calls, self._signum = {}, 0, signal.SIGINT

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        if self._requested:  # The second signal: abandon the lot now.
            self.__exit__()
            raise Stopped(signum)
        self._requested, self._signum = True, signum
        logging.warning(
            "%s: finishing this lot, then saving a checkpoint (Ctrl-C or SIGTERM again stops "
            "at once: the lots since the last checkpoint are then redone).",
            _NAMES.get(signum, signum),
        )

    @property
    def stopping(self) -> bool:
        """Whether the last `agree` decided to stop after this lot."""
        return self._stopping

    def agree(self) -> bool:
        """Whether every process stops after this lot (process 0's request decides).

        Called once a lot. One process decides at once. Several agree on every
        `MULTI_PROCESS_EVERY`-th call only (every process makes the same calls):
        the agreement is a collective that waits for the lot's update, which would
        otherwise keep the next lot from being queued behind it.
        """
        self._calls += 1
        if jax.process_count() == 1 or self._calls % MULTI_PROCESS_EVERY == 0:
            self._stopping = distributed.agree(self._requested)
        return self._stopping

    def raise_if_stopping(self, step: int, num_steps: int) -> None:
        """Raises `TrainingInterrupted` if the loop stopped on a signal (its state committed)."""
        if self._stopping:
            raise TrainingInterrupted(step, num_steps, self._signum)
