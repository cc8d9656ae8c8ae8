"""GET /v1/runs...: training runs followed as `gpt2 train` writes them (`gpt2 serve --runs DIR`), for the
playground's Training view and any client. Read-only; the files are read at each request.

    /v1/runs                        -> {"runs": [{"name", "iter", "evaluations"}]}
    /v1/runs/{name}/log?since=K     -> {"records": [log.jsonl's records from line K on], "next": N, "reset": bool}
    /v1/runs/{name}/probes?since=K  -> the same of probes.jsonl (a record per evaluation: head scores, attention, ...)

DIR is a run's directory (it holds log.jsonl or probes.jsonl, or holds nothing yet: a run to come), or a
directory of runs: its subdirectories that hold either, listed again at each request, so that a run started
later appears. A run is named by its directory's name: DIR's own where DIR is the run (a name, not ".", which
clients and browsers take out of a URL's path). "iter" is the last record's iteration in log.jsonl (None before
the first), "evaluations" probes.jsonl's records; the runs come most recently written first. A server
started without runs lists none.

`since` counts whole lines: a last line without its newline, still being written, is answered once it is whole.
"next" is the line to ask from next; an answer holds at most MAX_RECORDS records (and MAX_BYTES of them, one
at least), so that a client pages through a long file. A resumed run rewrites both files cut back to its
checkpoint: where a file now has fewer lines than `since`, the answer is all of it, from line 0, with "reset".
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gpt2.errors import InvalidArgumentError
from gpt2.serve.protocol import RequestError
from gpt2.training.loggers import LOG
from gpt2.training.probes import PROBES

FILES = {"log": LOG, "probes": PROBES}
MAX_RECORDS = {"log": 20_000, "probes": 50}  # an answer's records at most; a probe's hold its attention, T x T a head
MAX_BYTES = 8 * 2**20  # and their lines' bytes at most, past the first record: a big model's probes are MBs each

router = APIRouter(prefix="/v1/runs")


@dataclass
class _Lines:
    """Where a file's whole lines end, found once and extended as the file grows: a poll reads only what is new."""

    identity: tuple[int, int]  # (st_dev, st_ino): an atomic rewrite is another file
    ends: list[int] = field(default_factory=list)  # the offset after each whole line's newline


class RunsDirectory:
    """`gpt2 serve --runs DIR`: its runs, and their files' lines (each file's line ends kept between requests)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_dir():
            raise InvalidArgumentError(
                f"runs {str(path)!r} is not a directory: give a training run's directory (gpt2 train's out) "
                "or a directory of them",
                "runs",
            )
        self.lines: dict[Path, _Lines] = {}
        self.lock = threading.Lock()  # the routes run in FastAPI's threads

    def runs(self) -> dict[str, Path]:
        """{name: directory}, most recently written first: DIR itself where it is a run (or where no subdirectory
        is one yet), else its subdirectories that are."""
        if _is_run(self.path):
            return {_name(self.path): self.path}
        found = [p for p in self.path.iterdir() if p.is_dir() and _is_run(p)]
        if not found:
            return {_name(self.path): self.path}
        found.sort(key=lambda p: (-_written(p), p.name))
        return {p.name: p for p in found}

    def run(self, name: str) -> Path:
        """The directory of the run named `name`, or a 400 for a name that is no directory's, a 404 for one unknown."""
        if name in ("", ".", "..") or any(c in name for c in "/\\\0"):
            raise RequestError(400, f"{name!r} is not a run's name: a run is named by its directory's name", "name")
        runs = self.runs()
        if name not in runs:
            raise RequestError(
                404,
                f"there is no run {name!r} in {self.path}: the runs are {', '.join(map(repr, runs))}",
                "name",
                "run_not_found",
            )
        return runs[name]

    def _ends(self, f: BinaryIO, path: Path) -> list[int]:
        """The offsets after each whole line of the file `f`, open on `path`."""
        with self.lock:
            stat = os.fstat(f.fileno())
            known = self.lines.get(path)
            if known is None or known.identity != (stat.st_dev, stat.st_ino) or stat.st_size < _last(known.ends):
                known = self.lines[path] = _Lines((stat.st_dev, stat.st_ino))  # new, rewritten or cut: read anew
            start = _last(known.ends)
            f.seek(start)
            data = f.read(stat.st_size - start)  # up to the size seen: a line appended since waits for the next poll
            at = data.find(b"\n")
            while at >= 0:
                known.ends.append(start + at + 1)
                at = data.find(b"\n", at + 1)
            return list(known.ends)

    def read(self, path: Path, kind: str, since: int) -> dict[str, Any]:
        """The answer of /v1/runs/{name}/{kind}?since=K: records from line K on, "next" and "reset"."""
        try:
            f = open(path, "rb")
        except FileNotFoundError:  # a run whose first record is still to come
            return {"records": [], "next": 0, "reset": since > 0}
        with f:  # one open file throughout: a rewrite (os.replace) meanwhile is another file, for the next poll
            ends = self._ends(f, path)
            reset = since > len(ends)
            first = last = 0 if reset else since
            begin = _start(ends, first)
            while last < min(len(ends), first + MAX_RECORDS[kind]) and (
                last == first or ends[last] - begin <= MAX_BYTES
            ):
                last += 1
            f.seek(begin)
            data = f.read(_start(ends, last) - begin)
        records = []
        for number in range(first, last):
            line = data[_start(ends, number) - begin : ends[number] - begin]
            try:
                records.append(json.loads(line))
            except ValueError:
                raise RequestError(500, f"line {number + 1} of {path} is not JSON", kind="server_error") from None
        return {"records": records, "next": last, "reset": reset}

    def summary(self, name: str, directory: Path) -> dict[str, Any]:
        """A run as /v1/runs lists it: its name, its last iteration (None before any record) and its evaluations."""
        last = None
        with contextlib.suppress(FileNotFoundError), open(directory / LOG, "rb") as f:
            ends = self._ends(f, directory / LOG)
            if ends:
                f.seek(_start(ends, len(ends) - 1))
                with contextlib.suppress(ValueError, AttributeError):  # a line that is no record: no iteration
                    last = json.loads(f.read(ends[-1] - _start(ends, len(ends) - 1))).get("iter")
        evaluations = 0
        with contextlib.suppress(FileNotFoundError), open(directory / PROBES, "rb") as f:
            evaluations = len(self._ends(f, directory / PROBES))
        return {"name": name, "iter": last, "evaluations": evaluations}


