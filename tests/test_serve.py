"""`gpt2 serve`, through OpenAI's own client: answers equal the Python API's and transformers',
requests share the batch, bad requests get OpenAI's errors, and the server keeps serving."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
import torch

from helpers import REPO, Running, heed_ctrl_c, make_hf_model, perturbed, transformers_sampled
from gpt2 import Tokenizer
from gpt2.cli import main
from gpt2.errors import GPT2Error
from gpt2.generate import generate_text
from gpt2.model import GPT2
from gpt2.serve import Limits, create_app
from gpt2.tokenizer import CharTokenizer

ENC = Tokenizer.gpt2()
N_CTX = 128


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    directory = tmp_path_factory.mktemp("served")
    hf = make_hf_model(seed=5, vocab_size=50257, n_positions=N_CTX, n_embd=48, n_layer=2, n_head=3)
    hf.save_pretrained(directory)
    return hf, GPT2.from_pretrained(directory, device="cpu"), str(directory)


@pytest.fixture(scope="module")
def server(models):
    running = Running(lambda: (models[1], ENC))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def ours(models, prompt, **options):
    return generate_text(models[1], ENC, prompt, **options)


def complete(client, **request):
    if "top_k" in request:  # our field, not OpenAI's: the client sends it as extra_body
        request["extra_body"] = {"top_k": request.pop("top_k")}
    return client.completions.create(model="tiny", **request)


# ------------------------------------------------------------------ answers


def test_greedy_text_equals_the_python_api_and_gpt2_generate(models, client, capsys):
    response = complete(client, prompt="The meaning of life is", max_tokens=20, temperature=0)
    choice = response.choices[0]
    assert choice.text == ours(models, "The meaning of life is", max_new_tokens=20, temperature=0)[0]
    assert choice.finish_reason == "length" and choice.index == 0 and response.object == "text_completion"
    assert response.model == "tiny" and response.id.startswith("cmpl-")
    n_prompt = len(ENC.encode("The meaning of life is"))
    assert (response.usage.prompt_tokens, response.usage.completion_tokens, response.usage.total_tokens) == (n_prompt, 20, n_prompt + 20)
    capsys.readouterr()
    assert main(["generate", "The meaning of life is", "--model", models[2], "--max-new-tokens", "20", "--temperature", "0", "--no-stream"]) == 0
    assert capsys.readouterr().out == choice.text + "\n"


def test_streamed_pieces_join_to_the_whole_text(client):
    request = dict(prompt="Once upon a time", max_tokens=30, temperature=0.9, seed=11, top_k=40)
    chunks = list(complete(client, stream=True, **request))
    whole = complete(client, **request).choices[0]
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    assert len(chunks) > 5 and chunks[-1].choices[0].finish_reason == whole.finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_n_choices_and_lists_of_prompts_follow_the_one_seed_rule(models, client):
    """Choice i (prompt-major) samples from seed + i (wrapping past 2**64 - 1), as transformers
    samples with its generator seeded so."""
    prompts = ["Hello", "The weather today"]
    response = complete(client, prompt=prompts, n=3, max_tokens=12, seed=2**64 - 2, top_p=0.9)
    assert [c.index for c in response.choices] == list(range(6))
    for c in response.choices:
        prompt = prompts[c.index // 3]
        assert c.text == ENC.decode(transformers_sampled(models[0], ENC.encode(prompt), 12, (2**64 - 2 + c.index) % 2**64, top_p=0.9))
    assert len({c.text for c in response.choices}) == 6
    assert response.choices[2].text == complete(client, prompt=prompts, n=3, max_tokens=12, seed=2**64 - 2, top_p=0.9).choices[2].text


def test_prompts_as_token_ids(models, client):
    ids = [ENC.encode("Hello world"), ENC.encode("GPT-2 is")]
    response = complete(client, prompt=ids, max_tokens=8, temperature=0)
    assert [c.text for c in response.choices] == [ours(models, ENC.decode(p), max_new_tokens=8, temperature=0)[0] for p in ids]
    assert complete(client, prompt=ids[0], max_tokens=8, temperature=0).choices[0].text == response.choices[0].text


SPECIAL_PROMPT = "The end.<|endoftext|>A new story"


def gpt2_generate(capsys, models, prompt, *flags):
    capsys.readouterr()
    argv = ["generate", prompt, "--model", models[2], "--max-new-tokens", "12", "--temperature", "0", "--no-stream"]
    assert main([*argv, *flags]) == 0
    return capsys.readouterr().out.removesuffix("\n")


def test_end_of_text_in_a_prompt_is_the_special_token_for_gpt2_generate_and_the_server(models, client, capsys):
    """One rule, OpenAI's: <|endoftext|> written in a prompt is token 50256, in the CLI as in the server."""
    served = complete(client, prompt=SPECIAL_PROMPT, max_tokens=12, temperature=0).choices[0].text
    assert served == gpt2_generate(capsys, models, SPECIAL_PROMPT)
    special = ENC.encode(SPECIAL_PROMPT, allowed_special="all")
    assert 50256 in special and served == complete(client, prompt=special, max_tokens=12, temperature=0).choices[0].text
    as_text = complete(client, prompt=ENC.encode(SPECIAL_PROMPT), max_tokens=12, temperature=0).choices[0].text
    assert as_text != served  # the two readings continue differently: the test tells them apart


def test_special_as_text_reads_end_of_text_as_characters_in_both(models, capsys):
    running = Running(lambda: (models[1], ENC), allowed_special=frozenset())
    try:
        client = running.client()
        served = complete(client, prompt=SPECIAL_PROMPT, max_tokens=12, temperature=0).choices[0].text
        assert served == gpt2_generate(capsys, models, SPECIAL_PROMPT, "--special-as-text")
        assert served == complete(client, prompt=ENC.encode(SPECIAL_PROMPT), max_tokens=12, temperature=0).choices[0].text
        tokens = httpx.post(running.url + "/tokenize", json={"content": SPECIAL_PROMPT}).json()["tokens"]
        assert tokens == ENC.encode(SPECIAL_PROMPT) and 50256 not in tokens  # /tokenize reads as a completion does
    finally:
        running.stop()


