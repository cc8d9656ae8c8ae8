"""Conversations as text: a chat template renders a conversation's messages into the text a model
reads, and marks the assistant's replies, the tokens a fine-tuned model learns to write.

GPT-2 has no chat format of its own, so the format travels with a model as transformers and vLLM
keep it: a Jinja2 template in `tokenizer_config.json` (`chat_template`). Templates here are
compiled and rendered as transformers' `apply_chat_template` does (a sandboxed environment,
`trim_blocks` and `lstrip_blocks`, `raise_exception`, `tojson`, the tokenizer's special tokens
as `bos_token`/`eos_token`/`unk_token`), so a model's template gives the same text, ids and
assistant mask in both:

    >>> template = ChatTemplate(DEFAULT_TEMPLATE)
    >>> template.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    'User: Hi\\nAssistant:'

The replies are the text inside `{% generation %}` blocks (transformers' tag for
`return_assistant_tokens_mask`); `encode_with_mask` marks the tokens that cover it.
"""

from __future__ import annotations

import bisect
import contextvars
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox

from gpt2.errors import ChatTemplateError, DataError, InvalidArgumentError
from gpt2.tokenizer.char import CharTokenizer
from gpt2.tokenizer.core import Tokenizer
from gpt2.tokenizer.load import EOT

ROLES = ("system", "user", "assistant")
DEFAULT_TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")
DEFAULT_TEMPLATE = DEFAULT_TEMPLATE_PATH.read_text(encoding="utf-8")


def how_to_add(give: str) -> str:
    """What to do about a model without a chat template; `give` says how to give one where it is read."""
    return (
        f"{give} (a Jinja2 file; gpt2's default is {DEFAULT_TEMPLATE_PATH}), or fine-tune the model on conversations "
        "prepared with one, which keeps it in tokenizer_config.json"
    )


HOW_TO_ADD = how_to_add("give one with chat_template")  # the command line names its flag

# The (start, end) character spans of the {% generation %} blocks of the render under way.
_replies: contextvars.ContextVar[tuple[list[str], list[tuple[int, int]]] | None] = contextvars.ContextVar(
    "_replies", default=None
)


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: the body renders as it is, and where it falls in
    the text is noted: the assistant's reply."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_reply"), [], [], body).set_lineno(lineno)

    def _reply(self, caller: Any) -> str:
        text = caller()
        tracked = _replies.get()
        if tracked is not None:  # the text so far is what the render has yielded before this block
            pieces, spans = tracked
            start = sum(map(len, pieces))
            spans.append((start, start + len(text)))
        return text


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment() -> jinja2.Environment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env


def _template_line(e: BaseException) -> int | None:
    """The template's line where rendering failed: Jinja rewrites tracebacks to point into it."""
    line, tb = getattr(e, "lineno", None), e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


