"""Ctrl-C and SIGTERM during a training run: a request to stop at the next micro-batch or
evaluation batch, which every process of a run honours at the same batch.

The first signal only sets a flag; the trainer looks at it (`StopSignals.check`) before each
batch, and abandons the iteration under way, saving the checkpoint of the last completed one.
A second signal stops at once (KeyboardInterrupt), except under torchrun, whose Ctrl-C
reaches each process twice. There the handlers stay until the process has left the group
(`release`, after `Processes.close`): a signal that comes late (the second of the two, or the
one torchrun passed on, when another process's stopped them all first) is not a
KeyboardInterrupt in the middle of leaving the group, which would skip `destroy_process_group`.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from gpt2.training.distributed import Processes, launched


class StopRequested(Exception):
    """Ctrl-C or SIGTERM, seen between micro-batches or evaluation batches: abandon the iteration."""


class StopSignals:
    """Whether a stop was asked for, by a signal to this process (`requested`) or to any other."""

    def __init__(self, procs: Processes):
        self.procs = procs
        self.requested = False
        self._previous: dict[int, Any] = {}  # the handlers `release` puts back

    def check(self) -> None:
        """Before each micro-batch and evaluation batch: raise StopRequested if a signal came (to
        any process: all stop at the same batch, or DDP's all-reduce and FSDP's collectives would
        wait forever)."""
        if self.procs.any(self.requested):
            raise StopRequested

    @contextmanager
    def handled(self, say: Callable[[str], None]) -> Iterator[None]:
        """Ctrl-C and SIGTERM request a stop while inside; the main process `say`s so, once. Out of
        it, one process's handlers are put back; a group's stay until `release` (the process
        leaves the group after the loop: a signal then is a request nothing acts on). Signal
        handlers belong to the main thread: on another, signals keep their handlers."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        grouped = self.procs.grouped  # (not once the group is left: the handlers may outlive it)
        looping = True

        def request_stop(signum: int, frame: object) -> None:
            # Under torchrun, Ctrl-C reaches each process twice (from the terminal, then from
            # torchrun, which kills what is left 30 s later): no second signal stops at once there.
            if self.requested and not grouped:
                raise KeyboardInterrupt
            first, self.requested = not self.requested, True
            if first and looping and self.procs.is_main:
                again = "" if grouped else " (once more to stop at once)"
                say(
                    f"gpt2: stopping at the next micro-batch or evaluation batch, with the checkpoint of the last "
                    f"completed iteration{again}"
                )

        self.release()
        self._previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            looping = False
            if not grouped:
                self.release()

    def release(self) -> None:
        """Put back the handlers `handled` replaced (nothing if none are held)."""
        previous, self._previous = self._previous, {}
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def ignore_late_signals() -> None:
    """For a process of a distributed launch that is about to end, its run stopped by a signal:
    Ctrl-C's second delivery (or the one torchrun passes on) may still come, and would interrupt
    the exit (Python's exit handlers, torch's among them) with a KeyboardInterrupt. It is ignored
    now; torchrun ends what is left 30 s after its signal. One process keeps its handlers."""
    if launched() and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
