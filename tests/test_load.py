"""`gpt2 serve` under load, small: benchmarks/load.py --quick (16 clients, 2 rounds of 4 s, a
tiny model it makes) passes its own checks: no request answered other than its kind expects,
no row left in flight after a round, no 500, no traceback in the server's log, and no memory
growth past 100 MB a round (rounds of seconds are too short to tell less from the allocator's
high-water mark; the full run's tolerance is 32 MB)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from helpers import REPO


def test_the_quick_load_benchmark_ends_every_round_at_rest_without_errors():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO / "src")}
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "load.py"), "--quick", "--seconds", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    report = result.stdout
    assert result.returncode == 0, report + result.stderr[-3000:]
    rounds = re.findall(r"^\| (\d) \| (\d+) \| [\d/]+ \| (\d+) \|", report, re.M)  # round, requests, errors
    assert [r[0] for r in rounds] == ["1", "2"] and all(
        int(requests) > 0 and errors == "0" for _, requests, errors in rounds
    )
    assert "\nerrors: 0\n" in report and "\n500s: 0\n" in report
    assert "\nrows in flight after every round: 0 (no rows active, filling or waiting)\n" in report
    assert "server log: 0 lines with Traceback or ERROR" in report and "no growth" in report
