"""/v1/chat/completions (gpt2.serve.chat), through OpenAI's own client: replies equal transformers'
generation on the chat template's ids, streamed in OpenAI's chunks, with templates given or the model's own."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
import torch
from helpers import Running, make_hf_model, serving, transformers_sampled
from serve_fixtures import ENC, HANG, N_CTX, free_port, gpt2_serve, ours, post

from gpt2 import Tokenizer
from gpt2.cli import main
from gpt2.model.model import GPT2
from gpt2.serve import create_app


def test_a_chat_request_to_a_model_without_a_template_is_a_400_saying_how_to_add_one(client):
    with pytest.raises(openai.BadRequestError, match="the model tiny has no chat template") as caught:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}])
    error = caught.value.body
    assert caught.value.status_code == 400 and error["type"] == "invalid_request_error" and error["param"] == "messages"
    # the server's flag, for whoever started it (no command line stands between the server and its client to name it)
    assert "start the server with gpt2 serve --chat-template FILE (a Jinja2 file" in error["message"]
    assert "/v1/completions continues a text" in error["message"]


EOT = 50256
ENDS_AT = 40  # the chat model's replies end with <|endoftext|> once the text reaches this position
QUESTION = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "What is the capital of France?"},
]
# A ChatML-like template that refuses a conversation opened by the assistant (raise_exception, line 2)
CHATML = (
    "{% for message in messages %}\n"
    "{% if loop.first and message['role'] == 'assistant' %}"
    "{{ raise_exception('the assistant cannot speak first') }}{% endif %}\n"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + eos_token + '\\n' }}\n"
    "{% endfor %}\n"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def chat_models(tmp_path_factory):
    """A tiny model saved with gpt2's default chat template, whose replies end: from position
    ENDS_AT on, a large vector in the position embeddings points at <|endoftext|>'s embedding, so
    that greedy decoding writes it there (and ordinary text before). With transformers' tokenizer
    of the same directory, which reads the template from tokenizer_config.json."""
    from transformers import AutoTokenizer

    from gpt2.tokenizer.chat import DEFAULT_TEMPLATE

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
    yield from serving(chat_models[1], chat_models[1].tokenizer)


@pytest.fixture(scope="module")
def chat_client(chat_server):
    return chat_server.client()


def transformers_reply(chat_models, messages, max_new_tokens=60, **template):
    """transformers' greedy reply on its apply_chat_template ids: (its ids, its text, the prompt's ids)."""
    hf, _, hf_tokenizer, _ = chat_models
    ids = list(hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False, **template))
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=EOT, pad_token_id=EOT
        )
    new = out[0, len(ids) :].tolist()
    return new, hf_tokenizer.decode(new, skip_special_tokens=True), ids


def test_a_greedy_reply_is_transformers_greedy_generation_on_the_templates_ids(chat_models, chat_server, chat_client):
    from openai.types.chat import ChatCompletion

    new, text, prompt = transformers_reply(chat_models, QUESTION)
    assert (
        new[-1] == EOT and EOT not in new[:-1] and text.startswith(" ")
    )  # the reply ends, and begins with the template's space
    response = chat_client.chat.completions.create(model="tiny", messages=QUESTION, temperature=0)
    choice = response.choices[0]
    # the content less the template's space after "Assistant:", which it writes back when the history returns
    assert choice.message.content == text[1:] and choice.message.role == "assistant" and choice.finish_reason == "stop"
    assert response.object == "chat.completion" and response.id.startswith("chatcmpl-") and response.model == "tiny"
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (len(prompt), len(new))
    assert choice.logprobs is None and choice.index == 0
    raw = post(chat_server, {"messages": QUESTION, "temperature": 0}, "/v1/chat/completions").json()
    assert (
        ChatCompletion.model_validate(raw).choices[0].message.content == text[1:]
    )  # every field as the client's types have it


def test_a_template_in_tokenizer_config_json_without_tokenizer_files_is_the_models_own(chat_models, tmp_path):
    """GPT-2's tokenizer is assumed for a model of its vocabulary saved without one; the directory's
    template goes with it, as transformers reads that directory once GPT-2's files are added
    (chat_models' own directory, whose tokenizer transformers_reply uses)."""
    import shutil

    from gpt2.tokenizer.chat import DEFAULT_TEMPLATE

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
        with httpx.stream("POST", chat_server.url + "/v1/chat/completions", json=body, timeout=HANG) as response:
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
    response = chat_client.chat.completions.create(
        model="tiny", messages=QUESTION, n=3, seed=8, max_completion_tokens=12, top_p=0.9
    )
    assert [c.index for c in response.choices] == [0, 1, 2]
    for c in response.choices:  # reply k: transformers' sampling from seed 8 + k
        theirs = hf_tokenizer.decode(
            transformers_sampled(hf, ids, 12, 8 + c.index, top_p=0.9), skip_special_tokens=True
        )
        assert c.message.content == theirs.removeprefix(" ")
    assert len({c.message.content for c in response.choices}) == 3 and response.usage.completion_tokens == 36


def test_stop_strings_and_max_completion_tokens_end_a_reply(chat_models, chat_client):
    _, text, _ = transformers_reply(chat_models, QUESTION)
    stop = text[14:17]
    assert text.index(stop) > 5
    response = chat_client.chat.completions.create(
        model="tiny", messages=QUESTION, temperature=0, stop=[stop, "never appears"]
    )
    assert (
        response.choices[0].message.content == text[1 : text.index(stop)]
        and response.choices[0].finish_reason == "stop"
    )
    chunks = list(
        chat_client.chat.completions.create(model="tiny", messages=QUESTION, temperature=0, stop=stop, stream=True)
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == response.choices[0].message.content
    response = chat_client.chat.completions.create(
        model="tiny", messages=QUESTION, temperature=0, max_completion_tokens=3
    )
    assert response.choices[0].finish_reason == "length" and response.usage.completion_tokens == 3
    assert text[1:].startswith(response.choices[0].message.content) and response.choices[0].message.content


def test_logprobs_and_top_logprobs_equal_transformers_log_softmax(chat_models, chat_client):
    new, _, prompt = transformers_reply(chat_models, QUESTION)
    with torch.no_grad():
        expected = torch.log_softmax(chat_models[0](torch.tensor([prompt + new])).logits[0].double(), dim=-1)
    response = chat_client.chat.completions.create(
        model="tiny", messages=QUESTION, temperature=0, logprobs=True, top_logprobs=3
    )
    content = response.choices[0].logprobs.content
    assert (
        len(content) == len(new) == response.usage.completion_tokens
    )  # every token of the reply, its <|endoftext|> too
    assert new[-1] == EOT and content[-1].token == "<|endoftext|>"  # by its name, as the tokens' alternatives have it
    for k, (entry, token) in enumerate(zip(content, new, strict=True)):
        at = expected[len(prompt) + k - 1]
        assert entry.token == ENC.decode([token]) and entry.bytes == list(ENC.token_bytes(token))
        assert abs(entry.logprob - float(at[token])) < 1e-4
        top = at.topk(3)
        assert [t.token for t in entry.top_logprobs] == [ENC.decode([t]) for t in top.indices.tolist()]
        assert max(abs(t.logprob - v) for t, v in zip(entry.top_logprobs, top.values.tolist())) < 1e-4
    streamed = chat_client.chat.completions.create(
        model="tiny", messages=QUESTION, temperature=0, logprobs=True, stream=True
    )
    entries = [e for c in streamed for e in (c.choices[0].logprobs.content if c.choices[0].logprobs else [])]
    assert [(e.token, e.logprob) for e in entries] == [(e.token, e.logprob) for e in content]
    assert all(e.top_logprobs == [] for e in entries)  # logprobs without top_logprobs: the chosen token's alone


def test_response_format_json_schema_gives_a_reply_of_the_schema_through_the_openai_client(chat_client):
    """OpenAI's structured outputs on the chat route: the reply is JSON of the schema, ended "stop",
    whole and streamed alike; the reply's ending position (<|endoftext|> at ENDS_AT) does not cut it."""
    schema = {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Lyon", "Nice"]}, "sure": {"type": "boolean"}},
        "required": ["city", "sure"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    response = chat_client.chat.completions.create(
        model="tiny", messages=QUESTION, response_format=fmt, temperature=1.0, seed=3, n=4
    )
    for choice in response.choices:
        answer = json.loads(choice.message.content)
        assert (
            answer["city"] in ("Paris", "Lyon", "Nice")
            and isinstance(answer["sure"], bool)
            and choice.finish_reason == "stop"
        )
    chunks = list(
        chat_client.chat.completions.create(
            model="tiny", messages=QUESTION, response_format=fmt, temperature=1.0, seed=3, stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == response.choices[0].message.content


def test_content_as_text_parts_reads_as_the_joined_text(chat_client):
    parts = [
        QUESTION[0],
        {
            "role": "user",
            "content": [{"type": "text", "text": "What is the capital"}, {"type": "text", "text": " of France?"}],
        },
    ]

    def answer(messages):
        return chat_client.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=8)

    assert answer(parts).choices[0].message.content == answer(QUESTION).choices[0].message.content


@pytest.fixture(scope="module")
def chatml_server(models):
    """The completions model, without a template of its own, served with one given (CHATML)."""
    running = Running(lambda: (models[1], ENC), chat_template=CHATML)
    yield running
    running.stop()


def test_a_template_given_to_the_server_renders_the_conversation(models, chat_models, chatml_server):
    hf_tokenizer = chat_models[2]
    prompt = hf_tokenizer.apply_chat_template(
        QUESTION, chat_template=CHATML, add_generation_prompt=True, tokenize=False
    )
    response = chatml_server.client().chat.completions.create(
        model="tiny", messages=QUESTION, temperature=0, max_tokens=10
    )
    assert response.usage.prompt_tokens == len(
        hf_tokenizer.apply_chat_template(QUESTION, chat_template=CHATML, add_generation_prompt=True, return_dict=False)
    )
    assert (
        response.choices[0].message.content == ours(models, prompt, max_new_tokens=10, temperature=0)[0]
    )  # no prefix to take off


def test_a_template_given_overrides_the_models_own(chat_models):
    model = chat_models[1]
    running = Running(lambda: (model, model.tokenizer), chat_template=CHATML)
    try:
        response = running.client().chat.completions.create(model="tiny", messages=QUESTION, max_tokens=1)
        assert response.usage.prompt_tokens == len(
            chat_models[2].apply_chat_template(
                QUESTION, chat_template=CHATML, add_generation_prompt=True, return_dict=False
            )
        )
    finally:
        running.stop()


LONG = [
    {"role": "user", "content": "word " * 120}
]  # 126 tokens rendered with the generation prompt (transformers' count)


BAD_CHATS = [
    (
        {"messages": [{"role": "tool", "content": "x"}]},
        "messages",
        "messages[0].role must be one of system, user, assistant, got 'tool'",
    ),
    ({"messages": [{"role": "user", "content": 3}]}, "messages", "messages[0].content must be a string, got 3"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        "messages",
        "messages[0].content: this model reads text only",
    ),
    ({"messages": []}, "messages", "messages must be a non-empty list of messages"),
    ({}, "messages", "messages must be a non-empty list"),
    ({"messages": QUESTION, "logprobs": "yes"}, "logprobs", "logprobs must be true or false"),
    ({"messages": QUESTION, "top_logprobs": 2}, "top_logprobs", "top_logprobs needs logprobs set to true"),
    (
        {"messages": QUESTION, "logprobs": True, "top_logprobs": 21},
        "top_logprobs",
        "top_logprobs must be an integer from 0 to 20",
    ),
    (
        {"messages": QUESTION, "max_completion_tokens": 0},
        "max_completion_tokens",
        "max_completion_tokens must be an integer from 1 to 128",
    ),
    ({"messages": QUESTION, "echo": True}, "echo", "Unrecognized request argument supplied: echo"),
    (
        {"messages": QUESTION, "frequency_penalty": 3},
        "frequency_penalty",
        "frequency_penalty must be a number from -2 to 2, got 3",
    ),
    (
        {
            "messages": QUESTION,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"schema": {"type": "object", "minProperties": "x"}},
            },
        },
        "response_format",
        "response_format:",
    ),
    (
        {"messages": LONG, "max_tokens": 20},
        "messages",
        "maximum context length is 128 tokens, however you requested 146 tokens (126 in "
        "the messages; 20 for the completion), 18 more than it holds",
    ),
    (
        {"messages": LONG * 2},
        "messages",
        "however you requested 251 tokens (250 in the messages; 1 for the completion), 123 more than it holds",
    ),
    (
        {"messages": LONG, "max_completion_tokens": 500},
        "messages",
        "(126 in the messages; 500 for the completion), 498 more than it holds: "
        "the messages leave room for 2 tokens of completion",
    ),  # not "from 1 to 128"
]


@pytest.mark.parametrize("body, param, message", BAD_CHATS, ids=[f"{b[1]}{i}" for i, b in enumerate(BAD_CHATS)])
def test_a_bad_chat_request_gets_a_400_naming_the_field(chat_server, body, param, message):
    response = post(chat_server, {"model": "tiny", **body}, "/v1/chat/completions")
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == param and message in error["message"], error
    assert error["type"] == "invalid_request_error"


def test_a_conversation_past_the_context_and_a_template_that_fails_through_the_openai_client(
    chat_client, chatml_server
):
    with pytest.raises(
        openai.BadRequestError, match=r"maximum context length is 128 tokens.*18 more than it holds"
    ) as caught:
        chat_client.chat.completions.create(model="tiny", messages=LONG, max_tokens=20)
    assert caught.value.body["code"] == "context_length_exceeded"
    with pytest.raises(
        openai.BadRequestError, match=r"failed to render \(line 2\): the assistant cannot speak first"
    ) as caught:
        chatml_server.client().chat.completions.create(model="tiny", messages=[{"role": "assistant", "content": "Hi"}])
    assert caught.value.body["param"] == "messages"
    assert (
        chat_client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=2).usage.completion_tokens == 2
    )


def test_a_model_whose_own_template_does_not_compile_serves_completions_and_refuses_chats(models):
    tokenizer = ENC.with_chat_template("{% for message in messages %}")
    running = Running(lambda: (models[1], tokenizer))
    try:
        client = running.client()
        with pytest.raises(
            openai.BadRequestError, match="the chat template of tiny is not a valid template: .* \\(line 1\\)"
        ):
            client.chat.completions.create(model="tiny", messages=QUESTION)
        assert client.completions.create(model="tiny", prompt="Hi", max_tokens=2).usage.completion_tokens == 2
    finally:
        running.stop()


def test_a_template_given_that_does_not_compile_fails_at_once():
    from gpt2.errors import ChatTemplateError

    with pytest.raises(ChatTemplateError, match=r"the chat template is not a valid template: .* \(line 1\)") as caught:
        create_app(lambda: (None, None), "tiny", chat_template="{% if %}")
    assert caught.value.param == "chat_template"


def test_gpt2_serve_chat_template_overrides_and_its_bad_files_are_one_line(
    models, chatml_server, capsys, tmp_path, forks
):
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML, encoding="utf-8")
    process, url = gpt2_serve(forks, "--model", models[2], "--chat-template", str(template))
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        served = client.chat.completions.create(
            model=models[2], messages=QUESTION, temperature=0, max_tokens=10
        ).choices[0]
        expected = chatml_server.client().chat.completions.create(
            model="tiny", messages=QUESTION, temperature=0, max_tokens=10
        )
        assert served.message.content == expected.choices[0].message.content
    finally:
        process.kill()
    (tmp_path / "bad.jinja").write_text("Hello\n{% for m in messages %}{{ m.content }}\n", encoding="utf-8")
    for path, message in [
        (
            tmp_path / "nowhere.jinja",
            f"cannot read the chat template {tmp_path / 'nowhere.jinja'}: no such file (--chat-template)",
        ),
        (
            tmp_path / "bad.jinja",
            f"{tmp_path / 'bad.jinja'} is not a valid template: Unexpected end of template. Jinja was looking "
            f"for the following tags: 'endfor' or 'else'. The innermost block that needs to be closed is "
            f"'for'. (line 2) (--chat-template)",
        ),
    ]:  # before the model loads: a model that is not there is not found
        assert (
            main(
                [
                    "serve",
                    "--model",
                    str(tmp_path / "no-model"),
                    "--chat-template",
                    str(path),
                    "--port",
                    str(free_port()),
                ]
            )
            == 2
        )
        assert capsys.readouterr().err == f"gpt2: error: {message}\n"
