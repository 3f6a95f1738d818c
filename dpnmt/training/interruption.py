"""Ctrl-C during training: finish the lot, commit a checkpoint at its boundary, then stop.

The loop (`dpnmt.training.loop`) runs its lots inside a `StopRequest`. The
first SIGINT only sets a flag: the lot in progress finishes (its noise is
drawn and applied, so it is spent and counted), the loop commits a checkpoint
of the state after it and raises `TrainingInterrupted`. A saved state is
always one at a lot boundary: its step is the number of lots applied to its
parameters, which is what the accountant counts. A second SIGINT abandons
the lot at once (a plain `KeyboardInterrupt`): nothing of it is saved, and a
resume redoes it from the last committed checkpoint, as after a crash.
"""

import logging
import signal
import threading

import jax

from dpnmt import distributed

MULTI_PROCESS_EVERY = 10  # Lots between two Ctrl-C agreements of several processes.


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on Ctrl-C after committing the checkpoint of lot `step`.

    Attributes:
      step: lots done and committed; a resume starts with lot `step`.
      num_steps: the run's planned lots T.
    """

    def __init__(self, step: int, num_steps: int):
        super().__init__(f"interrupted after lot {step} of {num_steps}; checkpoint saved")
        self.step, self.num_steps = step, num_steps


class StopRequest:
    """A context in which the first SIGINT asks the loop to stop at the next lot boundary.

    Outside the main thread (signals cannot be caught there) it changes nothing.
    In a multi-process run process 0's request decides (`distributed.agree`),
    at most `MULTI_PROCESS_EVERY` lots later.
    """

    def __init__(self):
        """Not yet installed; `with` installs the handler and restores the old one."""
        self._requested = self._stopping = False
        self._previous, self._calls = None, 0

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _handle(self, signum, frame) -> None:
        if self._requested:  # The second Ctrl-C: abandon the lot now.
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        self._requested = True
        logging.warning(
            "Ctrl-C: finishing this lot, then saving a checkpoint "
            "(Ctrl-C again stops at once: the lots since the last checkpoint are then redone)."
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
        """Raises `TrainingInterrupted` if the loop stopped on Ctrl-C (its state committed)."""
        if self._stopping:
            raise TrainingInterrupted(step, num_steps)
