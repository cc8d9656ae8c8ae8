"""The evaluation sets of `gpt2 eval --task`: where each is published, how its file is read,
and the checks that name the line of a file in the wrong format. No torch here.

    lambada    OpenAI's LAMBADA test set (GPT-2's paper; lm-evaluation-harness's lambada_openai):
               lambada_test.jsonl, one {"text": ...} a line, 5,153 examples
    hellaswag  HellaSwag's validation set: hellaswag_val.jsonl, one {"ctx", "endings", "label"}
               a line, 10,042 examples
    wikitext2  WikiText-2 (raw), its test split: the Hugging Face hub's parquet file
               (Salesforce/wikitext, as `datasets.load_dataset("wikitext", "wikitext-2-raw-v1")`
               reads it), or the original wiki.test.raw

Without a file of one's own, each set is downloaded once: LAMBADA and HellaSwag from their
public homes into gpt2's cache ($GPT2_CACHE, else $XDG_CACHE_HOME/gpt2, else ~/.cache/gpt2),
WikiText-2 into the Hugging Face hub's cache. HF_HUB_OFFLINE=1 keeps every download off.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gpt2._checks import is_integer, positive_int
from gpt2._files import atomic_path, check_file, read_text, writable_directory
from gpt2._hub import download_error, hub_file
from gpt2.errors import DataError, InvalidArgumentError

LAMBADA_URL = "https://openaipublic.blob.core.windows.net/gpt-2/data/lambada_test.jsonl"
HELLASWAG_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
WIKITEXT_REPO = "Salesforce/wikitext"
WIKITEXT_FILE = "wikitext-2-raw-v1/test-00000-of-00001.parquet"
TASKS = ("lambada", "hellaswag", "wikitext2")


@dataclass(frozen=True)
class Completion:
    """A LAMBADA example: the text up to its last space, and " " + its last word."""

    context: str
    target: str


@dataclass(frozen=True)
class Choice:
    """A HellaSwag example: a context, its candidate endings, and the index of the right one."""

    context: str
    endings: tuple[str, ...]
    label: int


def check_task(name: object) -> str:
    if name not in TASKS:
        raise InvalidArgumentError(f"unknown task {name!r}: use one of {', '.join(TASKS)}")
    return name


def check_limit(limit: object) -> int | None:
    """None (every example) or a positive number of examples."""
    return None if limit is None else positive_int("limit", limit)


# ------------------------------------------------------------------ reading the files


def _json_lines(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of a JSON-lines file."""
    for number, line in enumerate(read_text(path, DataError).splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}, line {number}: not JSON ({e.msg})") from None
        if not isinstance(record, dict):
            raise DataError(f"{path}, line {number}: expected a JSON object, got {type(record).__name__}")
        yield number, record


def read_lambada(path: str | os.PathLike, limit: int | None = None) -> list[Completion]:
    """LAMBADA's examples: each line's text split at its last space (lm-evaluation-harness's split)."""
    path, examples = Path(path), []
    for number, record in _json_lines(path):
        text = record.get("text")
        if not isinstance(text, str):
            raise DataError(
                f'{path}, line {number}: expected {{"text": "..."}} (LAMBADA\'s format), got keys {sorted(record)}'
            )
        if " " not in text.strip():
            raise DataError(f"{path}, line {number}: the text {text[:40]!r} has no space before a last word")
        context, word = text.rsplit(" ", 1)
        examples.append(Completion(context, " " + word))
        if len(examples) == limit:
            break
    return _nonempty(examples, path)


def read_hellaswag(path: str | os.PathLike, limit: int | None = None) -> list[Choice]:
    """HellaSwag's examples: ctx, its endings (a list of texts) and the label (the right ending's index)."""
    path, examples = Path(path), []
    for number, record in _json_lines(path):
        ctx, endings, label = record.get("ctx"), record.get("endings"), record.get("label")
        if not (
            isinstance(ctx, str)
            and isinstance(endings, list)
            and len(endings) >= 2
            and all(isinstance(e, str) for e in endings)
        ):
            raise DataError(
                f'{path}, line {number}: expected {{"ctx": text, "endings": [texts], "label": index}} '
                f"(HellaSwag's format), got keys {sorted(record)}"
            )
        if not is_integer(label) or not 0 <= label < len(endings):
            raise DataError(
                f"{path}, line {number}: label {label!r} is not the index of one of its {len(endings)} endings"
            )
        examples.append(Choice(ctx, tuple(endings), int(label)))
        if len(examples) == limit:
            break
    return _nonempty(examples, path)