def test_stop_strings_end_the_text_and_are_never_streamed(models, client):
    free = ours(models, "In the beginning", max_new_tokens=40, temperature=0)[0]
    stop = free[10:13]
    response = complete(client, prompt="In the beginning", max_tokens=40, temperature=0, stop=[stop, "never appears"])
    assert response.choices[0].text == free[: free.index(stop)] and response.choices[0].finish_reason == "stop"
    chunks = list(complete(client, prompt="In the beginning", max_tokens=40, temperature=0, stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == response.choices[0].text
    assert all(stop not in c.choices[0].text for c in chunks) and chunks[-1].choices[0].finish_reason == "stop"


def test_echo_and_logprobs_equal_transformers_log_softmax(models, client):
    hf = models[0]
    prompt = "Paris is the capital of"
    ids = ENC.encode(prompt)
    for max_tokens in (0, 5):  # 0: scoring a text, as lm-evaluation-harness does
        choice = complete(client, prompt=prompt, max_tokens=max_tokens, echo=True, logprobs=3, temperature=0).choices[0]
        all_ids = ids + ENC.encode(choice.text[len(prompt) :])
        assert choice.text.startswith(prompt) and len(choice.logprobs.tokens) == len(ids) + max_tokens
        with torch.no_grad():
            expected = torch.log_softmax(hf(torch.tensor([all_ids])).logits[0].double(), dim=-1)
        lp = choice.logprobs
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert lp.tokens == [ENC.decode([t]) for t in all_ids]
        assert lp.text_offset == [len(ENC.decode(all_ids[:t])) for t in range(len(all_ids))]
        for t in range(1, len(all_ids)):
            assert abs(lp.token_logprobs[t] - float(expected[t - 1, all_ids[t]])) < 1e-4
            top = expected[t - 1].topk(3)
            for token, value in zip(top.indices.tolist(), top.values.tolist()):
                assert abs(lp.top_logprobs[t][ENC.decode([token])] - value) < 1e-4
        assert choice.finish_reason == "length"


def test_lm_evaluation_harness_style_scoring_of_id_prompts(client):
    """local-completions sends lists of ids, max_tokens 1, echo, logprobs 1, temperature 0."""
    ids = [ENC.encode("The cat sat on the mat"), ENC.encode("A dog")]
    response = complete(client, prompt=ids, max_tokens=1, echo=True, logprobs=1, temperature=0, seed=1234)
    for choice, prompt in zip(sorted(response.choices, key=lambda c: c.index), ids):
        lp = choice.logprobs
        assert len(lp.token_logprobs) == len(prompt) + 1
        greedy = lp.token_logprobs[-1] == max(lp.top_logprobs[-1].values())  # the generated token is the greedy one
        assert greedy and all(len(top) in (1, 2) for top in lp.top_logprobs[1:])


def metric(url: str, name: str) -> float:
    """One value of the server's /metrics."""
    line = next(line for line in httpx.get(url + "/metrics").text.splitlines() if line.startswith(name + " "))
    return float(line.split()[1])


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
            choice = complete(running.client(), prompt=ids, max_tokens=0, echo=True, logprobs=2, temperature=0).choices[0]
            return choice.logprobs.token_logprobs[1:], choice.logprobs.top_logprobs[1:]
        queries, hits = metric(server.url, "gpt2_prefix_cache_queries_total"), metric(server.url, "gpt2_prefix_cache_hits_total")
        for ids in prompts:
            (got, got_top), (want, want_top) = logprobs(server, ids), logprobs(plain, ids)
            assert max(abs(a - b) for a, b in zip(got, want)) < 1e-5
            assert [list(t) for t in got_top] == [list(t) for t in want_top]
        assert metric(server.url, "gpt2_prefix_cache_queries_total") - queries == 3 * 42
        assert metric(server.url, "gpt2_prefix_cache_hits_total") - hits >= 2 * 32  # the later two: 2 blocks of 16 each
        assert metric(plain.url, "gpt2_prefix_cache_queries_total") == 0
        config = models[1].config  # the context's 2 blocks at least: keys, values (each layer) and final hidden states of 16 tokens
        assert metric(server.url, "gpt2_prefix_cache_bytes") >= 2 * 16 * config.n_embd * (2 * config.n_layer + 1) * 4
        assert metric(plain.url, "gpt2_prefix_cache_bytes") == 0
    finally:
        plain.stop()


def test_concurrent_requests_equal_the_same_requests_one_at_a_time(models, server):
    """8 clients at once, greedy and seeded sampling mixed: each gets the answer it gets alone."""
    requests = [dict(prompt=f"Request number {i} says", max_tokens=10 + 3 * i, temperature=0 if i % 2 else 0.8, seed=i)
                for i in range(8)]  # fmt: skip
    client = server.client()
    alone = [complete(client, **r).choices[0].text for r in requests]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda r: complete(server.client(), **r).choices[0].text, requests))
    assert together == alone
    assert alone[1] == ours(models, requests[1]["prompt"], max_new_tokens=13, temperature=0)[0]


def test_a_short_request_sent_during_a_long_one_finishes_first(client):
    long = complete(client, prompt="A long story:", max_tokens=N_CTX - 10, temperature=0, stream=True)
    next(iter(long))  # the long request is being generated
    started = time.monotonic()
    short = complete(client, prompt="Short:", max_tokens=3, temperature=0)
    short_took = time.monotonic() - started
    rest = list(long)
    long_took = time.monotonic() - started
    assert short.choices[0].finish_reason == "length" and rest[-1].choices[0].finish_reason == "length"
    assert short_took < long_took / 2


def test_a_client_that_leaves_frees_its_rows(server, client):
    """Mid-stream, or while waiting for a whole answer: the rows leave the batch, the server serves on."""
    scheduler, registry = server.app.state.server.scheduler, server.app.state.server.metrics.registry
    generated = lambda: registry.get_sample_value("gpt2_generated_tokens_total")  # noqa: E731

    def rows_leave(before: float, asked: int):
        deadline = time.monotonic() + 10
        while scheduler.decoder.active:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert generated() - before < asked / 2  # they left early, not at their end

    body = {"model": "tiny", "prompt": "Leaving soon", "max_tokens": 110, "stream": True}
    before = generated()
    with httpx.stream("POST", server.url + "/v1/completions", json=body) as response:
        assert next(response.iter_lines()).startswith("data: ")
    rows_leave(before, 110)
    before = generated()
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        post(server, {**body, "stream": False, "n": 8}, timeout=0.3)
    rows_leave(before, 8 * 110)
    assert complete(client, prompt="Still there?", max_tokens=3).choices[0].finish_reason == "length"


