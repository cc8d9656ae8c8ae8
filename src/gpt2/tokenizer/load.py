"""The tokenizers' files, read and written, as tiktoken's load.py: the formats, not the tokenizers.

- OpenAI's two files: `encoder.json` (token -> id) and `vocab.bpe` (merge k on line k), as GPT-2 was
  released with them (shipped in `vocab/`, `GPT2_VOCAB_DIR`);
- a character vocabulary's `chars.json` ({"chars": [...]}, ids in list order);
- Hugging Face's directory, as transformers' `AutoTokenizer.from_pretrained` reads it: `vocab.json`
  and `merges.txt` (OpenAI's two files under transformers' names), `tokenizer.json` (the `tokenizers`
  library's whole pipeline), `tokenizer_config.json` (with the `chat_template`), `chat_template.jinja`.

The BPE files store bytes as printable characters (GPT-2's `bytes_to_unicode` table, e.g. the space
byte 0x20 is written "Ġ"), so that they are valid text. Functions here take and give plain data
(token bytes -> id, merges, special tokens, characters); `core` and `char` build their tokenizers
from it, and `registry.load_tokenizer` finds a directory's files.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpt2._checks import positive_int
from gpt2._files import atomic_write_text, read_json_object, writable_directory
from gpt2.errors import VocabularyError, VocabularyNotFoundError

EOT = "<|endoftext|>"  # GPT-2's one special token, an entry of its encoder.json
GPT2_VOCAB_DIR = Path(__file__).parent / "vocab"  # OpenAI's encoder.json and vocab.bpe, as released
CHARS_FILE = "chars.json"
# The files a directory's tokenizer is read from: by `load_tokenizer`, and by transformers' AutoTokenizer.
TOKENIZER_FILES = (
    "encoder.json",
    "vocab.bpe",
    "vocab.json",
    "merges.txt",
    CHARS_FILE,
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
)

Encoder = Mapping[bytes, int]  # an ordinary token's bytes -> its id
Merges = Sequence[tuple[bytes, bytes]]  # in rank order


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table from each byte value to a printable character, used in the vocab files.

    Printable Latin-1 bytes stand for themselves; the 68 others (control codes, space,
    and a few more) are shifted to code points 256 and up, in order.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


_BYTE_TO_CHAR = bytes_to_unicode()
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TO_CHAR.items()}


def to_file_form(token: bytes) -> str:
    """A token's bytes as the files write them (b" the" -> "Ġthe")."""
    return "".join(_BYTE_TO_CHAR[b] for b in token)


def from_file_form(text: str) -> bytes:
    """A token's bytes from the files' printable form ("Ġthe" -> b" the"); KeyError for a character
    outside GPT-2's byte alphabet."""
    return bytes(_CHAR_TO_BYTE[c] for c in text)


# ------------------------------------------------------------------ OpenAI's encoder.json and vocab.bpe


def files_digest(*paths: str | os.PathLike) -> bytes:
    """A digest of the files' contents (VocabularyNotFoundError for a missing one): files of the same
    digest hold the same vocabulary, whatever their paths."""
    digest = hashlib.blake2b()
    for path in map(Path, paths):
        if not path.is_file():
            raise VocabularyNotFoundError(f"vocabulary file not found: {path}")
        digest.update(hashlib.blake2b(path.read_bytes()).digest())
    return digest.digest()


