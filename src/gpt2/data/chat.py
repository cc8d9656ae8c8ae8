"""Conversations to token ids: `prepare_chat`. Each conversation rendered through the chat template, its assistant's
replies marked in a mask (the targets the loss counts), split by whole conversations.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpt2._checks import real_between
from gpt2.data.files import MASK_DTYPE, Split, finish, ids_dtype, scratch_in, write_split_files
from gpt2.data.text import SPLIT_SEED, Document, find_documents
from gpt2.errors import ChatTemplateError, DataError, InputTypeError, InvalidArgumentError
from gpt2.tokenizer import EOT, Tokenizer
from gpt2.tokenizer.chat import DEFAULT_TEMPLATE, ChatTemplate, read_conversations, special_token_names
from gpt2.tokenizer.registry import parse_tokenizer_spec


def prepare_chat(
    inputs: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    tokenizer: str = "gpt2",
    val_fraction: float = 0.1,
    *,
    chat_template: str | os.PathLike | ChatTemplate | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Render and encode the conversations of JSON Lines files (`{"messages": [...]}` a line; see
    `gpt2.tokenizer.chat.read_conversations`; directories and "-" as `prepare` takes them) with
    `chat_template` (a Jinja2 file, or gpt2's default) into `out`: train.bin and val.bin, the
    conversations whole and in order (`val_fraction` of them validates), train.mask.bin and
    val.mask.bin beside them (uint8, 1 on the ids of the assistant's replies), the tokenizer's
    files, and meta.json, whose "chat" entry keeps the template. `tokenizer`: gpt2, or bpe:N
    trained on the rendered conversations. Returns the meta written."""
    val_fraction = real_between("val_fraction", val_fraction, 0, 1, open_low=True, open_high=True)
    parse_tokenizer_spec(tokenizer)
    if tokenizer == "char":
        raise InvalidArgumentError(
            "the char tokenizer cannot hold a conversation: a chat template ends each reply with "
            "<|endoftext|>, a special token a vocabulary of characters does not have; use gpt2 or bpe:N",
            "tokenizer",
        )
    template = _chat_template(chat_template)
    out = Path(out)
    with scratch_in(out, overwrite) as scratch:
        files = find_documents(inputs, scratch / "stdin.jsonl")
        encoder, meta = _write_conversations(files, out, scratch, template, tokenizer, val_fraction, progress)
    sources = {"inputs": [str(i) for i in inputs], "files": len(files)}
    return finish(out, encoder, tokenizer, {**meta, "sources": sources}, overwrite)


def _chat_template(given: str | os.PathLike | ChatTemplate | None) -> ChatTemplate:
    if given is None:
        return ChatTemplate(DEFAULT_TEMPLATE, "gpt2's default chat template")
    if isinstance(given, ChatTemplate):
        return given
    if isinstance(given, (str, os.PathLike)):
        return ChatTemplate.from_file(given)
    raise InputTypeError(
        f"chat_template is the path of a Jinja2 file or a ChatTemplate, got {given!r}", "chat_template"
    )


def split_conversations(counts: list[int], val_fraction: float) -> Split:
    """Train and validation ids of conversations of `counts` ids each, split whole: round(F * n)
    of them (at least 1, at most n - 1), drawn with a fixed seed, validate."""
    n = len(counts)
    if n < 2:
        raise DataError(
            f"{n} conversation{'s' * (n != 1)} cannot be split whole into training and validation: each split "
            f"needs one (val_fraction {val_fraction} of them validates, at least 1); give 2 or more",
            "val_fraction",
        )
    n_val = min(max(round(val_fraction * n), 1), n - 1)
    validates = set(map(int, np.random.default_rng(SPLIT_SEED).permutation(n)[:n_val]))
    starts = [0, *itertools.accumulate(counts)]  # conversation c holds ids starts[c] .. starts[c + 1]
    train: list[tuple[int, int]] = []
    val: list[tuple[int, int]] = []
    for c in range(n):
        ranges = val if c in validates else train
        if ranges and ranges[-1][1] == starts[c]:  # runs of neighbours are one range
            ranges[-1] = (ranges[-1][0], starts[c + 1])
        else:
            ranges.append((starts[c], starts[c + 1]))
    return Split(train, val, "conversations", n_val)


