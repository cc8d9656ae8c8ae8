"""The server's routes (gpt2.serve.app): the playground, /v1/models, /tokenize, /detokenize,
/tokenizer_info and /metrics, and the model's id."""

from __future__ import annotations

import httpx
import pytest
from helpers import REPO, Running, serving
from serve_fixtures import ENC, N_CTX, complete, post


def test_a_directory_given_with_a_trailing_slash_is_served_without_it(char_server):
    client = char_server.client()
    assert [m.id for m in client.models.list().data] == ["out-char"] and client.models.retrieve(
        "out-char"
    ).id == "out-char"
    assert client.completions.create(model="out-char", prompt="A", max_tokens=2).model == "out-char"


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
        assert (
            httpx.get(running.url + "/").status_code == 404
            and httpx.get(running.url + "/ui/playground.js").status_code == 404
        )
        assert post(running, {"prompt": "hi"}, "/v1/inspect").status_code == 200  # the API stays
    finally:
        running.stop()


def test_models_tokenize_detokenize_and_metrics(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    text = "Hello world, 🤗 and 中文<|endoftext|>"
    tokens = httpx.post(server.url + "/tokenize", json={"content": text}).json()["tokens"]
    assert tokens == ENC.encode(text, allowed_special="all") and tokens[-1] == 50256  # the special token, as vLLM's
    assert (
        httpx.post(server.url + "/tokenize", json={"prompt": text, "add_special_tokens": False}).json()["tokens"]
        == tokens
    )
    assert httpx.post(server.url + "/detokenize", json={"tokens": tokens}).json() == {"content": text, "prompt": text}
    info = httpx.get(server.url + "/tokenizer_info").json()  # what lm-evaluation-harness's remote tokenizer reads
    assert info["eos_token"] == "<|endoftext|>" and info["model_max_length"] == N_CTX
    bad = httpx.post(server.url + "/detokenize", json={"tokens": [1, 99999]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    complete(client, prompt="Counting", max_tokens=4)
    metrics = httpx.get(server.url + "/metrics").text
    for name in (
        "gpt2_requests_total{",
        "gpt2_prompt_tokens_total",
        "gpt2_generated_tokens_total",
        "gpt2_queue_length",
        "gpt2_batch_size",
        "gpt2_time_to_first_token_seconds_bucket",
    ):
        assert name in metrics
    assert 'gpt2_requests_total{endpoint="/v1/completions",status="200"}' in metrics
    post(server, {"prompt": "hi"}, "/v1/inspect")
    assert 'gpt2_requests_total{endpoint="/v1/inspect",status="200"}' in httpx.get(server.url + "/metrics").text
    generated = next(line for line in metrics.splitlines() if line.startswith("gpt2_generated_tokens_total"))
    assert float(generated.split()[1]) >= 4


INDUCTION_2L = REPO / "tests" / "fixtures" / "induction_2l"  # trained here: 64 ids, no tokenizer


@pytest.fixture(scope="module")
def ids_server():
    """induction_2l served on token ids (its tokenizer None)."""
    from gpt2.model.model import GPT2

    yield from serving(GPT2.from_pretrained(INDUCTION_2L, device="cpu"), None, "induction_2l")


def test_a_model_with_no_tokenizer_refuses_the_routes_of_text_with_a_400_and_its_playground_says_so(ids_server):
    """Chat, /tokenize, /detokenize and /tokenizer_info are text: each a 400 saying the model has no tokenizer;
    the page loads, and asks /tokenizer_info, whose refusal it shows."""
    conversation = {"messages": [{"role": "user", "content": "Hi"}]}
    refusals = {
        "/v1/chat/completions": post(ids_server, conversation, "/v1/chat/completions"),
        "/tokenize": post(ids_server, {"content": "Hi"}, "/tokenize"),
        "/detokenize": post(ids_server, {"tokens": [3, 14]}, "/detokenize"),
        "/tokenizer_info": httpx.get(ids_server.url + "/tokenizer_info"),
    }
    for route, answer in refusals.items():
        error = answer.json()["error"]
        assert answer.status_code == 400 and error["code"] == "tokenizer_required", route
        assert error["message"].startswith("this model comes with no tokenizer, and "), route
    chat = refusals["/v1/chat/completions"].json()["error"]
    assert chat["param"] == "messages" and "/v1/completions continues a prompt of token ids" in chat["message"]
    page = httpx.get(ids_server.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'send("/tokenizer_info")' in httpx.get(ids_server.url + "/ui/playground.js").text
    assert [m.id for m in ids_server.client().models.list().data] == ["induction_2l"]