def gauges(url: str) -> dict[str, float]:
    """The gauges of rows, as Prometheus' own parser reads /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    names = ("gpt2_queue_length", "gpt2_batch_size", "gpt2_rows_in_flight")
    return {f.name: f.samples[0].value for f in text_string_to_metric_families(httpx.get(url + "/metrics").text) if f.name in names}


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
        wait_for_gauge(running.url, "gpt2_rows_in_flight", 0, 10)
        assert gauges(running.url) == {"gpt2_queue_length": 0, "gpt2_batch_size": 0, "gpt2_rows_in_flight": 0}
    finally:
        gate.set()
        running.stop()


def test_the_rows_of_clients_that_left_while_waiting_free_their_places_in_the_queue(models):
    """A client gone before its row had a slot: the row leaves the queue at the next step, not
    once a slot frees, so it holds no place of max_queue (a 429 for rows nobody waits for)."""
    running = Running(lambda: (models[1], ENC), limits=Limits(max_batch_size=1, max_queue=2))
    scheduler = running.app.state.server.scheduler
    step = scheduler.decoder.step
    scheduler.decoder.step = lambda: time.sleep(0.1) or step()  # the long request holds the one slot for 12 s
    long = {"prompt": "A long answer:", "max_tokens": N_CTX - 10, "stream": True}
    try:
        with httpx.stream("POST", running.url + "/v1/completions", json=long, timeout=30) as first:
            lines = first.iter_lines()  # kept: an iterator collected closes the connection
            assert next(lines).startswith("data: ")  # it has the slot
            with contextlib.ExitStack() as stack:  # two clients wait, then leave before their first token
                for _ in range(2):
                    waiting = stack.enter_context(httpx.stream("POST", running.url + "/v1/completions", json={**long, "max_tokens": 5}))
                    assert waiting.status_code == 200
                wait_for_gauge(running.url, "gpt2_queue_length", 2, 10)
            wait_for_gauge(running.url, "gpt2_queue_length", 0, 3)  # not once the long one ends, 12 s from now
            with httpx.stream("POST", running.url + "/v1/completions", json={**long, "max_tokens": 5}) as response:
                assert response.status_code == 200  # not 429: nobody waits
    finally:
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
        with httpx.stream("POST", running.url + "/v1/completions", json={"prompt": "one", "max_tokens": 2, "stream": True}) as first:
            assert first.status_code == 200
            while not scheduler.decoder.waiting:  # taken by the loop, which waits at the gate
                time.sleep(0.01)
        row = scheduler.decoder.waiting[0]
        deadline = time.monotonic() + 10
        while not row.done and time.monotonic() < deadline:  # the server saw the client leave
            time.sleep(0.01)
        assert row.done and row in scheduler.decoder.waiting  # still queued: the loop has not stepped
        with ThreadPoolExecutor(1) as pool:
            again = pool.submit(post, running, {"prompt": "two", "max_tokens": 2})
            while not scheduler.incoming and not again.done():
                time.sleep(0.01)
            gate.set()
            assert again.result().status_code == 200
    finally:
        gate.set()
        running.stop()


def test_prompts_of_every_length_give_onednn_a_few_shapes(models, server, monkeypatch):
    """oneDNN builds and keeps a kernel for each shape of rows it is given (up to 1,024 of them):
    a server meeting prompts of every length grew by 170 MB (benchmarks/load.py). The rows it
    gets are padded to a few sizes, and the padding changes no log-probability."""
    from gpt2 import _gemv

    sizes, onednn = set(), _gemv._onednn_linear

    def recording(x, *args):
        sizes.add(x.numel() // x.size(-1))
        return onednn(x, *args)

    monkeypatch.setattr(_gemv, "_onednn_linear", recording)
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


def test_a_choice_reads_each_token_as_it_was_when_made():
    """The loop runs ahead of the routes: a row may have ended by the time its route reads an
    earlier token, which must still count (once, a race cut answers short)."""
    from gpt2.decoding import LENGTH, Row
    from gpt2.serve import ChoiceStream, CompletionRequest

    tokens = ENC.encode(" one two three")
    row = Row(ENC.encode("Count:"), len(tokens), logprobs=0)
    row.tokens, row.finish_reason = list(tokens), LENGTH  # the loop is done already
    row.token_logprobs, row.top_logprobs = [-1.0, -2.0, -3.0], [[], [], []]
    choice = ChoiceStream(0, row, ENC, CompletionRequest([row.prompt], [row], stop=[], logprobs=0))
    pieces = [choice.add(t, LENGTH if i == len(tokens) - 1 else None) for i, t in enumerate(tokens)]
    assert "".join(pieces) == " one two three" and choice.finish_reason == LENGTH and choice.tokens == 3
    assert choice.to_dict()["logprobs"]["token_logprobs"] == [-1.0, -2.0, -3.0]


# ------------------------------------------------------------------ errors


def post(server, body, path="/v1/completions", **options):
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return httpx.post(server.url + path, content=content, headers={"content-type": "application/json"}, **options)


BAD_REQUESTS = [
    ({"prompt": "hi", "max_tokens": -1}, "max_tokens", "max_tokens must be an integer from 0 to 128, got -1"),
    ({"prompt": "hi", "temperature": -0.5}, "temperature", "temperature must be a finite number >= 0"),
    ({"prompt": "hi", "top_p": 0}, "top_p", "top_p must be in (0, 1], got 0"),
    ({"prompt": "hi", "top_p": 1.5}, "top_p", "top_p must be in (0, 1], got 1.5"),
    ({"prompt": "hi", "n": 0}, "n", "n must be an integer from 1 to 16, got 0"),
    ({"prompt": "hi", "n": 17}, "n", "n must be an integer from 1 to 16, got 17"),
    ({"prompt": "hi", "logprobs": 6}, "logprobs", "logprobs must be an integer from 0 to 5, got 6"),
    ({"prompt": "hi", "top_k": 0}, "top_k", "top_k must be an integer from 1 to 50257, got 0"),
    ({"prompt": "hi", "seed": -1}, "seed", "seed must be a whole number from 0"),
    ({"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, "stop", "up to 4 stop strings, got 5"),
    ({"prompt": "hi", "stop": [""]}, "stop", "stop strings must be non-empty text"),
    ({"prompt": "hi", "stream": "yes"}, "stream", "stream must be true or false"),
    ({"prompt": "hi", "return_token_ids": 1}, "return_token_ids", "return_token_ids must be true or false"),
    ({"prompt": "hi", "temperature": "hot"}, "temperature", "temperature must be a finite number"),
    ({"max_tokens": 5}, "prompt", "you must provide a prompt"),
    ({"prompt": []}, "prompt", "prompt must be a string, a list of strings"),
    ({"prompt": [15496, 50257]}, "prompt", "token id 50257 in prompt is out of range: ids are 0..50256"),
    ({"prompt": [[15496], [-1]]}, "prompt", "token id -1 in prompt is out of range"),
    ({"prompt": [15496] * 100, "max_tokens": 29}, "prompt", "maximum context length is 128 tokens, however you requested 129 "
                                                            "tokens (100 in your prompt; 29 for the completion)"),
    ({"prompt": "hi", "frobnicate": 1}, "frobnicate", "Unrecognized request argument supplied: frobnicate"),
    ({"prompt": "hi", "presence_penalty": 0.5}, "presence_penalty", "presence_penalty is not supported"),
]


@pytest.mark.parametrize("body, param, message", BAD_REQUESTS, ids=[b[1] + str(i) for i, b in enumerate(BAD_REQUESTS)])
def test_a_bad_request_gets_a_400_naming_the_field_and_the_server_keeps_serving(server, body, param, message):
    response = post(server, {"model": "tiny", **body})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == param and message in error["message"]
    assert error["type"] == "invalid_request_error" and "code" in error
    assert httpx.get(server.url + "/health").status_code == 200


def test_a_request_past_the_context_is_refused_in_openais_words_and_code(server):
    """The library's context check (gpt2.decoding.Request), answered as OpenAI's API answers it."""
    error = post(server, {"prompt": ["hi", [15496] * 120], "max_tokens": 9}).json()["error"]
    assert (error["param"], error["code"]) == ("prompt", "context_length_exceeded")
    assert error["message"].startswith("This model's maximum context length is 128 tokens, however you requested 129 tokens")


def test_the_openai_client_raises_its_own_errors(client):
    with pytest.raises(openai.BadRequestError, match="max_tokens must be an integer"):
        complete(client, prompt="hi", max_tokens=-3)
    with pytest.raises(openai.NotFoundError, match="The model `gpt-4` does not exist"):
        client.completions.create(model="gpt-4", prompt="hi")


def test_invalid_json_an_oversized_body_and_unknown_routes(server):
    response = post(server, "{not json")
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]
    response = post(server, {"prompt": "x" * (1 << 20)})
    assert response.status_code == 413 and "over the limit of 1048576 bytes" in response.json()["error"]["message"]
    response = post(server, ["a", "list"])
    assert response.status_code == 400 and "must be a JSON object" in response.json()["error"]["message"]
    response = httpx.get(server.url + "/v1/chat/completions")
    assert response.status_code in (404, 405) and "error" in response.json()


def test_a_chat_request_to_a_model_without_a_template_is_a_400_saying_how_to_add_one(client):
    with pytest.raises(openai.BadRequestError, match="the model tiny has no chat template") as caught:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}])
    error = caught.value.body
    assert caught.value.status_code == 400 and error["type"] == "invalid_request_error" and error["param"] == "messages"
    # the server's flag, for whoever started it (no command line stands between the server and its client to name it)
    assert "start the server with gpt2 serve --chat-template FILE (a Jinja2 file" in error["message"]
    assert "/v1/completions continues a text" in error["message"]


@pytest.fixture(scope="module")
def char_server(tmp_path_factory):
    """A character model ("out-char/", as tab completion writes its directory) whose vocabulary is " " to "`"."""
    directory = tmp_path_factory.mktemp("out-char")
    make_hf_model(vocab_size=65, n_positions=32, n_embd=32, n_layer=1, n_head=2).save_pretrained(directory)
    CharTokenizer([chr(c) for c in range(32, 97)]).save(directory)
    model = GPT2.from_pretrained(directory, device="cpu")
    running = Running(lambda: (model, model.tokenizer), model_id="out-char/")
    yield running
    running.stop()


def test_a_character_a_character_model_lacks_is_a_400_naming_it(char_server):
    client = char_server.client()
    with pytest.raises(openai.BadRequestError, match="character '日' at position 4 is not in this 65-character vocab") as caught:
        client.completions.create(model="out-char", prompt="DEF 日本", max_tokens=3)
    assert caught.value.body["param"] == "prompt"
    response = post(char_server, {"prompt": ["DEF", "A é"], "max_tokens": 3})
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("prompt 1: character 'é' at position 2 ")
    for field in ("content", "prompt"):
        response = httpx.post(char_server.url + "/tokenize", json={field: "DEF 日本"})
        error = response.json()["error"]
        assert response.status_code == 400 and error["param"] == field and "character '日' at position 4" in error["message"]
    assert client.completions.create(model="out-char", prompt="DEF ", max_tokens=3).usage.completion_tokens == 3


def test_a_directory_given_with_a_trailing_slash_is_served_without_it(char_server):
    client = char_server.client()
    assert [m.id for m in client.models.list().data] == ["out-char"] and client.models.retrieve("out-char").id == "out-char"
    assert client.completions.create(model="out-char", prompt="A", max_tokens=2).model == "out-char"


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
            while len(scheduler.decoder.waiting) < 1:  # taken by the loop, which waits at the gate
                time.sleep(0.01)
            second = pool.submit(post, running, {"prompt": "two", "max_tokens": 2})
            while len(scheduler.incoming) < 1:
                time.sleep(0.01)
            response = post(running, {"prompt": "three", "max_tokens": 2})
            assert response.status_code == 429 and response.headers["retry-after"] == "1"
            assert "busy: 2 rows wait already" in response.json()["error"]["message"]
            gate.set()
            assert first.result().status_code == second.result().status_code == 200
    finally:
        gate.set()
        running.stop()


def test_an_api_key_is_required_when_set(models):
    running = Running(lambda: (models[1], ENC), limits=Limits(api_key="s3cret"))
    try:
        with pytest.raises(openai.AuthenticationError, match="Incorrect or missing API key"):
            running.client(api_key="wrong").completions.create(model="tiny", prompt="hi", max_tokens=2)
        assert httpx.get(running.url + "/v1/models").status_code == 401
        assert post(running, {"prompt": "hi"}, "/v1/inspect").status_code == 401
        page = httpx.get(running.url + "/")  # the playground's files are open; the page asks for the key
        assert page.status_code == 200 and 'id="api-key"' in page.text
        assert httpx.get(running.url + "/ui/playground.js").status_code == 200
        assert running.client(api_key="s3cret").completions.create(model="tiny", prompt="hi", max_tokens=2).choices[0].text is not None
        assert httpx.get(running.url + "/health").status_code == 200
    finally:
        running.stop()


def test_health_answers_503_until_the_model_is_loaded(models):
    loaded = threading.Event()

    def load():
        loaded.wait(30)
        return models[1], ENC

    running = Running(load, wait=False)
    try:
        response = httpx.get(running.url + "/health")
        assert response.status_code == 503 and "still loading" in response.json()["error"]["message"]
        assert post(running, {"prompt": "hi"}).status_code == 503
        loaded.set()
        running.wait_ready()
    finally:
        running.stop()


# ------------------------------------------------------------------ token ids (vLLM's return_token_ids)


def api_token(i: int) -> str:
    """A token as OpenAI's API writes it in logprobs: its text, or "bytes:\\xNN" for part of a character."""
    raw = ENC.decode_bytes([i])
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def test_return_token_ids_gives_the_ids_generate_makes_whole_and_streamed(models, client):
    prompt = "Token ids, please:"
    expected = ours(models, prompt, max_new_tokens=12, temperature=0)[0]
    whole = complete(client, prompt=prompt, max_tokens=12, temperature=0, extra_body={"return_token_ids": True})
    choice = whole.choices[0].model_dump()
    assert choice["prompt_token_ids"] == ENC.encode(prompt)
    assert ENC.decode(choice["token_ids"]) == choice["text"] == expected and len(choice["token_ids"]) == whole.usage.completion_tokens
    chunks = [c.choices[0].model_dump() for c in complete(client, prompt=prompt, max_tokens=12, temperature=0, stream=True,
                                                          logprobs=2, extra_body={"return_token_ids": True}) if c.choices]  # fmt: skip
    assert chunks[0]["prompt_token_ids"] == ENC.encode(prompt) and all("prompt_token_ids" not in c for c in chunks[1:])
    assert [i for c in chunks for i in c["token_ids"]] == choice["token_ids"]
    for c in chunks:  # each chunk's ids are the tokens its log-probabilities list
        assert [api_token(i) for i in c["token_ids"]] == c["logprobs"]["tokens"]
    plain = complete(client, prompt=prompt, max_tokens=3).choices[0].model_dump()
    assert "token_ids" not in plain and "prompt_token_ids" not in plain  # only when asked for