def _conversations(files: list[Document]) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """("FILE, line N", messages) for each conversation of the files, in order."""
    for file in files:
        for line, messages in read_conversations(file.path, file.name):
            yield f"{file.name}, line {line}", messages


def _at(where: str, render: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A template's render or encoding of the conversation at `where`; its error names the line of the file too."""
    try:
        return render(*args, **kwargs)
    except ChatTemplateError as e:
        raise ChatTemplateError(f"{where}: {e}", "chat_template") from None


def _chat_tokenizer(spec: str, template: ChatTemplate, files: list[Document], progress: bool) -> Tokenizer:
    """GPT-2's, or bpe:N trained on the rendered conversations cut at <|endoftext|>: the trained
    vocabulary's special token (as GPT-2's), never text to merge."""
    vocab_size = parse_tokenizer_spec(spec)
    if vocab_size is None:
        return Tokenizer.gpt2()
    names = special_token_names(
        Tokenizer.gpt2()
    )  # a trained vocabulary's special tokens are GPT-2's: <|endoftext|> alone
    texts = (
        piece
        for where, messages in _conversations(files)
        for piece in _at(where, template.render, messages, **names).split(EOT)
        if piece
    )
    try:
        return Tokenizer.train(texts, vocab_size, progress=progress)
    except InvalidArgumentError as e:
        raise DataError(f"cannot train a tokenizer: {e}") from None


def _write_conversations(
    files: list[Document],
    out: Path,
    scratch: Path,
    template: ChatTemplate,
    spec: str,
    val_fraction: float,
    progress: bool,
) -> tuple[Tokenizer, dict[str, Any]]:
    """Encode every conversation into scratch/all.bin and its mask into scratch/all.mask.bin,
    then cut both into out's splits. Returns the tokenizer and what meta.json says of the ids."""
    from tqdm.auto import tqdm

    encoder = _chat_tokenizer(spec, template, files, progress)
    dtype = ids_dtype(encoder.n_vocab)
    counts, replies, longest = [], 0, (0, "")
    with (
        open(scratch / "all.bin", "wb") as ids_file,
        open(scratch / "all.mask.bin", "wb") as mask_file,
        tqdm(unit="conv", desc="encoding", disable=not progress) as bar,
    ):
        for where, messages in _conversations(files):
            ids, mask = _at(where, template.encode_with_mask, encoder, messages)
            ids_file.write(np.asarray(ids, dtype=dtype).tobytes())
            mask_file.write(np.asarray(mask, dtype=MASK_DTYPE).tobytes())
            counts.append(len(ids))
            replies += sum(mask)
            longest = (len(ids), where) if len(ids) > longest[0] else longest
            bar.update()
    if not replies:
        raise DataError(
            f"{template.origin} marks no reply in {len(counts):,} conversations: the tokens to learn are those "
            f"inside {{% generation %}}...{{% endgeneration %}} blocks; put each assistant message in one",
            "chat_template",
        )
    split = split_conversations(counts, val_fraction)
    write_split_files(out, scratch, split, {"": dtype, ".mask": MASK_DTYPE})
    mask = np.memmap(scratch / "all.mask.bin", dtype=MASK_DTYPE, mode="r")
    mask_tokens = {
        name: sum(int(mask[s:e].sum()) for s, e in ranges)
        for name, ranges in (("train", split.train), ("val", split.val))
    }
    del mask
    train_tokens, val_tokens = (sum(e - s for s, e in ranges) for ranges in (split.train, split.val))
    return encoder, {
        "dtype": dtype.name,
        "train_tokens": train_tokens,
        "val_tokens": val_tokens,
        "split": {
            "val_fraction": val_fraction,
            "method": "conversations",
            "seed": SPLIT_SEED,
            "actual_val_fraction": val_tokens / (train_tokens + val_tokens),
            "val_conversations": split.val_documents,
        },
        "chat": {
            "template": template.source,
            "conversations": {"train": len(counts) - split.val_documents, "val": split.val_documents},
            "mask_tokens": mask_tokens,
            "longest": longest[0],
            "longest_at": longest[1],
        },
    }
