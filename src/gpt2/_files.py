"""File helpers shared by everything that writes to disk."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import shutil
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gpt2.errors import UnwritablePathError


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds.

    A crash or Ctrl-C mid-write leaves the old file (if any) untouched and no half-written
    file behind, because a rename within one directory is atomic on POSIX and Windows.
    The file gets the permissions the user's umask gives any new file (0644 under umask 022).
    An OSError of its own (the temporary file cannot be made, or renamed) is an
    `UnwritablePathError` naming `path` and why; the writer's own errors pass as they are.
    """
    path = Path(path)
    try:
        tmp = _new_file_beside(path)
        mode = stat.S_IMODE(os.stat(tmp).st_mode)
    except OSError as e:
        raise UnwritablePathError(f"cannot write {path}: {_why_unwritable(path.parent, e, made=False)}") from None
    try:
        yield tmp
        os.chmod(tmp, mode)  # a writer may have made the file anew: safetensors' save_file does, as 0600
        try:
            os.replace(tmp, path)
        except OSError as e:
            reason = f"{path} is a directory" if path.is_dir() else _os_reason(e)
            raise UnwritablePathError(f"cannot write {path}: {reason}") from None
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a new directory beside `path` to write files into; rename it onto `path` only if the
    block succeeds, so that `path` holds the whole set or nothing (an export: a model and its
    files). `path` must not hold anything yet: an empty directory is replaced, anything else is
    an `UnwritablePathError`, never overwritten. The directory gets the user's umask's mode."""
    path = Path(path)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UnwritablePathError(
            f"{path} already exists{'' if path.is_dir() else ' as a file'}: give a new directory, or remove it first"
        )
    writable_directory(path.parent)
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            tmp.mkdir(0o777)  # less the umask, as mkdir makes directories
            break
        except FileExistsError:
            continue
    try:
        yield tmp
        if path.is_dir():
            path.rmdir()
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _new_file_beside(path: Path) -> Path:
    """A new empty file in path's directory, under a name no one else uses.

    Created with mode 0666 less the umask, as open() creates files; tempfile.mkstemp would
    give 0600, and a model saved for a team could be read by no one else.
    """
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def writable_directory(path: str | os.PathLike) -> Path:
    """Make the directory `path` (its parents too) that files are about to be written into, and
    prove it writable by making and removing a file in it; else an `UnwritablePathError` naming
    it and why. Writers call it before their work, not after: a run must not train for an hour
    and then find that it cannot save."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        os.unlink(_new_file_beside(path / "write-test"))
    except OSError as e:
        raise UnwritablePathError(f"cannot write into {path}: {_why_unwritable(path, e, made=True)}") from None
    return path


def _why_unwritable(directory: Path, error: OSError, made: bool) -> str:
    """Why nothing can be written in `directory`, in words: the part of its path in the way, or
    the OS's reason. `made`: whether the directory was to be made if missing."""
    existing = next(p for p in (directory, *directory.parents) if os.path.lexists(p))  # "/" or "." at the latest
    if not existing.is_dir():
        return f"{existing} is {'a file' if existing.is_file() else 'something else'}, not a directory"
    if existing != directory and not made:
        return f"the directory {directory} does not exist"
    if error.errno == errno.ENOENT:  # the directory exists, yet no name can be made in it: /proc
        return f"{existing} takes no new files or directories ({_os_reason(error)})"
    return _os_reason(error) + ("" if existing == directory else f" in {existing}")


def _os_reason(error: OSError) -> str:
    """The OS's words for an error ("read-only file system", "permission denied")."""
    reason = error.strerror or str(error)
    return reason[:1].lower() + reason[1:]


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def read_json_object(path: Path, error: type[Exception], what: str = "a JSON object") -> dict[str, Any]:
    """The JSON object in `path`; anything else raises `error` naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise error(f"{path} must hold {what}")
    return data


def check_file(path: Path, error: type[Exception]) -> None:
    """Raise `error` naming `path` unless it is an existing file."""
    if not path.is_file():
        raise error(f"{path} does not exist" if not path.exists() else f"{path} is not a file")


def read_text(path: Path, error: type[Exception]) -> str:
    """The UTF-8 text of a file; a missing file, a directory, or bytes that are not UTF-8 (the
    first bad one named with its offset) raise `error`."""
    check_file(path, error)
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path} is not UTF-8 text: byte 0x{raw[e.start]:02x} at offset {e.start}") from None


class BackgroundWriter:
    """Writes files in a thread of its own, one batch of writes at a time, while the caller goes on
    (a training run: its checkpoint, best model and plot, off the loop's critical path).

    `write(fn)` first waits for the batch before it, then runs `fn` in a new thread; `wait()` waits
    for the last one. Whatever a batch raised is raised again in the caller's thread by the next
    `write` or `wait`; `finish()` waits without raising (for a caller already stopping with an error
    of its own). The thread is not a daemon: a process that exits waits for its files. The caller
    hands `fn` copies of what it writes, since it goes on changing the originals.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def write(self, fn: Callable[[], None]) -> None:
        self.wait()
        self._thread = threading.Thread(target=self._run, args=(fn,), name="gpt2-writer")
        self._thread.start()

    def _run(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as e:  # kept for the caller's thread, which raises it
            self._error = e

    def wait(self) -> None:
        """Wait for the last batch of writes; raise its error, if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def finish(self) -> None:
        """Wait for the last batch of writes, dropping its error."""
        with contextlib.suppress(Exception):
            self.wait()