# ------------------------------------------------------------------ /v1/inspect


def test_inspect_equals_transformers_attention_logprobs_and_logit_lens(models, server):
    hf = make_hf_model(seed=5, vocab_size=50257, n_positions=N_CTX, n_embd=48, n_layer=2, n_head=3, attn_implementation="eager")
    text = "The quick brown fox jumps over the lazy dog."
    ids = ENC.encode(text)
    answer = post(server, {"model": "tiny", "prompt": text, "top_k": 3}, "/v1/inspect").json()
    assert answer["ids"] == ids and answer["tokens"] == [api_token(i) for i in ids]
    with torch.no_grad():
        out = hf(torch.tensor([ids]), output_attentions=True, output_hidden_states=True)
    logprobs = torch.log_softmax(out.logits[0], dim=-1)  # (T, V)
    assert answer["logprobs"][0] is None
    assert torch.allclose(torch.tensor(answer["logprobs"][1:]), logprobs[:-1].gather(-1, torch.tensor(ids[1:])[:, None])[:, 0], atol=1e-4)
    for position, top in enumerate(answer["top_logprobs"]):
        best = logprobs[position].topk(3)
        assert [e["id"] for e in top] == best.indices.tolist() and [e["token"] for e in top] == [api_token(e["id"]) for e in top]
        assert torch.allclose(torch.tensor([e["logprob"] for e in top]), best.values, atol=1e-4)
    attention = torch.tensor(answer["attention"])  # (L, H, T, T), rounded to 4 decimals
    assert attention.shape == (2, 3, len(ids), len(ids))
    assert torch.allclose(attention, torch.cat(out.attentions), atol=6e-5)
    for layer, row in enumerate(answer["logit_lens"]):  # transformers' hidden_states[layer] enters block `layer`
        stream = out.hidden_states[layer] if layer < 2 else out.hidden_states[2]  # the last one is after ln_f already
        read = hf.lm_head(hf.transformer.ln_f(stream) if layer < 2 else stream)[0]
        best = torch.softmax(read, dim=-1).max(dim=-1)
        assert [e["id"] for e in row] == best.indices.tolist()
        assert torch.allclose(torch.tensor([e["prob"] for e in row]), best.values, atol=1e-5)
        assert [e["token"] for e in row] == [api_token(e["id"]) for e in row]


BAD_INSPECTIONS = [
    ({"prompt": ["one", "two"]}, "prompt", "/v1/inspect looks at one prompt at a time, got 2"),
    ({"prompt": "hi", "top_k": 0}, "top_k", "top_k must be an integer from 1 to 20, got 0"),
    ({"prompt": "hi", "top_k": 21}, "top_k", "top_k must be an integer from 1 to 20, got 21"),
    ({"prompt": "hi", "max_tokens": 3}, "max_tokens", "Unrecognized request argument supplied: max_tokens"),
    ({}, "prompt", "you must provide a prompt"),
    ({"prompt": [1, 50257]}, "prompt", "token id 50257 in prompt is out of range"),
    ({"prompt": [15496] * 129}, "prompt", "This model's maximum context length is 128 tokens, however your prompt has 129"),
]