class ChatTemplate:
    """A compiled chat template. `origin` names it in errors (a file's path, or where it came from)."""

    def __init__(self, source: str, origin: str = "the chat template"):
        if not isinstance(source, str) or not source.strip():
            raise InvalidArgumentError(f"a chat template is Jinja2 text; {origin} is {source!r}", "chat_template")
        self.source, self.origin = source, origin
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(
                f"{origin} is not a valid template: {e.message} (line {e.lineno})", "chat_template"
            ) from None

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> ChatTemplate:
        """A template read from a file (UTF-8 Jinja2 text)."""
        path = Path(path)
        try:
            return cls(path.read_text(encoding="utf-8"), str(path))
        except (OSError, UnicodeDecodeError) as e:
            reason = "no such file" if isinstance(e, FileNotFoundError) else getattr(e, "strerror", None) or str(e)
            raise ChatTemplateError(f"cannot read the chat template {path}: {reason}", "chat_template") from None

    def __repr__(self) -> str:
        return f"ChatTemplate({self.origin})"

    def render(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False, **variables: Any
    ) -> str:
        """The conversation as text; `add_generation_prompt` ends it where the assistant's reply begins.
        `variables` are more names the template may read (`encode` gives the special tokens')."""
        return self._render(messages, add_generation_prompt, variables)[0]

    def _render(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool, variables: Mapping[str, Any]
    ) -> tuple[str, list[tuple[int, int]]]:
        """The text, and the (start, end) character spans of its replies."""
        messages = check_messages(messages)
        pieces: list[str] = []
        spans: list[tuple[int, int]] = []
        token = _replies.set((pieces, spans))
        try:
            for piece in self._template.generate(
                messages=messages, add_generation_prompt=add_generation_prompt, **variables
            ):
                pieces.append(piece)
        except Exception as e:  # a template is a program: any error in it is the template's
            line = _template_line(e)
            where = f" (line {line})" if line is not None else ""
            raise ChatTemplateError(f"{self.origin} failed to render{where}: {e}", "chat_template") from None
        finally:
            _replies.reset(token)
        return "".join(pieces), spans

    def encode(
        self,
        tokenizer: Tokenizer | CharTokenizer,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = False,
    ) -> list[int]:
        """The conversation's ids, as transformers' `apply_chat_template(tokenize=True)` gives them:
        the text rendered with the tokenizer's special tokens, then encoded with them allowed."""
        text, _ = self._render(messages, add_generation_prompt, special_token_names(tokenizer))
        return tokenizer.encode(text, allowed_special="all")

    def encode_with_mask(
        self, tokenizer: Tokenizer | CharTokenizer, messages: Sequence[Mapping[str, Any]]
    ) -> tuple[list[int], list[int]]:
        """The conversation's ids and a mask of them, 1 on the tokens that cover a reply (a
        `{% generation %}` block), as transformers' `return_assistant_tokens_mask` gives it."""
        text, spans = self._render(messages, False, special_token_names(tokenizer))
        ids = tokenizer.encode(text, allowed_special="all")
        starts = _token_starts(tokenizer, text, ids)
        mask = [0] * len(ids)
        for start, end in spans:
            if start == end:
                continue
            first, last = bisect.bisect_right(starts, start) - 1, bisect.bisect_right(starts, end - 1) - 1
            mask[first : last + 1] = [1] * (last + 1 - first)
        return ids, mask

    def reply_prefix(self, tokenizer: Tokenizer | CharTokenizer | None = None) -> str:
        """What the template writes between its generation prompt and an assistant message's
        content (the default's space after "Assistant:"). A model writes it as the start of its
        reply; a message holds the reply without it, so that the reply, sent back in the history,
        renders as the model wrote it. "" for a template that writes nothing there (or that cannot
        render a one-question conversation)."""
        probe = [{"role": "user", "content": "Hi"}]
        variables = {} if tokenizer is None else special_token_names(tokenizer)
        try:
            prompt = self.render(probe, True, **variables)
            whole = self.render([*probe, {"role": "assistant", "content": _PROBE}], **variables)
        except ChatTemplateError:
            return ""
        end = whole.find(_PROBE, len(prompt))
        return whole[len(prompt) : end] if whole.startswith(prompt) and end >= 0 else ""


_PROBE = "gpt2-reply-probe"  # a reply's content, found again in the rendered text


class ReplyText:
    """A reply's text as a message holds it, given piece by piece as it is generated: less the
    template's `prefix` at its start (`ChatTemplate.reply_prefix`), held back until it is known
    whether the reply begins with it."""

    def __init__(self, prefix: str):
        self.prefix, self.head = prefix, ""  # head: the reply so far, while it may be the prefix's start
        self.begun = not prefix

    def add(self, piece: str, ended: bool = False) -> str:
        """The text `piece` releases; `ended`: the reply ends with it (what was held back comes out)."""
        if self.begun:
            return piece
        self.head += piece
        if not ended and len(self.head) < len(self.prefix) and self.prefix.startswith(self.head):
            return ""
        self.begun = True
        return self.head.removeprefix(self.prefix)


