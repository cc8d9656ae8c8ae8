"""The server's generation loop (gpt2.serve.scheduler): requests share the batch and get the answers
they get alone, clients that leave free their rows, the queue's bound, kept prefix blocks and a draft model."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
from helpers import Running
from serve_fixtures import ENC, N_CTX, complete, metric, ours, post

from gpt2.model.model import GPT2
from gpt2.serve import Limits


def test_a_prompt_beginning_as_an_earlier_one_reuses_its_blocks_with_the_same_logprobs(models, server):
    """A context of 40 tokens scored with three endings (lm-evaluation-harness's requests): the
    later ones reuse its kept blocks, counted in /metrics as vLLM counts them, and their echo
    log-probabilities equal those of a server that keeps none, within 1e-5; the memory the
    blocks hold is in /metrics too."""
    context = torch.randint(0, 50256, (40,), generator=torch.Generator().manual_seed(9)).tolist()
    prompts = [context + [100 + i, 200 + i] for i in range(3)]
    plain = Running(lambda: (models[1], ENC), limits=Limits(prefix_cache_mb=0))
    try:

        def logprobs(running, ids):
            choice = complete(running.client(), prompt=ids, max_tokens=0, echo=True, logprobs=2, temperature=0).choices[
                0
            ]
            return choice.logprobs.token_logprobs[1:], choice.logprobs.top_logprobs[1:]

        queries, hits = (
            metric(server.url, "gpt2_prefix_cache_queries_total"),
            metric(server.url, "gpt2_prefix_cache_hits_total"),
        )
        for ids in prompts:
            (got, got_top), (want, want_top) = logprobs(server, ids), logprobs(plain, ids)
            assert max(abs(a - b) for a, b in zip(got, want)) < 1e-5
            assert [list(t) for t in got_top] == [list(t) for t in want_top]
        assert metric(server.url, "gpt2_prefix_cache_queries_total") - queries == 3 * 42
        assert metric(server.url, "gpt2_prefix_cache_hits_total") - hits >= 2 * 32  # the later two: 2 blocks of 16 each
        assert metric(plain.url, "gpt2_prefix_cache_queries_total") == 0
        config = models[
            1
        ].config  # the context's 2 blocks at least: keys, values (each layer) and final hidden states of 16 tokens
        assert metric(server.url, "gpt2_prefix_cache_bytes") >= 2 * 16 * config.n_embd * (2 * config.n_layer + 1) * 4
        assert metric(plain.url, "gpt2_prefix_cache_bytes") == 0
    finally:
        plain.stop()


def test_concurrent_requests_equal_the_same_requests_one_at_a_time(models, server):
    """8 clients at once, greedy and seeded sampling mixed: each gets the answer it gets alone."""
    requests = [
        dict(prompt=f"Request number {i} says", max_tokens=10 + 3 * i, temperature=0 if i % 2 else 0.8, seed=i)
        for i in range(8)
    ]
    client = server.client()
    alone = [complete(client, **r).choices[0].text for r in requests]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda r: complete(server.client(), **r).choices[0].text, requests))
    assert together == alone
    assert alone[1] == ours(models, requests[1]["prompt"], max_new_tokens=13, temperature=0)[0]


class Stepper:
    """The scheduler's loop under the test's hand: once `holding()` is true, each step waits for
    the test to allow it (`allow`), or for `run` (free from then on); `after` sees each step's end."""

    def __init__(self, scheduler, holding):
        self.step, self.holding, self.after = scheduler.decoder.step, holding, lambda: None
        self.allowed, self.free = threading.Semaphore(0), threading.Event()
        scheduler.decoder.step = self

    def __call__(self):
        while self.holding() and not self.free.is_set() and not self.allowed.acquire(timeout=0.01):
            pass
        events = self.step()
        self.after()
        return events

    def allow(self, steps: int = 1) -> None:
        for _ in range(steps):
            self.allowed.release()

    def run(self) -> None:
        self.free.set()


def test_a_short_request_sent_during_a_long_one_finishes_first(models):
    """The short request joins the long one's batch at the next step and ends while the long one
    still has most of its tokens to make (counted in steps, not seconds)."""
    running = Running(lambda: (models[1], ENC))
    scheduler = running.app.state.server.scheduler
    stepper = Stepper(
        scheduler, lambda: any(row.tokens for row in scheduler.decoder.active)
    )  # held after the first token
    try:
        long = complete(running.client(), prompt="A long story:", max_tokens=N_CTX - 10, temperature=0, stream=True)
        next(iter(long))  # the long request is being generated
        long_row = scheduler.decoder.active[0]
        with ThreadPoolExecutor(1) as pool:
            short = pool.submit(complete, running.client(), prompt="Short:", max_tokens=3, temperature=0)
            wait_for(lambda: scheduler.incoming)  # it has come: the long row has made at most 2 tokens
            made = len(long_row.tokens)
            short_row = scheduler.incoming[0][0]
            at_its_end = []  # the long row's tokens when the short row ends
            stepper.after = lambda: short_row.done and not at_its_end and at_its_end.append(len(long_row.tokens))
            stepper.run()
            assert short.result().choices[0].finish_reason == "length"
        rest = list(long)
        assert rest[-1].choices[0].finish_reason == "length" and len(long_row.tokens) == N_CTX - 10
        assert (
            made <= 2 and at_its_end[0] <= made + 5
        )  # a step to take its prompt, three to make its tokens, one to see it end
    finally:
        stepper.run()
        running.stop()


def send_and_stay(url: str, body: dict) -> socket.socket:
    """A client that sends a completion request and reads nothing: it leaves when the test closes it."""
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    return sock


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_frees_its_rows_at_once(models, monkeypatch, stream):
    """Streaming, or waiting for the whole answer with n=8: the rows end as the client leaves,
    told by the ASGI server's disconnect, on no clock (the route's clock stopped, which polling
    would wait for) and before the loop steps again; they generate nothing, the server serves on."""
    from gpt2.serve import completions

    stopped_clock = types.SimpleNamespace(monotonic=lambda: 0.0, perf_counter=time.perf_counter, time=time.time)
    monkeypatch.setattr(completions, "time", stopped_clock)
    running = Running(lambda: (models[1], ENC))
    scheduler, registry = running.app.state.server.scheduler, running.app.state.server.metrics.registry
    gate, step = threading.Event(), scheduler.decoder.step
    scheduler.decoder.step = lambda: gate.wait() and step()  # the loop stalls before its next step
    try:
        n = 1 if stream else 8
        client = send_and_stay(running.url, {"prompt": "Leaving soon", "max_tokens": 100, "n": n, "stream": stream})
        with client:
            rows = wait_for(lambda: len(scheduler.decoder.waiting) == n and list(scheduler.decoder.waiting))
        wait_for(lambda: all(row.done for row in rows))  # the client is gone: nothing else happens meanwhile
        generated = registry.get_sample_value("gpt2_generated_tokens_total")
        gate.set()
        wait_for_gauge(running.url, "gpt2_rows_in_flight", 0, 30)
        assert registry.get_sample_value("gpt2_generated_tokens_total") == generated
        assert complete(running.client(), prompt="Still there?", max_tokens=3).choices[0].finish_reason == "length"
    finally:
        gate.set()
        running.stop()


def wait_for(event, timeout: float = 30):
    """The event's value once it is true (polled; the timeout only bounds a hang)."""
    deadline = time.monotonic() + timeout
    while not (value := event()):
        assert time.monotonic() < deadline, "the event did not come"
        time.sleep(0.005)
    return value


def gauges(url: str) -> dict[str, float]:
    """The gauges of rows, as Prometheus' own parser reads /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    names = ("gpt2_queue_length", "gpt2_batch_size", "gpt2_rows_in_flight")
    return {
        f.name: f.samples[0].value
        for f in text_string_to_metric_families(httpx.get(url + "/metrics").text)
        if f.name in names
    }


def wait_for_gauge(url: str, name: str, value: float, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while gauges(url)[name] != value:
        assert time.monotonic() < deadline, f"{name} is {gauges(url)[name]}, not {value}, after {timeout} s"
        time.sleep(0.05)


def test_rows_in_flight_counts_the_rows_whose_prompts_are_going_in(models):
    """A prompt going in a chunk a step is neither in the batch nor in the queue: the gauge of
    rows in flight counts it, and is 0 once the loop is idle (how benchmarks/load.py sees a
    server at rest)."""
    running = Running(lambda: (models[1], ENC), limits=Limits(max_batch_size=2, max_num_batched_tokens=8))
    scheduler = running.app.state.server.scheduler
    stalled, gate, step, calls = threading.Event(), threading.Event(), scheduler.decoder.step, []

    def stall_before_the_second_step():
        calls.append(1)
        if len(calls) == 2:  # after the first step's 8 prompt tokens, its gauges reported
            stalled.set()
            gate.wait(30)
        return step()

    scheduler.decoder.step = stall_before_the_second_step
    try:
        with ThreadPoolExecutor(1) as pool:
            scored = pool.submit(post, running, {"prompt": [15496] * 100, "max_tokens": 0, "echo": True, "logprobs": 0})
            assert stalled.wait(30)
            assert gauges(running.url) == {"gpt2_queue_length": 0, "gpt2_batch_size": 0, "gpt2_rows_in_flight": 1}
            gate.set()
            assert scored.result().status_code == 200
        wait_for_gauge(running.url, "gpt2_rows_in_flight", 0, 30)
        assert gauges(running.url) == {"gpt2_queue_length": 0, "gpt2_batch_size": 0, "gpt2_rows_in_flight": 0}
    finally:
        gate.set()
        running.stop()


def test_the_rows_of_clients_that_left_while_waiting_free_their_places_in_the_queue(models):
    """A client gone before its row had a slot: the row leaves the queue at the next step, not
    once a slot frees, so it holds no place of max_queue (a 429 for rows nobody waits for)."""
    running = Running(lambda: (models[1], ENC), limits=Limits(max_batch_size=1, max_queue=2))
    scheduler = running.app.state.server.scheduler
    stepper = Stepper(
        scheduler, lambda: any(row.tokens for row in scheduler.decoder.active)
    )  # held after the first token
    long = {"prompt": "A long answer:", "max_tokens": N_CTX - 10, "stream": True}
    try:
        with httpx.stream("POST", running.url + "/v1/completions", json=long, timeout=30) as first:
            lines = first.iter_lines()  # kept: an iterator collected closes the connection
            assert next(lines).startswith("data: ")  # it has the slot
            long_row = scheduler.decoder.active[0]
            with contextlib.ExitStack() as stack:  # two clients wait, then leave before their first token
                for _ in range(2):
                    waiting = stack.enter_context(
                        httpx.stream("POST", running.url + "/v1/completions", json={**long, "max_tokens": 5})
                    )
                    assert waiting.status_code == 200
                wait_for(lambda: len(scheduler.incoming) == 2)
                stepper.allow()  # the loop takes them into its queue after this step
                wait_for_gauge(running.url, "gpt2_queue_length", 2, 30)
                rows = list(scheduler.decoder.waiting)
            wait_for(lambda: all(row.done for row in rows))  # their clients have gone
            stepper.allow()
            wait_for_gauge(running.url, "gpt2_queue_length", 0, 30)
            assert not long_row.done and len(long_row.tokens) <= 3  # not once the long one ends
            stepper.run()
            with httpx.stream("POST", running.url + "/v1/completions", json={**long, "max_tokens": 5}) as response:
                assert response.status_code == 200  # not 429: nobody waits
    finally:
        stepper.run()
        running.stop()


def test_a_client_that_leaves_the_queue_and_asks_again_at_once_is_not_refused(models):
    """The queue counts the rows of clients still there: a row whose client left holds no place
    of max_queue even before the loop's next step drops it (benchmarks/load.py got 429s from
    clients that left a stream and asked again while a step ran)."""
    running = Running(lambda: (models[1], ENC), limits=Limits(max_batch_size=1, max_queue=1))
    scheduler = running.app.state.server.scheduler
    gate, step = threading.Event(), scheduler.decoder.step
    scheduler.decoder.step = lambda: gate.wait() and step()  # the loop stalls before its next step
    try:
        with httpx.stream(
            "POST", running.url + "/v1/completions", json={"prompt": "one", "max_tokens": 2, "stream": True}
        ) as first:
            assert first.status_code == 200
            row = wait_for(
                lambda: scheduler.decoder.waiting and scheduler.decoder.waiting[0]
            )  # taken by the loop, held at the gate
        wait_for(lambda: row.done)  # the server saw the client leave
        assert row in scheduler.decoder.waiting  # still queued: the loop has not stepped
        with ThreadPoolExecutor(1) as pool:
            again = pool.submit(post, running, {"prompt": "two", "max_tokens": 2})
            wait_for(lambda: scheduler.incoming or again.done())
            gate.set()
            assert again.result().status_code == 200
    finally:
        gate.set()
        running.stop()


def test_prompts_of_every_length_give_onednn_a_few_shapes(models, server, monkeypatch):
    """oneDNN builds and keeps a kernel for each shape of rows it is given (up to 1,024 of them):
    a server meeting prompts of every length grew by 170 MB (benchmarks/load.py). The rows it
    gets are padded to a few sizes, and the padding changes no log-probability."""
    from gpt2.generation import kernels

    sizes, onednn = set(), kernels._onednn_linear

    def recording(x, *args):
        sizes.add(x.numel() // x.size(-1))
        return onednn(x, *args)

    monkeypatch.setattr(kernels, "_onednn_linear", recording)
    for length in range(17, 81):  # past the 16 rows the decode kernel takes
        ids = [(911 * i + length) % 50257 for i in range(length)]
        choice = post(server, {"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 0}).json()["choices"][0]
        if length == 37:
            with torch.no_grad():
                expected = torch.log_softmax(models[0](torch.tensor([ids])).logits[0].double(), dim=-1)
            served = choice["logprobs"]["token_logprobs"]
            assert served[0] is None and len(served) == length
            assert max(abs(served[t] - float(expected[t - 1, ids[t]])) for t in range(1, length)) < 1e-4
    assert 0 < len(sizes) <= 18 and min(sizes) >= 17  # unpadded, 64 sizes


def test_a_full_queue_answers_429_with_retry_after(models):
    running = Running(lambda: (models[1], ENC), limits=Limits(max_batch_size=1, max_queue=2))
    scheduler = running.app.state.server.scheduler
    gate, step = threading.Event(), scheduler.decoder.step
    scheduler.decoder.step = lambda: gate.wait() and step()  # the loop stalls before its next step
    try:
        response = post(running, {"prompt": "hi", "n": 3})  # more rows than may ever wait
        assert response.status_code == 400 and "asks for 3 rows" in response.json()["error"]["message"]
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(post, running, {"prompt": "one", "max_tokens": 2})
            wait_for(lambda: len(scheduler.decoder.waiting) >= 1)  # taken by the loop, which waits at the gate
            second = pool.submit(post, running, {"prompt": "two", "max_tokens": 2})
            wait_for(lambda: len(scheduler.incoming) >= 1)
            response = post(running, {"prompt": "three", "max_tokens": 2})
            assert response.status_code == 429 and response.headers["retry-after"] == "1"
            assert "busy: 2 rows wait already" in response.json()["error"]["message"]
            gate.set()
            assert first.result().status_code == second.result().status_code == 200
    finally:
        gate.set()
        running.stop()


def test_a_server_with_a_draft_model_answers_what_it_answers_without(models, client, draft_dir):
    """Greedy choices with a draft proposing 3 tokens a step: the text, log-probabilities and finish
    reasons of the server without one, whole and streamed, up to a stop string too; /metrics
    counts the drafts proposed and kept."""
    draft = GPT2.from_pretrained(draft_dir, device="cpu")
    running = Running(lambda: (models[1], ENC), limits=Limits(draft_tokens=3), load_draft=lambda: (draft, ENC))
    try:
        drafted = running.client()
        request = dict(prompt=["The meaning of life is", "Hello"], max_tokens=20, temperature=0, logprobs=2)
        got, expected = complete(drafted, **request), complete(client, **request)
        for choice, alone in zip(got.choices, expected.choices):
            assert (choice.text, choice.finish_reason) == (alone.text, alone.finish_reason)
            assert max(abs(a - b) for a, b in zip(choice.logprobs.token_logprobs, alone.logprobs.token_logprobs)) < 1e-4
        stop = expected.choices[0].text[5:9]
        request = dict(prompt="The meaning of life is", max_tokens=20, temperature=0, stop=[stop])
        whole = complete(drafted, **request).choices[0]
        assert (whole.text, whole.finish_reason) == (
            expected.choices[0].text[: expected.choices[0].text.index(stop)],
            "stop",
        )
        chunks = list(complete(drafted, stream=True, **request))
        assert (
            "".join(c.choices[0].text for c in chunks) == whole.text and chunks[-1].choices[0].finish_reason == "stop"
        )
        assert (
            0 < metric(running.url, "gpt2_draft_accepted_tokens_total") < metric(running.url, "gpt2_draft_tokens_total")
        )
    finally:
        running.stop()


def test_a_server_speculating_by_prompt_lookup_answers_what_it_answers_without(models, client):
    """Limits(speculative="ngram"), as gpt2 serve --speculative ngram: greedy choices of prompts
    that repeat themselves, under a constraint too, equal the server's without speculation; the
    drafts are counted in /metrics."""
    running = Running(lambda: (models[1], ENC), limits=Limits(speculative="ngram", prompt_lookup_min=1))
    try:
        looked_up = running.client()
        request = dict(prompt=["a b c d a b c d a b", "Hello"], max_tokens=24, temperature=0, logprobs=1)
        got, expected = complete(looked_up, **request), complete(client, **request)
        assert [(c.text, c.finish_reason) for c in got.choices] == [(c.text, c.finish_reason) for c in expected.choices]
        regex = {"structured_outputs": {"regex": "(a b |c d )+"}}
        assert (
            complete(looked_up, prompt="a b c d a b", max_tokens=12, temperature=0, extra_body=regex).choices[0].text
            == complete(client, prompt="a b c d a b", max_tokens=12, temperature=0, extra_body=regex).choices[0].text
        )
        assert (
            0
            < metric(running.url, "gpt2_draft_accepted_tokens_total")
            <= metric(running.url, "gpt2_draft_tokens_total")
        )
    finally:
        running.stop()
