"""Ctrl-C and SIGTERM during training: the first asks for a stop, a second stops at once.
(A run that stops and resumes bit for bit is tested in test_training_train.py and test_training_distributed.py.)"""

from __future__ import annotations

import os
import signal

import pytest
import torch

from gpt2.training.distributed import Processes
from gpt2.training.stopping import StopRequested, StopSignals


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_asks_for_a_stop_and_a_second_stops_at_once(signum):
    stop, said = StopSignals(Processes(torch.device("cpu"))), []
    before = signal.getsignal(signum)
    with stop.handled(said.append):
        stop.check()  # no signal yet: goes on
        os.kill(os.getpid(), signum)
        assert stop.requested
        assert said == ["gpt2: stopping at the next micro-batch or evaluation batch, with the checkpoint of the last "
                        "completed iteration (once more to stop at once)"]  # fmt: skip
        with pytest.raises(StopRequested):
            stop.check()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signum)
    assert signal.getsignal(signum) is before  # the handlers are put back