@pytest.mark.parametrize("body, param, message", BAD_INSPECTIONS, ids=[b[1] + str(i) for i, b in enumerate(BAD_INSPECTIONS)])
def test_a_bad_inspection_gets_a_400_naming_the_field(server, body, param, message):
    response = post(server, body, "/v1/inspect")
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == param and message in error["message"]
    assert post(server, {"prompt": "hi", "model": "other"}, "/v1/inspect").status_code == 404


def test_an_inspection_past_the_answer_bound_is_refused_saying_how_far_it_goes(models):
    running = Running(lambda: (models[1], ENC), limits=Limits(max_inspect_cells=6 * 20 * 20))  # 2 layers x 3 heads: 20 tokens
    try:
        assert post(running, {"prompt": [15496] * 20}, "/v1/inspect").status_code == 200
        error = post(running, {"prompt": [15496] * 21}, "/v1/inspect").json()["error"]
        assert (error["param"], error["code"]) == ("prompt", "inspection_too_large")
        assert "2 layers x 3 heads x 21 x 21 = 2,646 attention probabilities, over this server's limit of 2,400" in error["message"]
        assert "at most 20 tokens" in error["message"]
    finally:
        running.stop()
    with pytest.raises(GPT2Error, match="max_inspect_cells must be"):
        Limits(max_inspect_cells=0).check()


def test_a_step_budget_below_the_batch_is_refused_naming_both():
    with pytest.raises(GPT2Error, match=r"max_num_batched_tokens must be at least max_batch_size \(8\), .*; got 4"):
        Limits(max_num_batched_tokens=4).check()


def test_the_playground_is_served_at_the_root_unless_turned_off(models, server):
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    for name in ("playground.js", "playground.css"):
        assert httpx.get(f"{server.url}/ui/{name}").status_code == 200
    assert httpx.get(server.url + "/ui/missing.js").status_code == 404
    card = httpx.get(server.url + "/v1/models").json()["data"][0]
    assert card["max_model_len"] == N_CTX and card["num_parameters"] == sum(p.numel() for p in models[0].parameters())
    running = Running(lambda: (models[1], ENC), ui=False)
    try:
        assert httpx.get(running.url + "/").status_code == 404 and httpx.get(running.url + "/ui/playground.js").status_code == 404
        assert post(running, {"prompt": "hi"}, "/v1/inspect").status_code == 200  # the API stays
    finally:
        running.stop()


# ------------------------------------------------------------------ other endpoints


