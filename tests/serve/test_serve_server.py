"""The state behind the server's routes (gpt2.serve.server): the API key, 503 while the model loads,
the body's size and JSON, and a batch that cannot fit."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest
from helpers import Running
from serve_fixtures import ENC, post

from gpt2.serve import Limits, create_app


def test_invalid_json_an_oversized_body_and_unknown_routes(server):
    response = post(server, "{not json")
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]
    response = post(server, {"prompt": "x" * (1 << 20)})
    assert response.status_code == 413 and "over the limit of 1048576 bytes" in response.json()["error"]["message"]
    response = post(server, ["a", "list"])
    assert response.status_code == 400 and "must be a JSON object" in response.json()["error"]["message"]
    response = httpx.get(server.url + "/v1/chat/completions")
    assert response.status_code in (404, 405) and "error" in response.json()


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
        assert (
            running.client(api_key="s3cret").completions.create(model="tiny", prompt="hi", max_tokens=2).choices[0].text
            is not None
        )
        assert httpx.get(running.url + "/health").status_code == 200
    finally:
        running.stop()


def test_health_answers_503_until_the_model_is_loaded(models):
    loaded = threading.Event()

    def load():
        loaded.wait(120)  # a bound for a hang: the test sets it once it has seen the 503s
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


def test_an_app_whose_batch_cannot_fit_fails_to_load_and_says_why(models, monkeypatch):
    from gpt2 import MemoryLimitError, devices

    monkeypatch.setattr(devices, "available_memory", lambda device: 1_000_000)
    server = create_app(
        lambda: (models[1], ENC), "tiny", Limits(max_batch_size=4), load_in_background=False
    ).state.server
    with pytest.raises(
        MemoryLimitError, match=r"a KV cache of 4 rows of 128 positions needs about .*: a smaller max_batch_size$"
    ) as e:
        server.load_model()
    assert e.value.param == "max_batch_size"
