"""What a client may ask of `gpt2 serve` (gpt2.serve.protocol): prompts as text or token ids,
<|endoftext|> read as OpenAI reads it, and every bad request a 400 naming its field in OpenAI's words."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from helpers import Running
from serve_fixtures import ENC, SPECIAL_PROMPT, complete, gpt2_generate, ours, post

from gpt2.errors import GPT2Error
from gpt2.generation.processors import Penalties
from gpt2.generation.sampling import Sampling
from gpt2.serve import Limits
from gpt2.serve.protocol import CompletionBody


def test_prompts_as_token_ids(models, client):
    ids = [ENC.encode("Hello world"), ENC.encode("GPT-2 is")]
    response = complete(client, prompt=ids, max_tokens=8, temperature=0)
    assert [c.text for c in response.choices] == [
        ours(models, ENC.decode(p), max_new_tokens=8, temperature=0)[0] for p in ids
    ]
    assert complete(client, prompt=ids[0], max_tokens=8, temperature=0).choices[0].text == response.choices[0].text


def test_end_of_text_in_a_prompt_is_the_special_token_for_gpt2_generate_and_the_server(models, client, capsys):
    """One rule, OpenAI's: <|endoftext|> written in a prompt is token 50256, in the CLI as in the server."""
    served = complete(client, prompt=SPECIAL_PROMPT, max_tokens=12, temperature=0).choices[0].text
    assert served == gpt2_generate(capsys, models, SPECIAL_PROMPT)
    special = ENC.encode(SPECIAL_PROMPT, allowed_special="all")
    assert 50256 in special and served == complete(client, prompt=special, max_tokens=12, temperature=0).choices[0].text
    as_text = complete(client, prompt=ENC.encode_ordinary(SPECIAL_PROMPT), max_tokens=12, temperature=0).choices[0].text
    assert as_text != served  # the two readings continue differently: the test tells them apart


def test_special_as_text_reads_end_of_text_as_characters_in_both(models, capsys):
    running = Running(lambda: (models[1], ENC), allowed_special=frozenset())
    try:
        client = running.client()
        served = complete(client, prompt=SPECIAL_PROMPT, max_tokens=12, temperature=0).choices[0].text
        assert served == gpt2_generate(capsys, models, SPECIAL_PROMPT, "--special-as-text")
        assert (
            served
            == complete(client, prompt=ENC.encode_ordinary(SPECIAL_PROMPT), max_tokens=12, temperature=0)
            .choices[0]
            .text
        )
        tokens = httpx.post(running.url + "/tokenize", json={"content": SPECIAL_PROMPT}).json()["tokens"]
        assert (
            tokens == ENC.encode_ordinary(SPECIAL_PROMPT) and 50256 not in tokens
        )  # /tokenize reads as a completion does
    finally:
        running.stop()


