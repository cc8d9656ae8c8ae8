"""POST /v1/completions, and serving any completion: its rows go to the scheduler, and their
tokens come back as OpenAI's response, whole or as Server-Sent Events.

Each choice's text is released as its row's tokens arrive (`ChoiceStream`: half characters
and possible stop strings held back, log-probabilities as OpenAI's API reports them); the
response (`CompletionResponse`) shares the id, time, model and usage of all its choices.

A model that comes with no tokenizer writes no text: each choice's text is "" and its tokens are
its token_ids (and prompt_token_ids), given whether or not return_token_ids asked, streamed a
chunk a token; log-probabilities name each token "token_id:N" (`protocol.token_name`), at offset 0.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from gpt2.generation.decoding import STOP, Row
from gpt2.generation.generate import TextRow
from gpt2.serve.protocol import CompletionBody, CompletionRequest, RequestError, parse_completion, token_name
from gpt2.serve.scheduler import CANCELLED
from gpt2.serve.server import ModelRoute, Server
from gpt2.tokenizer import IncrementalDecoder, Tokenizer


class NoText:
    """A row's text where the model comes with no tokenizer: none, ending as the row ends (`TextRow`'s interface)."""

    stopped = False  # no stop strings without text

    def __init__(self) -> None:
        self.done = False

    def follow(self, token: int | None, ended: bool) -> str:
        self.done = self.done or ended
        return ""


class ChoiceStream:
    """One choice of a completion: the text its row's tokens release, and their log-probabilities (a model
    that comes with no tokenizer, `tokenizer` None: no text, its token_ids)."""

    def __init__(self, index: int, row: Row, tokenizer: Tokenizer | None, request: CompletionRequest):
        self.index, self.row, self.tokenizer = index, row, tokenizer
        self.text_row = NoText() if tokenizer is None else TextRow(tokenizer, request.stop)
        # the prompt, given out with the first piece ("" without a tokenizer: its ids are prompt_token_ids)
        self.echo = ("" if tokenizer is None else tokenizer.decode(row.prompt)) if request.echo else None
        self.text = ""  # given out so far
        # each token's place in the text, for text_offset (0 without a tokenizer: there is no text)
        self.offsets, self.offset = None if tokenizer is None else IncrementalDecoder(tokenizer), 0
        self.logprobs: list[TokenLogprob] | None = None if request.logprobs is None else []
        self.sent = 0  # logprob entries already streamed
        self.done = False
        self.finish_reason: str | None = None
        self.tokens = 0  # generated tokens this choice took (the row may have made one more)
        self.token_ids: list[int] | None = (
            [] if request.return_token_ids else None
        )  # those tokens, for vLLM's return_token_ids
        self.ids_sent, self.prompt_ids_sent = (
            0,
            False,
        )  # token_ids streamed so far; prompt_token_ids, with the first chunk

    def add(self, token: int | None, reason: str | None) -> str:
        """The text the row's new token (None: none) releases, `reason` saying whether the row
        ended with it; the row ends at a stop string."""
        piece = ""
        if self.echo is not None:  # the prompt comes first; its log-probabilities exist once the row has joined
            piece, self.echo = self.echo, None
            if self.row.echo_logprobs:
                for prompt_token, entry in zip(self.row.prompt, self.row.prompt_logprobs):
                    self._log(prompt_token, entry)
            self.offsets = None if self.tokenizer is None else IncrementalDecoder(self.tokenizer)
            self.offset = len(piece)
        taken = token is not None and not self.text_row.done
        self.tokens += taken
        if taken and self.token_ids is not None:
            self.token_ids.append(token)
        piece += self.text_row.follow(token, reason is not None)
        if (
            taken and self.logprobs is not None
        ):  # every token taken, <|endoftext|> too: lm-eval takes the last entry for the one generated
            if self.tokenizer is not None and token == self.tokenizer.eot_token:  # no text: at the text's end
                self.offset = len(self.text) + len(piece)
            k = len(self.logprobs) - (len(self.row.prompt) if self.row.echo_logprobs else 0)
            self._log(token, (self.row.token_logprobs[k], self.row.top_logprobs[k]))
        self.text += piece
        self.done = self.text_row.done
        if self.done:
            self.finish_reason = STOP if self.text_row.stopped else reason
        if self.text_row.stopped:
            self.row.end(STOP)  # it leaves the batch at the next step
        if self.text_row.stopped and self.logprobs is not None:  # the stop string's tokens are not the text's
            echoed = len(self.row.prompt) if self.row.echo_logprobs else 0
            while len(self.logprobs) > echoed and self.logprobs[-1].offset >= len(self.text):
                self.logprobs.pop()
        return piece

    def _log(self, token: int, entry: tuple[float, list[tuple[int, float]]] | None) -> None:
        """`entry` None: the first token of an echoed prompt, which has no log-probability."""
        chosen, alternatives = (None, None) if entry is None else entry
        self.logprobs.append(TokenLogprob(token, self.offset, chosen, alternatives))
        if self.offsets is not None:
            self.offset += len(self.offsets.add([token]))

    def unsent_logprobs(self, upto: int | None = None) -> list[TokenLogprob] | None:
        """The entries not yet streamed (up to entry `upto`), now counted as streamed."""
        if self.logprobs is None:
            return None
        new = self.logprobs[self.sent : upto]
        self.sent += len(new)
        return new

    @property
    def ids_unsent(self) -> bool:
        """Token ids taken and not yet streamed, where they are the answer (a model with no tokenizer)."""
        return self.tokenizer is None and self.token_ids is not None and len(self.token_ids) > self.ids_sent

    def with_token_ids(self, choice: dict, streamed: bool = False) -> dict:
        """vLLM's return_token_ids: the choice's prompt_token_ids and the token_ids it took; streamed,
        the ids new since the last chunk, and the prompt's with the first."""
        if self.token_ids is None:
            return choice
        if not (streamed and self.prompt_ids_sent):
            choice["prompt_token_ids"] = list(self.row.prompt)
        choice["token_ids"] = self.token_ids[self.ids_sent if streamed else 0 :]
        if streamed:
            self.ids_sent, self.prompt_ids_sent = len(self.token_ids), True
        return choice

    def to_dict(self) -> dict:
        logprobs = None if self.logprobs is None else completion_logprobs(self.tokenizer, self.logprobs)
        choice = {"index": self.index, "text": self.text, "logprobs": logprobs, "finish_reason": self.finish_reason}
        return self.with_token_ids(choice)