def read_wikitext(path: str | os.PathLike, limit: int | None = None) -> str:
    """WikiText's rows joined with "\\n\\n", as Hugging Face's perplexity guide joins them.

    A parquet file (the hub's) holds the rows; in the original wiki.test.raw a row is a line
    with its newline, and a blank line an empty row, as `datasets` reads it."""
    path = Path(path)
    if path.suffix == ".parquet":
        check_file(path, DataError)
        rows = _parquet_rows(path)
    else:
        rows = [line if line.strip() else "" for line in read_text(path, DataError).splitlines(keepends=True)]
    rows = rows[:limit]
    if not any(rows):
        raise DataError(f"{path} holds no text")
    return "\n\n".join(rows)


def _parquet_rows(path: Path) -> list[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path} is a parquet file, which needs pyarrow: pip install 'gpt2[eval]'") from None
    try:
        table = pq.read_table(path)
    except Exception as e:
        raise DataError(
            f"{path} is not a readable parquet file: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from None
    if "text" not in table.column_names:
        raise DataError(
            f"{path} has no 'text' column (its columns: {', '.join(table.column_names)}): not WikiText's format"
        )
    rows = table.column("text").to_pylist()
    for number, row in enumerate(rows, 1):
        if not isinstance(row, str):
            raise DataError(f"{path}, row {number}: expected a text, got {type(row).__name__}")
    return rows


def _nonempty(examples: list, path: Path) -> list:
    if not examples:
        raise DataError(f"{path} holds no examples")
    return examples


# ------------------------------------------------------------------ downloads


def cache_dir() -> Path:
    """Where gpt2 keeps what it downloads (other than models, which the hub's cache keeps)."""
    if os.environ.get("GPT2_CACHE"):
        return Path(os.environ["GPT2_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpt2"


def task_file(task: str, data: str | os.PathLike | None = None, progress: bool = True, param: str = "data") -> Path:
    """The file of a task's set: `data` if given, else the cached download (made on first use).
    `param`: the argument that gives the file, which a failed download names."""
    check_task(task)
    if data is not None:
        return Path(data)
    if task == "wikitext2":
        return _hub_file(param)
    url = LAMBADA_URL if task == "lambada" else HELLASWAG_URL
    path = cache_dir() / url.rsplit("/", 1)[1]
    if not path.is_file():
        _download(url, path, task, progress, param)
    return path


def _offline_hint(param: str) -> str:
    return f"without a network, download it elsewhere and pass its path as {param}"


def _download(url: str, path: Path, task: str, progress: bool, param: str) -> None:
    """Fetch url into path, written under a temporary name and renamed once whole."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise DataError(f"{task} is not in the cache ({path}) and HF_HUB_OFFLINE is set; {_offline_hint(param)}", param)
    from tqdm.auto import tqdm

    writable_directory(path.parent)  # an unwritable cache is said as such, before anything is fetched
    try:
        with urllib.request.urlopen(url, timeout=60) as response, atomic_path(path) as tmp, open(tmp, "wb") as out:
            size = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(
                total=size, unit="B", unit_scale=True, desc=f"downloading {path.name}", disable=not progress
            ) as bar:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
                    bar.update(len(chunk))
    except OSError as e:  # URLError, timeouts and a full disk are all OSErrors
        reason = getattr(e, "reason", None) or e.strerror or e
        raise DataError(f"could not download {task} from {url}: {reason}; {_offline_hint(param)}", param) from None


def _hub_file(param: str) -> Path:
    try:
        return hub_file(WIKITEXT_REPO, WIKITEXT_FILE, repo_type="dataset")
    except OSError as e:  # offline, unreachable, not found: all end the same way
        raise DataError(
            f"{download_error('wikitext2', WIKITEXT_REPO, e)}; "
            f"{_offline_hint(param)} (wiki.test.raw, or the hub's parquet file)",
            param,
        ) from None