BAD_REQUESTS = [
    ({"prompt": "hi", "max_tokens": -1}, "max_tokens", "max_tokens must be an integer from 0 to 128, got -1"),
    ({"prompt": "hi", "temperature": -0.5}, "temperature", "temperature must be a finite number >= 0"),
    ({"prompt": "hi", "top_p": 0}, "top_p", "top_p must be in (0, 1], got 0"),
    ({"prompt": "hi", "top_p": 1.5}, "top_p", "top_p must be in (0, 1], got 1.5"),
    ({"prompt": "hi", "n": 0}, "n", "n must be an integer from 1 to 16, got 0"),
    ({"prompt": "hi", "n": 17}, "n", "n must be an integer from 1 to 16, got 17"),
    ({"prompt": "hi", "logprobs": 6}, "logprobs", "logprobs must be an integer from 0 to 5, got 6"),
    (
        {"prompt": "hi", "top_k": 0},
        "top_k",
        "top_k must be an integer from 1 to 50257, the model's vocabulary size, got 0",
    ),
    (
        {"prompt": "hi", "top_k": 50258},
        "top_k",
        "top_k must be an integer from 1 to 50257, the model's vocabulary size, got 50258",
    ),
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
    (
        {"prompt": [15496] * 100, "max_tokens": 29},
        "prompt",
        "maximum context length is 128 tokens, however you requested 129 "
        "tokens (100 in your prompt; 29 for the completion), 1 more than it holds: "
        "your prompt leaves room for 28 tokens of completion.",
    ),
    (
        {"prompt": [15496] * 100, "max_tokens": 200},
        "prompt",
        "(100 in your prompt; 200 for the completion), 172 more than it holds: your prompt leaves room for 28 tokens",
    ),  # the room, not the context's 128
    ({"prompt": [15496] * 128, "max_tokens": 1}, "prompt", "1 more than it holds: your prompt leaves no room."),
    ({"prompt": "hi", "frobnicate": 1}, "frobnicate", "Unrecognized request argument supplied: frobnicate"),
    (
        {"prompt": "hi", "presence_penalty": 2.5},
        "presence_penalty",
        "presence_penalty must be a number from -2 to 2, got 2.5",
    ),
    (
        {"prompt": "hi", "frequency_penalty": -3},
        "frequency_penalty",
        "frequency_penalty must be a number from -2 to 2, got -3",
    ),
    ({"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty", "repetition_penalty must be a number above 0"),
    (
        {"prompt": "hi", "logit_bias": {"50256": 101}},
        "logit_bias",
        "logit_bias values must be numbers from -100 to 100, got 101",
    ),
    (
        {"prompt": "hi", "logit_bias": {"50257": 5}},
        "logit_bias",
        "token id 50257 in logit_bias is out of range: ids are 0..50256",
    ),
    ({"prompt": "hi", "logit_bias": {"x": 5}}, "logit_bias", "logit_bias keys must be token ids"),
    (
        {
            "prompt": "hi",
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
        },
        "response_format",
        "response_format: Invalid type: nonsense",
    ),
    (
        {"prompt": "hi", "response_format": {"type": "xml"}},
        "response_format",
        'response_format must be {"type": "text"}',
    ),
    (
        {"prompt": "hi", "response_format": {"type": "json_schema"}},
        "response_format",
        "response_format of type json_schema needs",
    ),
    (
        {"prompt": "hi", "structured_outputs": {"regex": "a(("}},
        "structured_outputs",
        "structured_outputs: at 1(8): invalid regex",
    ),
    ({"prompt": "hi", "structured_outputs": {"choice": []}}, "structured_outputs", "choice needs at least one string"),
    (
        {"prompt": "hi", "structured_outputs": {"regex": "a", "choice": ["b"]}},
        "structured_outputs",
        "one of json, regex, choice",
    ),
    (
        {"prompt": "hi", "structured_outputs": {"yaml": "a"}},
        "structured_outputs",
        "structured_outputs must be an object of one of",
    ),
    ({"prompt": "hi", "guided_grammar": "root ::= foo"}, "guided_grammar", "Rule 'foo' not found"),
    (
        {"prompt": "hi", "guided_choice": ["a"], "response_format": {"type": "json_object"}},
        "guided_choice",
        "one structured output at a time: response_format and guided_choice were both given",
    ),
]


@pytest.mark.parametrize("body, param, message", BAD_REQUESTS, ids=[b[1] + str(i) for i, b in enumerate(BAD_REQUESTS)])
def test_a_bad_request_gets_a_400_naming_the_field_and_the_server_keeps_serving(server, body, param, message):
    response = post(server, {"model": "tiny", **body})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == param and message in error["message"]
    assert error["type"] == "invalid_request_error" and "code" in error
    assert httpx.get(server.url + "/health").status_code == 200


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", -0.5),
        ("temperature", "hot"),
        ("temperature", float("inf")),  # JSON's Infinity, which Python's json reads
        ("top_p", 1.5),
        ("presence_penalty", 2.5),
        ("frequency_penalty", -3),
        ("repetition_penalty", 0),
    ],
)
def test_sampling_values_are_checked_once_by_what_uses_them(server, field, value):
    """The server's refusal of a sampling value is Sampling's or Penalties' own, word for word (of the
    number as the body's float holds it): the request's model keeps no second copy of their bounds."""
    if not isinstance(value, str):  # a number: the body's model takes it, leaving its check to the owner
        assert getattr(CompletionBody.model_validate({"prompt": "hi", field: value}), field) == value
    owner = Sampling if field in ("temperature", "top_p") else Penalties
    with pytest.raises(GPT2Error) as refused:
        owner(**{field: float(value) if isinstance(value, int) else value})
    body = json.dumps({"prompt": "hi", field: value})  # allow_nan: inf as Infinity
    response = httpx.post(
        server.url + "/v1/completions", content=body, headers={"content-type": "application/json"}, timeout=60
    )
    error = response.json()["error"]
    assert (response.status_code, error["param"], error["message"]) == (400, field, str(refused.value))