def test_models_tokenize_detokenize_and_metrics(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    text = "Hello world, 🤗 and 中文<|endoftext|>"
    tokens = httpx.post(server.url + "/tokenize", json={"content": text}).json()["tokens"]
    assert tokens == ENC.encode(text, allowed_special="all") and tokens[-1] == 50256  # the special token, as vLLM's
    assert httpx.post(server.url + "/tokenize", json={"prompt": text, "add_special_tokens": False}).json()["tokens"] == tokens
    assert httpx.post(server.url + "/detokenize", json={"tokens": tokens}).json() == {"content": text, "prompt": text}
    info = httpx.get(server.url + "/tokenizer_info").json()  # what lm-evaluation-harness's remote tokenizer reads
    assert info["eos_token"] == "<|endoftext|>" and info["model_max_length"] == N_CTX
    bad = httpx.post(server.url + "/detokenize", json={"tokens": [1, 99999]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    complete(client, prompt="Counting", max_tokens=4)
    metrics = httpx.get(server.url + "/metrics").text
    for name in ("gpt2_requests_total{", "gpt2_prompt_tokens_total", "gpt2_generated_tokens_total", "gpt2_queue_length",
                 "gpt2_batch_size", "gpt2_time_to_first_token_seconds_bucket"):  # fmt: skip
        assert name in metrics
    assert 'gpt2_requests_total{endpoint="/v1/completions",status="200"}' in metrics
    post(server, {"prompt": "hi"}, "/v1/inspect")
    assert 'gpt2_requests_total{endpoint="/v1/inspect",status="200"}' in httpx.get(server.url + "/metrics").text
    generated = next(line for line in metrics.splitlines() if line.startswith("gpt2_generated_tokens_total"))
    assert float(generated.split()[1]) >= 4


# ------------------------------------------------------------------ a draft model (speculative decoding)


@pytest.fixture(scope="module")
def draft_dir(models, tmp_path_factory):
    """A draft of the served model's vocabulary, which agrees with it often, not always."""
    directory = tmp_path_factory.mktemp("draft")
    perturbed(models[0], 0.5).save_pretrained(directory)
    return str(directory)


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
        assert (whole.text, whole.finish_reason) == (expected.choices[0].text[: expected.choices[0].text.index(stop)], "stop")
        chunks = list(complete(drafted, stream=True, **request))
        assert "".join(c.choices[0].text for c in chunks) == whole.text and chunks[-1].choices[0].finish_reason == "stop"
        assert 0 < metric(running.url, "gpt2_draft_accepted_tokens_total") < metric(running.url, "gpt2_draft_tokens_total")
    finally:
        running.stop()


def test_gpt2_serve_with_a_draft_model_and_its_refusals_in_one_line(models, draft_dir, capsys, tmp_path):
    process, url = gpt2_serve("--model", models[2], "--draft-model", draft_dir, "--draft-tokens", "2")
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        served = client.completions.create(model=models[2], prompt="Hello", max_tokens=12, temperature=0).choices[0].text
        assert served == ours(models, "Hello", max_new_tokens=12, temperature=0)[0]
        assert metric(url, "gpt2_draft_tokens_total") > 0
    finally:
        process.kill()
    make_hf_model(vocab_size=65, n_positions=32, n_embd=32, n_layer=1, n_head=2).save_pretrained(tmp_path)
    CharTokenizer([chr(c) for c in range(32, 97)]).save(tmp_path)
    capsys.readouterr()
    for flags, message in [
        (["--draft-model", str(tmp_path)], "--draft-model has a vocabulary of 65 tokens, the model 50,257: "
                                           "a draft model must share the model's tokenizer"),
        (["--draft-tokens", "3"], "--draft-tokens is the number of tokens a draft model proposes: give --draft-model too"),
        (["--draft-model", draft_dir, "--draft-tokens", "0"], "--draft-tokens must be a positive integer, got 0"),
    ]:  # fmt: skip  (refused before the port is taken: no "serving ... on" first)
        assert main(["serve", "--model", models[2], "--port", str(free_port()), *flags]) == 2
        assert capsys.readouterr().err == f"gpt2: error: {message}\n"


# ------------------------------------------------------------------ the command


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpt2_serve(*flags: str) -> tuple[subprocess.Popen, str]:
    """`gpt2 serve` in a process of its own, once its model has loaded; and its URL."""
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO / "src")}
    argv = [sys.executable, "-m", "gpt2", "serve", "--port", str(port), "--device", "cpu", *flags]
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=heed_ctrl_c)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url + "/health").status_code == 200:
                return process, url
        except httpx.ConnectError:
            pass
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            raise AssertionError(f"gpt2 serve did not start: {process.communicate()}")
        time.sleep(0.1)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_gpt2_serve_stops_cleanly_on_a_signal_ending_requests_in_flight(models, sig):
    process, url = gpt2_serve("--model", models[2])
    port = int(url.rsplit(":", 1)[1])
    try:
        body = {"model": models[2], "prompt": "A very long answer:", "max_tokens": N_CTX - 10, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: {")
            process.send_signal(sig)
            rest = [line for line in lines if line]
        assert any('"error"' in line and "shutting down" in line for line in rest) and rest[-1] == "data: [DONE]"
        # uvicorn shuts down, then dies of SIGTERM as the signal's default would (or exits 0, in older
        # uvicorns); SIGINT comes back as KeyboardInterrupt, which gpt2 reports with the usual 130
        assert process.wait(timeout=20) in ((0, -signal.SIGTERM) if sig == signal.SIGTERM else (0, 130))
        err = process.stderr.read() + process.stdout.read()  # uvicorn logs requests to stdout
        assert f"serving {models[2]} on http://127.0.0.1:{port}/v1; the playground on http://127.0.0.1:{port}/ (" in err
        assert '"POST /v1/completions HTTP/1.1" 200' in err
        assert "Application shutdown complete" in err
    finally:
        process.kill()


def test_gpt2_serve_special_as_text_no_ui_and_a_directory_with_a_trailing_slash(models, capsys):
    """The flags reach the server: its greedy answer equals gpt2 generate --special-as-text's, the
    page is off, the answer bound is the one given; the id loses the slash."""
    process, url = gpt2_serve("--model", models[2] + "/", "--special-as-text", "--no-ui", "--max-inspect-cells", "600")
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        assert [m.id for m in client.models.list().data] == [models[2]]
        served = client.completions.create(model=models[2], prompt=SPECIAL_PROMPT, max_tokens=12, temperature=0).choices[0].text
        as_text, special = (gpt2_generate(capsys, models, SPECIAL_PROMPT, *flags) for flags in (["--special-as-text"], []))
        assert served == as_text != special
        assert httpx.get(url + "/").status_code == 404
        assert httpx.post(url + "/v1/inspect", json={"prompt": [1] * 10}).status_code == 200  # 2 x 3 x 10 x 10 = 600
        assert "limit of 600" in httpx.post(url + "/v1/inspect", json={"prompt": [1] * 11}).json()["error"]["message"]
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 130
        assert f"gpt2: serving {models[2]}/ on {url}/v1 (" in process.stderr.read()
    finally:
        process.kill()


SLOW_LOAD = """
import sys, time, torch
import gpt2.model
from gpt2.cli import main

def load_for_a_minute(*args, **kwargs):  # a long load, inside torch as a real one is
    a, deadline = torch.rand(256, 256), time.monotonic() + 60
    while time.monotonic() < deadline:
        a = torch.tanh(a @ a)
    raise AssertionError("the load was not interrupted")

gpt2.model.GPT2.from_pretrained = load_for_a_minute
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_while_the_model_loads_ends_cleanly(models, sig):
    """Not SIGABRT ("terminate called without an active exception"): no thread is inside torch when the process ends."""
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO / "src")}
    argv = [sys.executable, "-c", SLOW_LOAD, "serve", "--model", models[2], "--port", str(port), "--device", "cpu"]
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=heed_ctrl_c)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/health")
                assert response.status_code == 503 and "still loading" in response.text
                break
            except httpx.ConnectError:
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.1)
        time.sleep(0.5)  # well into the load
        process.send_signal(sig)
        sent = time.monotonic()
        code = process.wait(timeout=30)
        took = time.monotonic() - sent
        err = process.stderr.read()
        assert "terminate called" not in err and "Traceback" not in err and "Fatal Python error" not in err, err
        if sig == signal.SIGINT:  # "gpt2: interrupted" and 130, as every command
            assert (code, err.splitlines()[-1]) == (130, "gpt2: interrupted")
        else:  # SIGTERM takes its default course, as once the model has loaded
            assert code == -signal.SIGTERM
        assert took < 10
    finally:
        process.kill()


def test_gpt2_serve_refuses_a_busy_port_and_a_missing_model_in_one_line(models, capsys, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--model", models[2], "--port", str(port)]) == 2
        err = capsys.readouterr().err  # one line: no "serving ... on" before it
        assert err.startswith(f"gpt2: error: cannot listen on 127.0.0.1:{port}: ") and err.count("\n") == 1
    # an address of no interface here (TEST-NET-1, documentation's own), so that no name is looked up
    assert main(["serve", "--model", models[2], "--host", "192.0.2.1", "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpt2: error: cannot listen on 192.0.2.1:") and err.count("\n") == 1
    assert main(["serve", "--model", str(tmp_path / "nowhere"), "--port", str(free_port())]) == 2
    err = capsys.readouterr().err  # found before the port is taken: no "serving ... on" either
    assert err.startswith(f"gpt2: error: unknown model '{tmp_path / 'nowhere'}'") and err.count("\n") == 1
    assert main(["serve", "--max-batch-size", "0"]) == 2
    assert capsys.readouterr().err == "gpt2: error: --max-batch-size must be a positive integer, got 0\n"
    assert main(["serve", "--max-num-batched-tokens", "4"]) == 2
    assert capsys.readouterr().err == ("gpt2: error: --max-num-batched-tokens must be at least "
                                       "--max-batch-size (8), as each step decodes a token of every row; got 4\n")  # fmt: skip
    assert main(["serve", "--prefix-cache-mb", "-1"]) == 2
    assert capsys.readouterr().err == "gpt2: error: --prefix-cache-mb must be a whole number of MB, 0 for none, got -1\n"
    assert main(["serve", "--port", "99999"]) == 2  # refused before the server says it serves
    assert capsys.readouterr().err == "gpt2: error: --port must be an integer from 0 to 65535, got 99999\n"
    assert main(["serve", "--cuda-graphs", "--device", "cpu"]) == 2
    assert capsys.readouterr().err == "gpt2: error: --cuda-graphs replays decoding on a CUDA GPU; --device cpu is cpu\n"


MEMORY_LEFT = """
import sys
import gpt2.devices
LEFT = int(sys.argv.pop(1))  # what the machine has left, in bytes
gpt2.devices.available_memory = lambda device: LEFT
from gpt2.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_batch_whose_kv_cache_cannot_fit_is_refused_before_the_port_is_taken(models):
    """Each row of --max-batch-size holds a KV cache of the whole context (and its step's logits)."""
    needed = 64 * (2 * 2 * N_CTX * 48 * 4 + 3 * 50257 * 4)  # 64 rows: float32 keys and values of 2 layers, 48 wide
    port = free_port()
    argv = [sys.executable, "-c", MEMORY_LEFT, "10000000", "serve", "--model", models[2], "--port", str(port), "--max-batch-size", "64"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO / "src")}
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr == (f"gpt2: error: a KV cache of 64 rows of {N_CTX} positions needs about {needed / 1e6:.1f} MB of "
                             f"memory, but the CPU has 10.0 MB available: a smaller --max-batch-size\n")  # fmt: skip


def test_an_app_whose_batch_cannot_fit_fails_to_load_and_says_why(models, monkeypatch):
    from gpt2 import MemoryLimitError, devices

    monkeypatch.setattr(devices, "available_memory", lambda device: 1_000_000)
    server = create_app(lambda: (models[1], ENC), "tiny", Limits(max_batch_size=4), load_in_background=False).state.server
    with pytest.raises(MemoryLimitError, match=r"a KV cache of 4 rows of 128 positions needs about .*: a smaller max_batch_size$") as e:
        server.load_model()
    assert e.value.param == "max_batch_size"


# ------------------------------------------------------------------ chat completions

EOT = 50256
ENDS_AT = 40  # the chat model's replies end with <|endoftext|> once the text reaches this position
QUESTION = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "What is the capital of France?"}]
# A ChatML-like template that refuses a conversation opened by the assistant (raise_exception, line 2)
CHATML = ("{% for message in messages %}\n"
          "{% if loop.first and message['role'] == 'assistant' %}{{ raise_exception('the assistant cannot speak first') }}{% endif %}\n"
          "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + eos_token + '\\n' }}\n"
          "{% endfor %}\n"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")  # fmt: skip


@pytest.fixture(scope="module")
def chat_models(tmp_path_factory):
    """A tiny model saved with gpt2's default chat template, whose replies end: from position
    ENDS_AT on, a large vector in the position embeddings points at <|endoftext|>'s embedding, so
    that greedy decoding writes it there (and ordinary text before). With transformers' tokenizer
    of the same directory, which reads the template from tokenizer_config.json."""
    from transformers import AutoTokenizer

    from gpt2.chat import DEFAULT_TEMPLATE

    directory = tmp_path_factory.mktemp("chat")
    hf = make_hf_model(seed=2, vocab_size=50257, n_positions=N_CTX, n_embd=48, n_layer=2, n_head=3)
    with torch.no_grad():
        u = torch.nn.functional.normalize(torch.randn(48, generator=torch.Generator().manual_seed(0)), dim=0)
        hf.transformer.wpe.weight[ENDS_AT:] += 50 * u
        hf.transformer.wte.weight[EOT] = 0.2 * u  # small elsewhere: not the most likely token before ENDS_AT
    hf.save_pretrained(directory)
    Tokenizer.gpt2().with_chat_template(DEFAULT_TEMPLATE).save_pretrained(directory)
    model = GPT2.from_pretrained(directory, device="cpu")
    assert model.tokenizer.chat_template == DEFAULT_TEMPLATE
    return hf, model, AutoTokenizer.from_pretrained(directory), str(directory)


@pytest.fixture(scope="module")
def chat_server(chat_models):
    model = chat_models[1]
    running = Running(lambda: (model, model.tokenizer))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def chat_client(chat_server):
    return chat_server.client()


def transformers_reply(chat_models, messages, max_new_tokens=60, **template):
    """transformers' greedy reply on its apply_chat_template ids: (its ids, its text, the prompt's ids)."""
    hf, _, hf_tokenizer, _ = chat_models
    ids = list(hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False, **template))
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=EOT, pad_token_id=EOT)
    new = out[0, len(ids) :].tolist()
    return new, hf_tokenizer.decode(new, skip_special_tokens=True), ids


