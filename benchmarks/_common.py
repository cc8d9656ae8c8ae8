"""Helpers the benchmark scripts share."""

from __future__ import annotations

import statistics
import struct
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers import corpus  # noqa: E402  the tests' corpus: tinyshakespeare, or the stdlib's sources

__all__ = ["corpus", "mixed_corpus", "print_table", "random_124m", "timed"]


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


def random_124m():
    """transformers' GPT2LMHeadModel of the 124M shape with random weights (seed 0), in eval
    mode, and a temporary directory it is saved in, for gpt2 to load the same weights."""
    import tempfile

    import torch
    from transformers import GPT2Config as HFConfig
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(HFConfig()).eval()
    directory = tempfile.mkdtemp()
    hf.save_pretrained(directory)
    return hf, directory


# The mixed corpus's parts: (name, files in a fixed order, the most UTF-8 bytes taken from them).
_CODE_PARTS = (
    ("Python (the standard library)", lambda: sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")), 300_000),
    ("C (/usr/include)", lambda: sorted(Path("/usr/include").glob("*.h")), 250_000),
    ("Perl (/usr/share/perl*)", lambda: sorted(Path("/usr/share").glob("perl*/**/*.pm")), 120_000),
    ("JavaScript (/usr/share)", lambda: sorted(Path("/usr/share").glob("*/**/*.js")), 120_000),
    ("shell (/usr/share)", lambda: sorted(Path("/usr/share").glob("*/**/*.sh")), 60_000),
)
_LOCALES = Path("/usr/share/locale")
_TEXT_BYTES = 700_000  # translated messages, shared among the languages found
_FILE_BYTES = 20_000  # at most from one source file, so that no one file is most of a part


def mixed_corpus() -> tuple[str, str]:
    """(description, text): about 1.5 MB of source code in several programming languages and
    natural text in many languages (the translated strings of the system's gettext catalogs,
    /usr/share/locale/*/LC_MESSAGES/*.mo), from files on this machine, in a fixed order. A part
    this machine lacks is left out; the standard library's sources, always here, fill up to
    the size then. The description says what it holds: MB, parts, share of non-ASCII characters."""
    parts: list[tuple[str, str]] = []
    for name, files, limit in _CODE_PARTS:
        if text := _take(_file_texts(files()), limit):
            parts.append((name, text))
    languages = sorted(d for d in _LOCALES.glob("*") if d.is_dir()) if _LOCALES.is_dir() else []
    if languages:
        each = _TEXT_BYTES // len(languages)
        texts = (_take(_mo_strings(sorted(d.glob("LC_MESSAGES/*.mo"))), each) for d in languages)
        if text := "".join(texts):
            parts.append((f"natural text ({len(languages)} locales' gettext catalogs)", text))
    have = sum(len(text.encode("utf-8")) for _, text in parts)
    if have < 1_400_000:  # parts missing here: more of the standard library, after what was taken
        stdlib = sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))
        parts.append(("Python (more of the standard library)", _take(_file_texts(stdlib[200:]), 1_400_000 - have)))
    text = "".join(text for _, text in parts)
    non_ascii = sum(not c.isascii() for c in text) / max(len(text), 1)
    held = ", ".join(f"{name} {len(part.encode('utf-8')) / 1e6:.2f} MB" for name, part in parts)
    size = len(text.encode("utf-8")) / 1e6
    return f"mixed code and languages, {size:.2f} MB, {non_ascii:.1%} non-ASCII characters: {held}", text


def _take(texts: Iterator[str], limit: int) -> str:
    """Texts joined by newlines until `limit` UTF-8 bytes (the last one cut to fit)."""
    out, size = [], 0
    for text in texts:
        data = text.encode("utf-8")[: limit - size]
        out.append(data.decode("utf-8", errors="ignore") + "\n")
        size += len(data) + 1
        if size >= limit:
            break
    return "".join(out)


def _file_texts(paths: Sequence[Path]) -> Iterator[str]:
    for path in paths:
        try:
            yield path.read_bytes()[:_FILE_BYTES].decode("utf-8", errors="ignore")
        except OSError:
            continue


def _mo_strings(paths: Sequence[Path]) -> Iterator[str]:
    """The translated strings (msgstr) of GNU gettext catalogs, read as their format lays them out."""
    for path in paths:
        try:
            data = path.read_bytes()
            order = {0x950412DE: "<", 0xDE120495: ">"}.get(struct.unpack("<I", data[:4])[0])
            if order is None:
                continue
            count, _, translated = struct.unpack(order + "3I", data[8:20])
            for i in range(1, count):  # entry 0 is the catalog's header
                length, offset = struct.unpack(order + "2I", data[translated + 8 * i : translated + 8 * i + 8])
                yield data[offset : offset + length].replace(b"\0", b"\n").decode("utf-8")
        except (OSError, struct.error, UnicodeDecodeError):
            continue  # not UTF-8 (an old catalog) or not a catalog: skip the rest of it
