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
from functools import partial
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from gpt2.errors import ChatTemplateError
from gpt2.generation import decoding
from gpt2.serve.completions import ChoiceStream, CompletionResponse, TokenLogprob, answer
from gpt2.serve.protocol import Bounds, ChatBody, CompletionRequest, RequestError, within_context
from gpt2.serve.server import ModelRoute, Server
from gpt2.tokenizer import Tokenizer, token_text
from gpt2.tokenizer.chat import ChatTemplate, ReplyText

router = APIRouter(route_class=ModelRoute)


def server_template(request: Request) -> ChatTemplate:
    """The server's chat template, or a 400 saying there is none, before the body is read (a dependency)."""
    return request.app.state.server.template()


@router.post("/v1/chat/completions")
async def chat_completions(
    body: ChatBody, request: Request, template: Annotated[ChatTemplate, Depends(server_template)]
) -> Response:
    server: Server = request.app.state.server
    completion = parse_chat(body, template, server.tokenizer, server.bounds())
    return await answer(server, request, completion, partial(ChatResponse, reply_prefix=server.reply_prefix))


def parse_chat(body: ChatBody, template: ChatTemplate, tokenizer: Tokenizer, bounds: Bounds) -> CompletionRequest:
    """The rows of a /v1/chat/completions body that FastAPI has checked against `ChatBody`: its
    conversation's prompt through the template; without max_tokens (or max_completion_tokens)
    a reply may fill the context."""
    if body.top_logprobs is not None and not body.logprobs:
        raise RequestError(400, "top_logprobs needs logprobs set to true", "top_logprobs")
    logprobs = (body.top_logprobs or 0) if body.logprobs else None  # the alternatives per token (None: no logprobs)
    try:
        messages = [message.as_dict() for message in body.messages]
        prompt = decoding.start_of_text(
            template.encode(tokenizer, messages, add_generation_prompt=True), tokenizer.eot_token
        )
    except ChatTemplateError as e:
        raise RequestError(400, str(e), "messages") from None
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    if max_tokens is None:  # up to the context, and at least one token, so that a full context is refused
        max_tokens = max(bounds.n_ctx - len(prompt), 1)
    within_context(
        [prompt], max_tokens, bounds.n_ctx, "messages"
    )  # before max_tokens' bound, n_ctx: this names the room left
    body = body.within(bounds)
    # every part is checked above: Request.build would check them again
    request = decoding.Request(
        [prompt],
        max_tokens,
        body.sampling(),
        body.seed,
        body.n,
        tokenizer.eot_token,
        logprobs,
        processing=body.processing(tokenizer, bounds.n_vocab),
    )
    return CompletionRequest(
        request.prompts, request.rows(), body.stops(), body.stream, False, logprobs, body.include_usage
    )


def chat_logprobs(tokenizer: Tokenizer, entries: list[TokenLogprob]) -> dict:
    """Log-probabilities as OpenAI's chat API gives them: {"content": [{token, logprob, bytes, top_logprobs}]}."""

    def token(t: int, logprob: float) -> dict:
        return {"token": token_text(tokenizer, t), "logprob": logprob, "bytes": list(tokenizer.decode_bytes([t]))}

    return {
        "content": [{**token(e.token, e.logprob), "top_logprobs": [token(t, lp) for t, lp in e.top]} for e in entries]
    }


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
        choices = [
            {
                "index": c.index,
                "message": {"role": "assistant", "content": c.text.removeprefix(self.reply_prefix)},
                "logprobs": self._logprobs(c, c.logprobs),
                "finish_reason": c.finish_reason,
            }
            for c in self.choices
        ]
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
