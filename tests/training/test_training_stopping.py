"""Ctrl-C and SIGTERM during training: the first asks for a stop, a second stops at once.
(A run that stops and resumes bit for bit is tested in test_training_train.py and test_training_distributed.py.)"""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest
import torch

from gpt2.training.distributed import Processes
from gpt2.training.stopping import StopRequested, StopSignals, ignore_late_signals


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_asks_for_a_stop_and_a_second_stops_at_once(signum):
    stop, said = StopSignals(Processes(torch.device("cpu"))), []
    before = signal.getsignal(signum)
    with stop.handled(said.append):
        stop.check()  # no signal yet: goes on
        os.kill(os.getpid(), signum)
        assert stop.requested
        assert said == [
            "gpt2: stopping at the next micro-batch or evaluation batch, with the checkpoint of the last "
            "completed iteration (once more to stop at once)"
        ]
        with pytest.raises(StopRequested):
            stop.check()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signum)
    assert signal.getsignal(signum) is before  # the handlers are put back


def test_in_a_group_a_late_signal_is_a_request_until_the_group_is_left():
    """Under torchrun a process gets Ctrl-C twice (the terminal's, then torchrun's), or gets its
    own after another process's signal stopped them all: it may come after the loop, while the
    process leaves the group (destroy_process_group), where a KeyboardInterrupt would cut that
    short. A group's handlers stay until `release`: said once, never a KeyboardInterrupt."""
    procs = SimpleNamespace(
        grouped=True, is_main=True, any=lambda flag: flag
    )  # a group's rank 0, as StopSignals sees it
    stop, said = StopSignals(procs), []
    before = signal.getsignal(signal.SIGINT)
    try:
        with stop.handled(said.append):
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)  # the same Ctrl-C again: no KeyboardInterrupt
            with pytest.raises(StopRequested):
                stop.check()
        os.kill(os.getpid(), signal.SIGINT)  # after the loop: the process is leaving the group
        procs.grouped = False  # left it (destroy_process_group), still holding the handlers
        os.kill(os.getpid(), signal.SIGINT)
        assert said == [
            "gpt2: stopping at the next micro-batch or evaluation batch, with the checkpoint of the last "
            "completed iteration"
        ]
        assert signal.getsignal(signal.SIGINT) is not before
    finally:
        stop.release()
    assert signal.getsignal(signal.SIGINT) is before  # put back


def test_a_launched_process_ignores_signals_once_its_stopped_run_is_over(monkeypatch):
    """`gpt2 train` under torchrun, its run stopped: the process ends, and a signal that comes
    late (Ctrl-C's second delivery) is no KeyboardInterrupt in its exit handlers."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        monkeypatch.delenv("RANK", raising=False)
        ignore_late_signals()  # one process: its handlers stay
        assert {sig: signal.getsignal(sig) for sig in before} == before
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", "2")
        ignore_late_signals()
        assert signal.getsignal(signal.SIGINT) == signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGINT)  # nothing happens
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
