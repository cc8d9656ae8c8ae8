"""Ctrl-C and SIGTERM during a training run: a request to stop at the next micro-batch or
evaluation batch, which every process of a run honours at the same batch.

The first signal only sets a flag; the trainer looks at it (`StopSignals.check`) before each
batch, and abandons the iteration under way, saving the checkpoint of the last completed one.
A second signal stops at once (KeyboardInterrupt), except under torchrun, whose Ctrl-C
reaches each process twice.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from gpt2.training.distributed import Processes


class StopRequested(Exception):
    """Ctrl-C or SIGTERM, seen between micro-batches or evaluation batches: abandon the iteration."""


class StopSignals:
    """Whether a stop was asked for, by a signal to this process (`requested`) or to any other."""

    def __init__(self, procs: Processes):
        self.procs = procs
        self.requested = False

    def check(self) -> None:
        """Before each micro-batch and evaluation batch: raise StopRequested if a signal came (to
        any process: all stop at the same batch, or DDP's all-reduce and FSDP's collectives would
        wait forever)."""
        if self.procs.any(self.requested):
            raise StopRequested

    @contextmanager
    def handled(self, say: Callable[[str], None]) -> Iterator[None]:
        """Ctrl-C and SIGTERM request a stop while inside; the main process `say`s so. Signal
        handlers belong to the main thread: on another, signals keep their handlers."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def request_stop(signum: int, frame: object) -> None:
            # Under torchrun, Ctrl-C reaches each process twice (from the terminal, then from
            # torchrun, which kills what is left 30 s later): no second signal stops at once there.
            if self.requested and not self.procs.grouped:
                raise KeyboardInterrupt
            self.requested = True
            if self.procs.is_main:
                again = "" if self.procs.grouped else " (once more to stop at once)"
                say(f"gpt2: stopping at the next micro-batch or evaluation batch, with the checkpoint of the last "
                    f"completed iteration{again}")  # fmt: skip

        previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