def test_a_request_past_the_context_is_refused_in_openais_words_and_code(server):
    """The library's context check (gpt2.generation.decoding.Request), answered as OpenAI's API answers it."""
    error = post(server, {"prompt": ["hi", [15496] * 120], "max_tokens": 9}).json()["error"]
    assert (error["param"], error["code"]) == ("prompt", "context_length_exceeded")
    assert error["message"].startswith(
        "This model's maximum context length is 128 tokens, however you requested 129 tokens"
    )


def test_the_openai_client_raises_its_own_errors(client):
    with pytest.raises(openai.BadRequestError, match="max_tokens must be an integer"):
        complete(client, prompt="hi", max_tokens=-3)
    with pytest.raises(openai.NotFoundError, match="The model `gpt-4` does not exist"):
        client.completions.create(model="gpt-4", prompt="hi")


def test_a_character_a_character_model_lacks_is_a_400_naming_it(char_server):
    client = char_server.client()
    with pytest.raises(
        openai.BadRequestError, match="character '日' at position 4 is not in this 65-character vocab"
    ) as caught:
        client.completions.create(model="out-char", prompt="DEF 日本", max_tokens=3)
    assert caught.value.body["param"] == "prompt"
    response = post(char_server, {"prompt": ["DEF", "A é"], "max_tokens": 3})
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("prompt 1: character 'é' at position 2 ")
    for field in ("content", "prompt"):
        response = httpx.post(char_server.url + "/tokenize", json={field: "DEF 日本"})
        error = response.json()["error"]
        assert (
            response.status_code == 400
            and error["param"] == field
            and "character '日' at position 4" in error["message"]
        )
    assert client.completions.create(model="out-char", prompt="DEF ", max_tokens=3).usage.completion_tokens == 3


@pytest.mark.parametrize(
    "field, value", [("response_format", {"type": "json_object"}), ("structured_outputs", {"choice": ["{x}", "{y}"]})]
)
def test_a_constraint_a_character_model_cannot_write_is_a_400_not_a_503(char_server, field, value):
    """The vocabulary " " to "`" has no "{": a request that can never succeed is refused as made,
    400 with OpenAI's error body naming the field (a 503, which the openai client retries, was
    the loop's failure)."""
    with pytest.raises(openai.BadRequestError) as caught:
        char_server.client().completions.create(model="out-char", prompt="A:", max_tokens=5, extra_body={field: value})
    error = caught.value.body
    assert caught.value.status_code == 400 and error["param"] == field and error["type"] == "invalid_request_error"
    assert error["message"].startswith(f"{field}: its text must begin") and "has no '{'" in error["message"]


def test_a_step_budget_below_the_batch_is_refused_naming_both():
    with pytest.raises(GPT2Error, match=r"max_num_batched_tokens must be at least max_batch_size \(8\), .*; got 4"):
        Limits(max_num_batched_tokens=4).check()