def read_openai_files(
    encoder_json: str | os.PathLike, vocab_bpe: str | os.PathLike
) -> tuple[dict[bytes, int], list[tuple[bytes, bytes]], dict[str, int]]:
    """(token bytes -> id, merges in rank order, special token -> id) of OpenAI's two files;
    <|endoftext|> is the one special token. Raises VocabularyError naming the file and line at fault."""
    encoder_json, vocab_bpe = Path(encoder_json), Path(vocab_bpe)
    for path in (encoder_json, vocab_bpe):
        if not path.is_file():
            raise VocabularyNotFoundError(f"vocabulary file not found: {path}")
    raw_encoder = read_json_object(encoder_json, VocabularyError, "a JSON object of token -> id")
    encoder: dict[bytes, int] = {}
    special: dict[str, int] = {}
    for text, i in raw_encoder.items():
        if isinstance(i, bool) or not isinstance(i, int):
            raise VocabularyError(f"{encoder_json}: token {text!r} has id {i!r}, which is not an integer")
        if text == EOT:
            special[text] = i
            continue
        try:
            encoder[from_file_form(text)] = i
        except KeyError:
            raise VocabularyError(
                f"{encoder_json}: token {text!r} has characters outside GPT-2's byte alphabet"
            ) from None
    return encoder, _read_merges(vocab_bpe), special


def _read_merges(vocab_bpe: Path) -> list[tuple[bytes, bytes]]:
    try:
        lines = vocab_bpe.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise VocabularyError(f"{vocab_bpe} is not UTF-8 text: {e}") from None
    merges = []
    for number, line in enumerate(lines, start=1):
        if not line or line.startswith("#version"):
            continue
        halves = line.split(" ")
        if len(halves) != 2 or not all(halves):
            raise VocabularyError(f"{vocab_bpe}, line {number}: expected two tokens separated by a space, got {line!r}")
        try:
            merges.append((from_file_form(halves[0]), from_file_form(halves[1])))
        except KeyError:
            raise VocabularyError(
                f"{vocab_bpe}, line {number}: {line!r} has characters outside GPT-2's byte alphabet"
            ) from None
    return merges


def save_openai_files(
    directory: str | os.PathLike, encoder: Encoder, merges: Merges, special: Mapping[str, int]
) -> None:
    """Write `encoder.json` and `vocab.bpe` into `directory` (created if needed), atomically."""
    directory = writable_directory(directory)
    atomic_write_text(directory / "encoder.json", json.dumps(_file_vocabulary(encoder, special)))
    atomic_write_text(
        directory / "vocab.bpe", "#version: 0.2\n" + "".join(line + "\n" for line in _merge_lines(merges))
    )


def _file_vocabulary(encoder: Encoder, special: Mapping[str, int]) -> dict[str, int]:
    """Token (in the files' printable form, or a special token's name) -> id, in id order."""
    vocabulary = {to_file_form(token): i for token, i in encoder.items()}
    vocabulary.update(special)
    return dict(sorted(vocabulary.items(), key=lambda item: item[1]))


def _merge_lines(merges: Merges) -> list[str]:
    """The merges in rank order, each as the two tokens' printable forms joined by a space."""
    return [f"{to_file_form(a)} {to_file_form(b)}" for a, b in merges]


# ------------------------------------------------------------------ chars.json


def read_chars_file(path: str | os.PathLike) -> list:
    """The list under "chars" in the `chars.json` that `save_chars_file` writes (its entries unchecked)."""
    path = Path(path)
    if not path.is_file():
        raise VocabularyNotFoundError(f"vocabulary file not found: {path}")
    data = read_json_object(path, VocabularyError, 'a JSON object {"chars": [...]}')
    if not isinstance(data.get("chars"), list):
        raise VocabularyError(f'{path} must hold a list of characters under "chars"')
    return data["chars"]


def _chars_json(chars: Sequence[str]) -> str:
    return json.dumps({"chars": list(chars)}, ensure_ascii=False) + "\n"


def save_chars_file(directory: str | os.PathLike, chars: Sequence[str]) -> None:
    """Write `chars.json` into `directory` (created if needed), atomically."""
    directory = writable_directory(directory)
    atomic_write_text(directory / CHARS_FILE, _chars_json(chars))


# ------------------------------------------------------------------ Hugging Face's directory