@dataclass
class TokenLogprob:
    """One token of a choice with its log-probability, as each API's response shows it."""

    token: int
    offset: int  # where its text begins in the choice's text
    logprob: float | None  # None: the first token of an echoed prompt
    top: list[tuple[int, float]] | None  # the most likely tokens there, with theirs


def completion_logprobs(tokenizer: Tokenizer | None, entries: list[TokenLogprob]) -> dict:
    """Log-probabilities as OpenAI's completions API gives them: four lists, a token's alternatives
    by their text (the chosen token always among them, as vLLM does); "token_id:N" without a tokenizer."""

    def top(entry: TokenLogprob) -> dict[str, float] | None:
        if entry.top is None:
            return None
        alternatives = {token_name(tokenizer, t): lp for t, lp in entry.top}
        alternatives.setdefault(token_name(tokenizer, entry.token), entry.logprob)
        return alternatives

    return {
        "tokens": [token_name(tokenizer, e.token) for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [top(e) for e in entries],
        "text_offset": [e.offset for e in entries],
    }


@dataclass
class CompletionResponse:
    """What a completion's response shares: its id, time, model and usage; and its format, the
    completions API's (`gpt2.serve.chat.ChatResponse` gives the chat API's over the same choices)."""

    model_id: str
    request: CompletionRequest
    choices: list[ChoiceStream]
    id: str = field(default_factory=lambda: f"cmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))
    object = "text_completion"  # the whole answer's; its streamed chunks' are the same

    def usage(self) -> dict:
        prompt = sum(map(len, self.request.prompts))
        completion = sum(c.tokens for c in self.choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def body(self, choices: list[dict], usage: bool = True, kind: str | None = None) -> dict:
        body = {
            "id": self.id,
            "object": kind or self.object,
            "created": self.created,
            "model": self.model_id,
            "choices": choices,
        }
        if usage:
            body["usage"] = self.usage()
        return body

    def whole(self) -> dict:
        """The answer once every choice has ended."""
        return self.body([choice.to_dict() for choice in self.choices])

    def chunks(self, choice: ChoiceStream, piece: str) -> list[dict]:
        """The streamed chunks for a piece of a choice's text: one, if it holds text (or, without a tokenizer,
        ids) or ends the choice."""
        if not (piece or choice.done or choice.ids_unsent):
            return []
        logprobs = choice.unsent_logprobs()
        logprobs = None if logprobs is None else completion_logprobs(choice.tokenizer, logprobs)
        chunk = {"index": choice.index, "text": piece, "logprobs": logprobs, "finish_reason": choice.finish_reason}
        return [self.body([choice.with_token_ids(chunk, streamed=True)], usage=False)]

    def usage_chunk(self) -> dict:
        """stream_options' include_usage: the last chunk, of no choice, with the usage."""
        return self.body([])


# ------------------------------------------------------------------ serving it


router = APIRouter(route_class=ModelRoute)


@router.post("/v1/completions")
async def completions(body: CompletionBody, request: Request) -> Response:
    server: Server = request.app.state.server
    return await answer(
        server, request, parse_completion(body, server.tokenizer, server.bounds(), server.allowed_special)
    )


Respond = Callable[[str, CompletionRequest, list[ChoiceStream]], CompletionResponse]  # (model id, request, choices)


async def answer(
    server: Server, request: Request, completion: CompletionRequest, respond: Respond = CompletionResponse
) -> Response:
    """Submit a completion's rows and answer with their text: whole, or streamed as it comes, in
    the format of `respond`'s response."""
    started, loop, events = time.perf_counter(), asyncio.get_running_loop(), asyncio.Queue()
    server.scheduler.submit(completion.rows, lambda *event: loop.call_soon_threadsafe(events.put_nowait, event))
    server.metrics.prompt_tokens.inc(sum(map(len, completion.prompts)))
    choices = [ChoiceStream(i, row, server.tokenizer, completion) for i, row in enumerate(completion.rows)]
    response = respond(server.model_id, completion, choices)
    stream = pieces(server, request, response, events, started)
    if completion.stream:
        return StreamingResponse(sse(response, stream), media_type="text/event-stream")
    try:
        async for _ in stream:
            pass
    except RequestError as e:
        return e.response()
    return JSONResponse(response.whole())


GONE = object()  # in the queue of a completion's events: its client left


async def listen_for_disconnect(request: Request, events: asyncio.Queue) -> None:
    """Put GONE in `events` once the client leaves. The ASGI server says so as it happens (its
    next message after the body is http.disconnect), as vLLM listens to abort a request: polling
    `request.is_disconnected()` would let the rows generate for nobody in between."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    events.put_nowait(GONE)


async def pieces(
    server: Server, request: Request, response: CompletionResponse, events: asyncio.Queue, started: float
) -> AsyncGenerator[tuple[ChoiceStream, str], None]:
    """Yield (choice, piece) as tokens arrive, until every choice has ended. The rows end as soon
    as the client leaves, streaming or waiting for the whole answer, so that they free their slots."""
    by_row = {choice.row: choice for choice in response.choices}
    first, listening = True, asyncio.create_task(listen_for_disconnect(request, events))
    try:
        while not all(choice.done for choice in response.choices):
            event = await events.get()
            if event is GONE:
                return
            row, token, reason, error = event
            if error is not None:
                raise RequestError(503, error, kind="server_error")
            if first and token is not None:
                server.metrics.ttft.observe(time.perf_counter() - started)
                first = False
            choice = by_row[row]
            if not choice.done:
                yield choice, choice.add(token, reason)
    finally:
        listening.cancel()
        for choice in response.choices:
            choice.row.end(CANCELLED)  # a no-op for rows that ended; frees the slots of the others


async def sse(
    response: CompletionResponse, stream: AsyncGenerator[tuple[ChoiceStream, str], None]
) -> AsyncIterator[str]:
    """Server-Sent Events: the response's chunks as text comes, each choice's last with its
    finish_reason; the usage, if asked; then [DONE]."""
    try:
        async for choice, piece in stream:
            for chunk in response.chunks(choice, piece):
                yield f"data: {json.dumps(chunk)}\n\n"
        if response.request.include_usage:
            yield f"data: {json.dumps(response.usage_chunk())}\n\n"
    except RequestError as e:
        yield f"data: {json.dumps(e.body())}\n\n"
    finally:  # the client gone, or the stream done: free the slots now, not when the generators are collected
        await stream.aclose()
    yield "data: [DONE]\n\n"