def test_a_greedy_reply_is_transformers_greedy_generation_on_the_templates_ids(chat_models, chat_server, chat_client):
    from openai.types.chat import ChatCompletion

    new, text, prompt = transformers_reply(chat_models, QUESTION)
    assert new[-1] == EOT and EOT not in new[:-1] and text.startswith(" ")  # the reply ends, and begins with the template's space
    response = chat_client.chat.completions.create(model="tiny", messages=QUESTION, temperature=0)
    choice = response.choices[0]
    # the content less the template's space after "Assistant:", which it writes back when the history returns
    assert choice.message.content == text[1:] and choice.message.role == "assistant" and choice.finish_reason == "stop"
    assert response.object == "chat.completion" and response.id.startswith("chatcmpl-") and response.model == "tiny"
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (len(prompt), len(new))
    assert choice.logprobs is None and choice.index == 0
    raw = post(chat_server, {"messages": QUESTION, "temperature": 0}, "/v1/chat/completions").json()
    assert ChatCompletion.model_validate(raw).choices[0].message.content == text[1:]  # every field as the client's types have it


def test_a_template_in_tokenizer_config_json_without_tokenizer_files_is_the_models_own(chat_models, tmp_path):
    """GPT-2's tokenizer is assumed for a model of its vocabulary saved without one; the directory's
    template goes with it, as transformers reads that directory once GPT-2's files are added
    (chat_models' own directory, whose tokenizer transformers_reply uses)."""
    import shutil

    from gpt2.chat import DEFAULT_TEMPLATE

    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(Path(chat_models[3]) / name, tmp_path / name)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": DEFAULT_TEMPLATE}), encoding="utf-8")
    model = GPT2.from_pretrained(tmp_path, device="cpu")
    running = Running(lambda: (model, model.tokenizer))
    try:
        response = running.client().chat.completions.create(model="tiny", messages=QUESTION, temperature=0)
    finally:
        running.stop()
    new, text, prompt = transformers_reply(chat_models, QUESTION)
    assert response.choices[0].message.content == text[1:]  # less the template's space after "Assistant:"
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (len(prompt), len(new))


def test_a_streamed_reply_joins_to_the_whole_one_in_openais_chunks(chat_server, chat_client):
    from openai.types.chat import ChatCompletionChunk

    for request in ({"temperature": 0}, {"temperature": 1, "seed": 3, "max_tokens": 20}):
        whole = chat_client.chat.completions.create(model="tiny", messages=QUESTION, **request).choices[0]
        body = {"messages": QUESTION, "stream": True, "stream_options": {"include_usage": True}, **request}
        with httpx.stream("POST", chat_server.url + "/v1/chat/completions", json=body, timeout=30) as response:
            lines = [line for line in response.iter_lines() if line]
        assert lines[-1] == "data: [DONE]"
        chunks = [ChatCompletionChunk.model_validate(json.loads(line.removeprefix("data: "))) for line in lines[:-1]]
        assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
        first, *middle, last, usage = chunks
        assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content == ""
        assert "".join(c.choices[0].delta.content for c in middle) == whole.message.content and len(middle) > 3
        assert all(c.choices[0].finish_reason is None and c.choices[0].delta.role is None for c in middle)
        assert last.choices[0].finish_reason == whole.finish_reason and last.choices[0].delta.content is None
        assert usage.choices == [] and usage.usage.completion_tokens > 0
    assert whole.finish_reason == "length" and len(whole.message.content) > 0


def test_n_replies_follow_the_one_seed_rule(chat_models, chat_client):
    hf, _, hf_tokenizer, _ = chat_models
    ids = list(hf_tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, return_dict=False))
    response = chat_client.chat.completions.create(model="tiny", messages=QUESTION, n=3, seed=8, max_completion_tokens=12, top_p=0.9)
    assert [c.index for c in response.choices] == [0, 1, 2]
    for c in response.choices:  # reply k: transformers' sampling from seed 8 + k
        theirs = hf_tokenizer.decode(transformers_sampled(hf, ids, 12, 8 + c.index, top_p=0.9), skip_special_tokens=True)
        assert c.message.content == theirs.removeprefix(" ")
    assert len({c.message.content for c in response.choices}) == 3 and response.usage.completion_tokens == 36