def _is_run(path: Path) -> bool:
    return any((path / name).is_file() for name in FILES.values())


def _written(path: Path) -> float:
    """When the run's files were last written (0 for none)."""
    times = []
    for name in FILES.values():
        with contextlib.suppress(OSError):  # not there (yet, or any more)
            times.append((path / name).stat().st_mtime)
    return max(times, default=0.0)


def _name(path: Path) -> str:
    return path.resolve().name or str(path.resolve())  # "/" has no name


def _last(ends: list[int]) -> int:
    return ends[-1] if ends else 0


def _start(ends: list[int], line: int) -> int:
    return ends[line - 1] if line > 0 else 0


def _since(since: str | None) -> int:
    """?since=K, a whole number of lines (read here, not by FastAPI: a bad one is our 400, in our words)."""
    if since is None:
        return 0
    if not since.isascii() or not since.isdigit():
        raise InvalidArgumentError(f"since must be a whole number of lines, got {since!r}", "since")
    return int(since)


def _json(body: dict[str, Any]) -> Response:
    """The answer as JSON; a NaN or an infinity a record holds (Python's json writes them, JSON has none) as null."""
    try:
        content = json.dumps(body, allow_nan=False)
    except ValueError:
        content = json.dumps(_finite(body), allow_nan=False)
    return Response(content, media_type="application/json")


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _directory(request: Request) -> RunsDirectory | None:
    request.app.state.server.check_key(request)
    return request.app.state.runs


def _run(request: Request, name: str) -> tuple[RunsDirectory, Path]:
    directory = _directory(request)
    if directory is None:
        raise RequestError(
            404, f"there is no run {name!r}: this server follows no training runs", "name", "run_not_found"
        )
    return directory, directory.run(name)


@router.get("")
def runs(request: Request) -> Response:
    directory = _directory(request)
    listed = {} if directory is None else directory.runs()
    return _json({"runs": [directory.summary(name, path) for name, path in listed.items()]})


@router.get("/{name}/log")
def log(name: str, request: Request, since: str | None = None) -> Response:
    directory, run = _run(request, name)
    return _json(directory.read(run / LOG, "log", _since(since)))


@router.get("/{name}/probes")
def probes(name: str, request: Request, since: str | None = None) -> Response:
    directory, run = _run(request, name)
    return _json(directory.read(run / PROBES, "probes", _since(since)))