def test_limits_are_checked_when_made():
    with pytest.raises(GPT2Error, match="max_n must be a positive integer, got 0"):
        Limits(max_n=0)


SAMPLED = {
    "model": {},
    "n": {"default": 1, "minimum": 1, "x-maximum": "max_n"},
    "stop": {"minLength": 1, "maxItems": 4},
    "temperature": {"default": 1, "minimum": 0},
    "top_p": {"default": 1, "exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"minimum": 1, "x-maximum": "n_vocab"},
    "seed": {"minimum": 0, "maximum": 2**64 - 1},
    "stream": {"default": False},
    "stream_options": {},
    "user": {},
    "presence_penalty": {"default": 0, "minimum": -2, "maximum": 2},
    "frequency_penalty": {"default": 0, "minimum": -2, "maximum": 2},
    "logit_bias": {},
    "repetition_penalty": {"default": 1, "exclusiveMinimum": 0},
    "response_format": {},
    "structured_outputs": {},
    "guided_json": {},
    "guided_regex": {},
    "guided_choice": {},
    "guided_grammar": {},
}
ACCEPTED = {  # each route's fields: default and bounds ("x-maximum": the server's number that bounds it)
    "/v1/completions": {
        **SAMPLED,
        "prompt": {"minItems": 1, "minimum": 0},
        "max_tokens": {"default": 16, "minimum": 0, "x-maximum": "n_ctx"},
        "logprobs": {"minimum": 0, "maximum": 5},
        "echo": {"default": False},
        "return_token_ids": {"default": False},
        "best_of": {"minimum": 1},
        "suffix": {"maxLength": 0},
    },
    "/v1/chat/completions": {
        **SAMPLED,
        "messages": {"minItems": 1},
        "max_completion_tokens": {"minimum": 1, "x-maximum": "n_ctx"},
        "max_tokens": {"minimum": 1, "x-maximum": "n_ctx"},
        "logprobs": {"default": False},
        "top_logprobs": {"minimum": 0, "maximum": 20},
    },
    "/v1/inspect": {
        "model": {},
        "prompt": {"minItems": 1, "minimum": 0},
        "top_k": {"default": 5, "minimum": 1, "maximum": 20},
    },
    "/tokenize": {"content": {}, "prompt": {}},
    "/detokenize": {"tokens": {"minimum": 0}},
}
REQUIRED = {
    "/v1/completions": ["prompt"],
    "/v1/chat/completions": ["messages"],
    "/v1/inspect": ["prompt"],
    "/detokenize": ["tokens"],
}
BOUNDS = (
    "default",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "maxProperties",
    "x-maximum",
)


def test_openapi_json_describes_every_field_each_route_accepts_with_its_bounds(server):
    spec = httpx.get(server.url + "/openapi.json").json()

    def resolve(schema):
        return spec["components"]["schemas"][schema["$ref"].split("/")[-1]] if "$ref" in schema else schema

    def bounds(schema: dict) -> dict:  # the field's, and those of the types it may be (anyOf, a list's items)
        found = {
            key: float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
            for key, value in schema.items()
            if key in BOUNDS
        }
        for part in [*schema.get("anyOf", []), *([schema["items"]] if "items" in schema else [])]:
            found.update(bounds(resolve(part)))
        return found

    for path, fields in ACCEPTED.items():
        body = resolve(spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"])
        assert set(body["properties"]) == set(fields), path
        expected = {
            name: {k: float(v) if isinstance(v, int) and not isinstance(v, bool) else v for k, v in field.items()}
            for name, field in fields.items()
        }
        assert {name: bounds(schema) for name, schema in body["properties"].items()} == expected, path
        assert body.get("required", []) == REQUIRED.get(path, [])
        assert body.get("additionalProperties", True) is (
            path not in ("/v1/completions", "/v1/chat/completions", "/v1/inspect")
        )
    docs = httpx.get(server.url + "/docs")
    assert docs.status_code == 200 and "/openapi.json" in docs.text  # Swagger UI's page, reading the same description
