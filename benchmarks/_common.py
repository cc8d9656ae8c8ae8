"""Helpers the benchmark scripts share."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Median seconds of `repeat` calls of fn, and the last call's result."""
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A Markdown table, ready for benchmarks/RESULTS.md."""
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