def test_stop_strings_and_max_completion_tokens_end_a_reply(chat_models, chat_client):
    _, text, _ = transformers_reply(chat_models, QUESTION)
    stop = text[14:17]
    assert text.index(stop) > 5
    response = chat_client.chat.completions.create(model="tiny", messages=QUESTION, temperature=0, stop=[stop, "never appears"])
    assert response.choices[0].message.content == text[1 : text.index(stop)] and response.choices[0].finish_reason == "stop"
    chunks = list(chat_client.chat.completions.create(model="tiny", messages=QUESTION, temperature=0, stop=stop, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == response.choices[0].message.content
    response = chat_client.chat.completions.create(model="tiny", messages=QUESTION, temperature=0, max_completion_tokens=3)
    assert response.choices[0].finish_reason == "length" and response.usage.completion_tokens == 3
    assert text[1:].startswith(response.choices[0].message.content) and response.choices[0].message.content


def test_logprobs_and_top_logprobs_equal_transformers_log_softmax(chat_models, chat_client):
    new, _, prompt = transformers_reply(chat_models, QUESTION)
    with torch.no_grad():
        expected = torch.log_softmax(chat_models[0](torch.tensor([prompt + new])).logits[0].double(), dim=-1)
    response = chat_client.chat.completions.create(model="tiny", messages=QUESTION, temperature=0, logprobs=True, top_logprobs=3)
    content = response.choices[0].logprobs.content
    assert len(content) == len(new) == response.usage.completion_tokens  # every token of the reply, its <|endoftext|> too
    assert new[-1] == EOT and content[-1].token == "<|endoftext|>"  # by its name, as the tokens' alternatives have it
    for k, (entry, token) in enumerate(zip(content, new, strict=True)):
        at = expected[len(prompt) + k - 1]
        assert entry.token == ENC.decode([token]) and entry.bytes == list(ENC.token_bytes(token))
        assert abs(entry.logprob - float(at[token])) < 1e-4
        top = at.topk(3)
        assert [t.token for t in entry.top_logprobs] == [ENC.decode([t]) for t in top.indices.tolist()]
        assert max(abs(t.logprob - v) for t, v in zip(entry.top_logprobs, top.values.tolist())) < 1e-4
    streamed = chat_client.chat.completions.create(model="tiny", messages=QUESTION, temperature=0, logprobs=True, stream=True)
    entries = [e for c in streamed for e in (c.choices[0].logprobs.content if c.choices[0].logprobs else [])]
    assert [(e.token, e.logprob) for e in entries] == [(e.token, e.logprob) for e in content]
    assert all(e.top_logprobs == [] for e in entries)  # logprobs without top_logprobs: the chosen token's alone


def test_content_as_text_parts_reads_as_the_joined_text(chat_client):
    parts = [QUESTION[0], {"role": "user", "content": [{"type": "text", "text": "What is the capital"},
                                                        {"type": "text", "text": " of France?"}]}]  # fmt: skip
    answer = lambda messages: chat_client.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=8)  # noqa: E731
    assert answer(parts).choices[0].message.content == answer(QUESTION).choices[0].message.content


@pytest.fixture(scope="module")
def chatml_server(models):
    """The completions model, without a template of its own, served with one given (CHATML)."""
    running = Running(lambda: (models[1], ENC), chat_template=CHATML)
    yield running
    running.stop()


def test_a_template_given_to_the_server_renders_the_conversation(models, chat_models, chatml_server):
    hf_tokenizer = chat_models[2]
    prompt = hf_tokenizer.apply_chat_template(QUESTION, chat_template=CHATML, add_generation_prompt=True, tokenize=False)
    response = chatml_server.client().chat.completions.create(model="tiny", messages=QUESTION, temperature=0, max_tokens=10)
    assert response.usage.prompt_tokens == len(hf_tokenizer.apply_chat_template(QUESTION, chat_template=CHATML, add_generation_prompt=True,
                                                                                 return_dict=False))  # fmt: skip
    assert response.choices[0].message.content == ours(models, prompt, max_new_tokens=10, temperature=0)[0]  # no prefix to take off


def test_a_template_given_overrides_the_models_own(chat_models):
    model = chat_models[1]
    running = Running(lambda: (model, model.tokenizer), chat_template=CHATML)
    try:
        response = running.client().chat.completions.create(model="tiny", messages=QUESTION, max_tokens=1)
        assert response.usage.prompt_tokens == len(chat_models[2].apply_chat_template(QUESTION, chat_template=CHATML,
                                                                                       add_generation_prompt=True, return_dict=False))  # fmt: skip
    finally:
        running.stop()


LONG = [{"role": "user", "content": "word " * 120}]  # 126 tokens rendered with the generation prompt (transformers' count)
BAD_CHATS = [
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages", "messages[0].role must be one of system, user, assistant, got 'tool'"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages", "messages[0].content must be a string, got 3"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages",
     "messages[0].content: this model reads text only"),
    ({"messages": []}, "messages", "messages must be a non-empty list of messages"),
    ({}, "messages", "messages must be a non-empty list"),
    ({"messages": QUESTION, "logprobs": "yes"}, "logprobs", "logprobs must be true or false"),
    ({"messages": QUESTION, "top_logprobs": 2}, "top_logprobs", "top_logprobs needs logprobs set to true"),
    ({"messages": QUESTION, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "top_logprobs must be an integer from 0 to 20"),
    ({"messages": QUESTION, "max_completion_tokens": 0}, "max_completion_tokens", "max_completion_tokens must be an integer from 1 to 128"),
    ({"messages": QUESTION, "echo": True}, "echo", "Unrecognized request argument supplied: echo"),
    ({"messages": QUESTION, "frequency_penalty": 1}, "frequency_penalty", "frequency_penalty is not supported"),
    ({"messages": LONG, "max_tokens": 20}, "messages", "maximum context length is 128 tokens, however you requested 146 tokens (126 in "
                                                       "the messages; 20 for the completion), 18 more than it holds"),
    ({"messages": LONG * 2}, "messages", "however you requested 251 tokens (250 in the messages; 1 for the completion), 123 more than it holds"),
]  # fmt: skip


@pytest.mark.parametrize("body, param, message", BAD_CHATS, ids=[f"{b[1]}{i}" for i, b in enumerate(BAD_CHATS)])
def test_a_bad_chat_request_gets_a_400_naming_the_field(chat_server, body, param, message):
    response = post(chat_server, {"model": "tiny", **body}, "/v1/chat/completions")
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == param and message in error["message"], error
    assert error["type"] == "invalid_request_error"


def test_a_conversation_past_the_context_and_a_template_that_fails_through_the_openai_client(chat_client, chatml_server):
    with pytest.raises(openai.BadRequestError, match=r"maximum context length is 128 tokens.*18 more than it holds") as caught:
        chat_client.chat.completions.create(model="tiny", messages=LONG, max_tokens=20)
    assert caught.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError, match=r"failed to render \(line 2\): the assistant cannot speak first") as caught:
        chatml_server.client().chat.completions.create(model="tiny", messages=[{"role": "assistant", "content": "Hi"}])
    assert caught.value.body["param"] == "messages"
    assert chat_client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=2).usage.completion_tokens == 2


def test_a_model_whose_own_template_does_not_compile_serves_completions_and_refuses_chats(models):
    tokenizer = ENC.with_chat_template("{% for message in messages %}")
    running = Running(lambda: (models[1], tokenizer))
    try:
        client = running.client()
        with pytest.raises(openai.BadRequestError, match="the chat template of tiny is not a valid template: .* \\(line 1\\)"):
            client.chat.completions.create(model="tiny", messages=QUESTION)
        assert client.completions.create(model="tiny", prompt="Hi", max_tokens=2).usage.completion_tokens == 2
    finally:
        running.stop()


def test_a_template_given_that_does_not_compile_fails_at_once():
    from gpt2.errors import ChatTemplateError

    with pytest.raises(ChatTemplateError, match=r"the chat template is not a valid template: .* \(line 1\)") as caught:
        create_app(lambda: (None, None), "tiny", chat_template="{% if %}")
    assert caught.value.param == "chat_template"


def test_gpt2_serve_chat_template_overrides_and_its_bad_files_are_one_line(models, chatml_server, capsys, tmp_path):
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML, encoding="utf-8")
    process, url = gpt2_serve("--model", models[2], "--chat-template", str(template))
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        served = client.chat.completions.create(model=models[2], messages=QUESTION, temperature=0, max_tokens=10).choices[0]
        expected = chatml_server.client().chat.completions.create(model="tiny", messages=QUESTION, temperature=0, max_tokens=10)
        assert served.message.content == expected.choices[0].message.content
    finally:
        process.kill()
    (tmp_path / "bad.jinja").write_text("Hello\n{% for m in messages %}{{ m.content }}\n", encoding="utf-8")
    for path, message in [
        (tmp_path / "nowhere.jinja", f"cannot read the chat template {tmp_path / 'nowhere.jinja'}: no such file (--chat-template)"),
        (tmp_path / "bad.jinja", f"{tmp_path / 'bad.jinja'} is not a valid template: Unexpected end of template. Jinja was looking "
                                 f"for the following tags: 'endfor' or 'else'. The innermost block that needs to be closed is "
                                 f"'for'. (line 2) (--chat-template)"),
    ]:  # fmt: skip  (before the model loads: a model that is not there is not found)
        assert main(["serve", "--model", str(tmp_path / "no-model"), "--chat-template", str(path), "--port", str(free_port())]) == 2
        assert capsys.readouterr().err == f"gpt2: error: {message}\n"
