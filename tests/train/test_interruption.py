"""`training.interruption.StopRequest`: the first Ctrl-C asks, the second stops at once."""

import os
import signal

import pytest

from dpnmt.training import interruption


def _ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)


def test_the_first_sigint_only_asks_and_the_second_raises_at_once():
    before = signal.getsignal(signal.SIGINT)
    with interruption.StopRequest() as stop:
        assert not stop.agree()
        _ctrl_c()  # Handled between two bytecodes: the lot goes on.
        assert not stop.stopping  # Nothing decided until the lot's end...
        assert stop.agree() and stop.stopping  # ...where the loop asks.
        with pytest.raises(KeyboardInterrupt) as second:
            _ctrl_c()
        assert not isinstance(second.value, interruption.TrainingInterrupted)
    assert signal.getsignal(signal.SIGINT) is before  # The old handler is back.
    with pytest.raises(interruption.TrainingInterrupted) as stopped:
        stop.raise_if_stopping(140, 453)
    assert (stopped.value.step, stopped.value.num_steps) == (140, 453)


def test_without_a_sigint_the_loop_is_never_stopped():
    with interruption.StopRequest() as stop:
        assert not any(stop.agree() for _ in range(25))
    stop.raise_if_stopping(25, 25)  # Nothing raised.


def test_sigterm_asks_as_ctrl_c_does_and_a_second_signal_stops_at_once():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with interruption.StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGTERM)  # What SLURM, Kubernetes and systemd send.
        assert stop.agree() and stop.stopping
        with pytest.raises(interruption.Stopped) as second:
            _ctrl_c()
        assert second.value.signum == signal.SIGINT
    assert {s: signal.getsignal(s) for s in before} == before
    with pytest.raises(interruption.TrainingInterrupted) as stopped:
        stop.raise_if_stopping(3, 10)
    assert stopped.value.signum == signal.SIGTERM  # dpnmt.train exits 128 + 15.
