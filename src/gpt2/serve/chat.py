"""/v1/chat/completions: a conversation, rendered by the chat template into a prompt, continued
by the completions machinery, and answered in OpenAI's chat format.

    messages ──template (add_generation_prompt)──> ids ──> rows, ChoiceStream (as a completion's)
    choices  <──ChatResponse: message / delta, logprobs' content──┘

The reply ends at <|endoftext|> (the default template's end of a turn), a stop string
("stop"), or max_completion_tokens ("length"). Its content is the text after what the template
writes between the generation prompt and a reply (`ChatTemplate.reply_prefix`: the default's
space after "Assistant:"), so that a client sending it back in the history renders it as the
model wrote it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from gpt2._checks import int_between
from gpt2.decoding import Request, start_of_text
from gpt2.errors import ChatTemplateError, ContextLengthError
from gpt2.serve.completions import ChoiceStream, CompletionResponse, TokenLogprob
from gpt2.serve.protocol import CompletionRequest, Limits, RequestError, check_fields, context_exceeded, parse_sampling, parse_streaming
from gpt2.tokenizer import Tokenizer, token_text
from gpt2.tokenizer.chat import ChatTemplate, ReplyText, check_messages

CHAT_FIELDS = {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "n", "stream",
               "stream_options", "stop", "seed", "logprobs", "top_logprobs", "user", "presence_penalty", "frequency_penalty",
               "logit_bias"}  # fmt: skip


def parse_chat(body: object, template: ChatTemplate, tokenizer: Tokenizer, n_vocab: int, n_ctx: int, limits: Limits) -> CompletionRequest:
    """Check a /v1/chat/completions body, as OpenAI's API does, and make the rows of its
    conversation's prompt; without max_tokens (or max_completion_tokens) a reply may fill the context."""
    body = check_fields(body, CHAT_FIELDS)
    messages = check_messages(text_contents(body.get("messages")))
    n, stop, sampling = parse_sampling(body, limits)
    logprobs = parse_logprobs(body)
    stream, _, include_usage, _ = parse_streaming(body)
    try:
        prompt = start_of_text(template.encode(tokenizer, messages, add_generation_prompt=True), tokenizer.eot_token)
    except ChatTemplateError as e:
        raise RequestError(400, str(e), "messages") from None
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    if body.get(key) is None:  # up to the context, and at least one token, so that a full context is refused
        max_tokens = max(n_ctx - len(prompt), 1)
    else:
        max_tokens = int_between(key, body[key], 1, n_ctx)
    try:
        request = Request.build([prompt], max_tokens, n_vocab=n_vocab, n_ctx=n_ctx, sampling=sampling, seed=body.get("seed"), n=n,
                                eos_token_id=tokenizer.eot_token, logprobs=logprobs, on_overflow="error")  # fmt: skip
    except ContextLengthError:
        raise context_exceeded([prompt], max_tokens, n_ctx, "messages") from None
    return CompletionRequest(request.prompts, request.rows(), stop, stream, False, logprobs, include_usage)


def text_contents(messages: object) -> object:
    """OpenAI's content given as a list of parts, [{"type": "text", "text": ...}, ...], as the
    text of its parts joined (no other part can be read by a model of text)."""
    if not isinstance(messages, list):
        return messages
    joined = []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            for part in content:
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise RequestError(400, f"messages[{i}].content: this model reads text only, as a string or "
                                       f'[{{"type": "text", "text": "..."}}] parts; got the part {part!r:.60}', "messages")  # fmt: skip
            message = {**message, "content": "".join(part["text"] for part in content)}
        joined.append(message)
    return joined


def parse_logprobs(body: dict) -> int | None:
    """logprobs (true or false) and top_logprobs (0 to 20, with logprobs) as the alternatives per token (None: no logprobs)."""
    wanted = False if body.get("logprobs") is None else body["logprobs"]
    if not isinstance(wanted, bool):
        raise RequestError(400, f"logprobs must be true or false, got {wanted!r}", "logprobs")
    if body.get("top_logprobs") is None:
        return 0 if wanted else None
    top = int_between("top_logprobs", body["top_logprobs"], 0, 20)
    if not wanted:
        raise RequestError(400, "top_logprobs needs logprobs set to true", "top_logprobs")
    return top


def chat_logprobs(tokenizer: Tokenizer, entries: list[TokenLogprob]) -> dict:
    """Log-probabilities as OpenAI's chat API gives them: {"content": [{token, logprob, bytes, top_logprobs}]}."""

    def token(t: int, logprob: float) -> dict:
        return {"token": token_text(tokenizer, t), "logprob": logprob, "bytes": list(tokenizer.decode_bytes([t]))}

    return {"content": [{**token(e.token, e.logprob), "top_logprobs": [token(t, lp) for t, lp in e.top]} for e in entries]}


@dataclass
class ChatResponse(CompletionResponse):
    """A chat completion's response over the completion's choices: messages whole, or deltas
    streamed (the role first, then the content, then an empty delta with the finish_reason)."""

    reply_prefix: str = ""  # what the template writes before a reply's content: not the content's
    id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex}")
    object = "chat.completion"
    replies: dict[int, ReplyText] = field(default_factory=dict)  # each streamed choice's text, less the prefix

    def _logprobs(self, choice: ChoiceStream, entries: list[TokenLogprob] | None) -> dict | None:
        return None if entries is None else chat_logprobs(choice.tokenizer, entries)

    def whole(self) -> dict:
        choices = [{"index": c.index, "message": {"role": "assistant", "content": c.text.removeprefix(self.reply_prefix)},
                    "logprobs": self._logprobs(c, c.logprobs), "finish_reason": c.finish_reason} for c in self.choices]  # fmt: skip
        return self.body(choices)

    def chunks(self, choice: ChoiceStream, piece: str) -> list[dict]:
        def chunk(delta: dict, logprobs: dict | None = None, finish: str | None = None) -> dict:
            body = {"index": choice.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            return self.body([body], usage=False, kind="chat.completion.chunk")

        chunks = []
        if choice.index not in self.replies:
            self.replies[choice.index] = ReplyText(self.reply_prefix)
            chunks.append(chunk({"role": "assistant", "content": ""}))
        text = self.replies[choice.index].add(piece, choice.done)
        # the tokens of the text given out so far (all, once the choice is done: a stop string's are gone)
        entries = choice.unsent_logprobs(None if choice.done else _given_out(choice))
        if text or entries:
            chunks.append(chunk({"content": text}, self._logprobs(choice, entries)))
        if choice.done:
            chunks.append(chunk({}, finish=choice.finish_reason))
        return chunks

    def usage_chunk(self) -> dict:
        return self.body([], kind="chat.completion.chunk")


def _given_out(choice: ChoiceStream) -> int:
    """How many of a choice's logprob entries are of text it has given out."""
    return sum(entry.offset < len(choice.text) for entry in choice.logprobs or [])