def _token_starts(tokenizer: Tokenizer | CharTokenizer, text: str, ids: list[int]) -> list[int]:
    """The character of `text` where each token begins (a token that starts inside a character,
    GPT-2's bytes splitting one, counts from the character it is in)."""
    if isinstance(tokenizer, CharTokenizer):
        return list(range(len(ids)))
    char_at_byte: list[int] = []
    for i, c in enumerate(text):
        char_at_byte += [i] * len(c.encode("utf-8"))
    starts, offset = [], 0
    for token in ids:
        starts.append(char_at_byte[offset])
        offset += len(tokenizer.token_bytes(token))
    return starts


def special_token_names(tokenizer: Tokenizer | CharTokenizer) -> dict[str, str]:
    """The special tokens' names a template may read, as transformers passes them: GPT-2's
    <|endoftext|> is its bos, eos and unk token; a character vocabulary has none."""
    return {} if tokenizer.eot_token is None else {"bos_token": EOT, "eos_token": EOT, "unk_token": EOT}


def check_messages(messages: Any, *, training: bool = False) -> list[dict[str, str]]:
    """A conversation as a list of {"role", "content"} messages, each checked; `training`: it must
    hold a reply to learn from. Raises InvalidArgumentError naming the message at fault."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise InvalidArgumentError(f"messages must be a non-empty list of messages, got {_shown(messages)}", "messages")
    checked = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidArgumentError(
                f"messages[{i}] must be an object with a role and a content, got {_shown(message)}", "messages"
            )
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise InvalidArgumentError(
                f"messages[{i}].role must be one of {', '.join(ROLES)}, got {_shown(role)}", "messages"
            )
        if not isinstance(content, str):
            raise InvalidArgumentError(f"messages[{i}].content must be a string, got {_shown(content)}", "messages")
        checked.append({"role": role, "content": content})
    if training and not any(m["role"] == "assistant" for m in checked):
        raise InvalidArgumentError(
            "the conversation has no assistant message: nothing in it to learn to reply", "messages"
        )
    return checked


def read_conversations(path: str | os.PathLike, name: str | None = None) -> Iterator[tuple[int, list[dict[str, str]]]]:
    """(line number, messages) for each conversation of a JSON Lines file in OpenAI's fine-tuning
    format, `{"messages": [{"role": ..., "content": ...}, ...]}` a line, each checked for training
    (`check_messages`). Blank lines are skipped; other keys (a message's "name", a line's "tools")
    are ignored, but a message's "weight" other than 1 is refused: every reply is learned here.
    Raises DataError naming the file (`name`, default the path) and the line, or a file without one."""
    name = str(path) if name is None else name
    found = False
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{name}, line {number}"
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise DataError(f"{where}: not a JSON object ({e})") from None
            if not isinstance(record, dict) or "messages" not in record:
                got = (
                    f"an object with the keys {', '.join(map(str, record)) or 'none'}"
                    if isinstance(record, dict)
                    else f"a JSON {type(record).__name__}"
                )
                raise DataError(f'{where}: a conversation is an object {{"messages": [...]}}, got {got}')
            try:
                messages = check_messages(record["messages"], training=True)
            except InvalidArgumentError as e:
                raise DataError(f"{where}: {e}") from None
            _check_weights(record["messages"], where)
            found = True
            yield number, messages
    if not found:
        raise DataError(
            f'{name} holds no conversations: give one a line, {{"messages": [{{"role": ..., "content": ...}}, ...]}}'
        )


def _check_weights(messages: list[Mapping[str, Any]], where: str) -> None:
    """OpenAI's "weight": 0 leaves a reply out of training; gpt2 learns every reply, so only 1 is taken."""
    for i, message in enumerate(messages):
        if message.get("weight", 1) != 1:
            raise DataError(
                f"{where}: messages[{i}].weight is {_shown(message['weight'])}: every reply is learned (weight 1); "
                f"leave out the key, or the conversation"
            )


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