def pretrained_bpe_files(encoder: Encoder, merges: Merges, special: Mapping[str, int]) -> dict[str, str]:
    """A byte-level BPE vocabulary's files as Hugging Face's GPT-2 directories hold them, but for
    tokenizer_config.json: {file name: its text}."""
    vocabulary, merge_lines = _file_vocabulary(encoder, special), _merge_lines(merges)
    added = sorted(special.items(), key=lambda item: item[1])
    pipeline = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": name,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for name, i in added
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocabulary,
            "merges": merge_lines,
        },
    }
    return {
        "vocab.json": json.dumps(vocabulary, ensure_ascii=False),
        "merges.txt": "#version: 0.2\n" + "".join(line + "\n" for line in merge_lines),
        "tokenizer.json": json.dumps(pipeline, ensure_ascii=False),
    }


def save_pretrained_bpe(
    directory: str | os.PathLike, files: Mapping[str, str], chat_template: str | None, model_max_length: int | None
) -> None:
    """A byte-level BPE vocabulary as Hugging Face's GPT-2 directories hold it (`Tokenizer.save_pretrained`):
    `files` from `pretrained_bpe_files`, and its tokenizer_config.json."""
    config = {
        "tokenizer_class": "GPT2Tokenizer",
        "bos_token": EOT,
        "eos_token": EOT,
        "unk_token": EOT,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        **chat_template_entry(chat_template),
    }
    _write_pretrained(directory, dict(files), config, model_max_length)


def save_pretrained_chars(
    directory: str | os.PathLike, chars: Sequence[str], chat_template: str | None, model_max_length: int | None
) -> None:
    """A character vocabulary as `chars.json` and a `tokenizer.json` (`CharTokenizer.save_pretrained`)."""
    pipeline = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": r"[\s\S]"}, "behavior": "Isolated", "invert": False},
        "post_processor": None,
        "decoder": {"type": "Fuse"},
        "model": {
            "type": "WordLevel",
            "vocab": {c: i for i, c in enumerate(chars)},
            "unk_token": "<unknown character>",
        },
    }
    files = {
        CHARS_FILE: _chars_json(chars),
        "tokenizer.json": json.dumps(pipeline, ensure_ascii=False),
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        **chat_template_entry(chat_template),
    }
    _write_pretrained(directory, files, config, model_max_length)


def chat_template_entry(source: str | None) -> dict[str, str]:
    """tokenizer_config.json's `chat_template`, where there is one."""
    return {} if source is None else {"chat_template": source}


def read_chat_template(directory: str | os.PathLike) -> str | None:
    """The chat template saved in a directory: `chat_template.jinja` (as newer transformers save it)
    or tokenizer_config.json's `chat_template`; None if neither holds one. A template that is not
    text (transformers' named templates, a list) raises VocabularyError naming the file."""
    directory = Path(directory)
    if (directory / "chat_template.jinja").is_file():
        return (directory / "chat_template.jinja").read_text(encoding="utf-8")
    config = directory / "tokenizer_config.json"
    if not config.is_file():
        return None
    source = read_json_object(config, VocabularyError).get("chat_template")
    if source is not None and not isinstance(source, str):
        raise VocabularyError(
            f"{config}: chat_template must be one template's text; named templates (a list) are not supported"
        )
    return source


def _write_pretrained(
    directory: str | os.PathLike, files: dict[str, str], config: dict, model_max_length: int | None
) -> None:
    """Write a tokenizer's files and its `tokenizer_config.json` into `directory` (created if needed),
    each atomically, and remove the other tokenizer files there, so that no reader finds a stale one."""
    directory = writable_directory(directory)
    if model_max_length is not None:
        config = {**config, "model_max_length": positive_int("model_max_length", model_max_length)}
    files = {**files, "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False) + "\n"}
    for name, text in files.items():
        atomic_write_text(directory / name, text)
    for name in TOKENIZER_FILES:
        if name not in files:
            (directory / name).unlink(missing_ok=True)
