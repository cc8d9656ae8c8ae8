"""`gpt2 serve`'s completions (gpt2.serve.completions), through OpenAI's own client: answers equal
transformers', the Python API's and gpt2 generate's, whole or streamed, with stop strings, \
log-probabilities and token ids."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import REPO, ConstraintWrittenOut, PenaltiesWrittenOut, serving, transformers_greedy, transformers_sampled
from llguidance import LLMatcher, grammar_from
from serve_fixtures import ENC, api_token, complete, ours, post
from transformers import LogitsProcessorList

from gpt2.cli import main


def test_greedy_text_equals_transformers_and_gpt2_generate(models, client, capsys, tiktoken_gpt2):
    response = complete(client, prompt="The meaning of life is", max_tokens=20, temperature=0)
    choice = response.choices[0]
    expected = tiktoken_gpt2.decode(transformers_greedy(models[0], tiktoken_gpt2.encode("The meaning of life is"), 20))
    assert choice.text == expected
    assert choice.finish_reason == "length" and choice.index == 0 and response.object == "text_completion"
    assert response.model == "tiny" and response.id.startswith("cmpl-")
    n_prompt = len(tiktoken_gpt2.encode("The meaning of life is"))
    assert (response.usage.prompt_tokens, response.usage.completion_tokens, response.usage.total_tokens) == (
        n_prompt,
        20,
        n_prompt + 20,
    )
    capsys.readouterr()
    assert (
        main(
            [
                "generate",
                "The meaning of life is",
                "--model",
                models[2],
                "--max-new-tokens",
                "20",
                "--temperature",
                "0",
                "--no-stream",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out == expected + "\n"


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
        assert c.text == ENC.decode(
            transformers_sampled(models[0], ENC.encode(prompt), 12, (2**64 - 2 + c.index) % 2**64, top_p=0.9)
        )
    assert len({c.text for c in response.choices}) == 6
    assert (
        response.choices[2].text
        == complete(client, prompt=prompts, n=3, max_tokens=12, seed=2**64 - 2, top_p=0.9).choices[2].text
    )


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


def test_a_choice_reads_each_token_as_it_was_when_made():
    """The loop runs ahead of the routes: a row may have ended by the time its route reads an
    earlier token, which must still count (once, a race cut answers short)."""
    from gpt2.generation.decoding import LENGTH, Row
    from gpt2.serve import ChoiceStream, CompletionRequest

    tokens = ENC.encode(" one two three")
    row = Row(ENC.encode("Count:"), len(tokens), logprobs=0)
    row.tokens, row.finish_reason = list(tokens), LENGTH  # the loop is done already
    row.token_logprobs, row.top_logprobs = [-1.0, -2.0, -3.0], [[], [], []]
    choice = ChoiceStream(0, row, ENC, CompletionRequest([row.prompt], [row], stop=[], logprobs=0))
    pieces = [choice.add(t, LENGTH if i == len(tokens) - 1 else None) for i, t in enumerate(tokens)]
    assert "".join(pieces) == " one two three" and choice.finish_reason == LENGTH and choice.tokens == 3
    assert choice.to_dict()["logprobs"]["token_logprobs"] == [-1.0, -2.0, -3.0]


def test_return_token_ids_gives_the_ids_generate_makes_whole_and_streamed(models, client):
    prompt = "Token ids, please:"
    expected = ours(models, prompt, max_new_tokens=12, temperature=0)[0]
    whole = complete(client, prompt=prompt, max_tokens=12, temperature=0, extra_body={"return_token_ids": True})
    choice = whole.choices[0].model_dump()
    assert choice["prompt_token_ids"] == ENC.encode(prompt)
    assert (
        ENC.decode(choice["token_ids"]) == choice["text"] == expected
        and len(choice["token_ids"]) == whole.usage.completion_tokens
    )
    chunks = [
        c.choices[0].model_dump()
        for c in complete(
            client,
            prompt=prompt,
            max_tokens=12,
            temperature=0,
            stream=True,
            logprobs=2,
            extra_body={"return_token_ids": True},
        )
        if c.choices
    ]
    assert chunks[0]["prompt_token_ids"] == ENC.encode(prompt) and all("prompt_token_ids" not in c for c in chunks[1:])
    assert [i for c in chunks for i in c["token_ids"]] == choice["token_ids"]
    for c in chunks:  # each chunk's ids are the tokens its log-probabilities list
        assert [api_token(i) for i in c["token_ids"]] == c["logprobs"]["tokens"]
    plain = complete(client, prompt=prompt, max_tokens=3).choices[0].model_dump()
    assert "token_ids" not in plain and "prompt_token_ids" not in plain  # only when asked for


PERSON = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "age"],
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,7}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
    },
}


CLOSING = {
    "1": 8.0,
    "92": 8.0,
    "1298": 8.0,
    "1600": 8.0,
    "20662": 8.0,
}  # '"', "}", '":', '",', '"}': a random model's strings end


# JSON as the API writes it: json.dumps' separators, no other whitespace (vLLM's disable_any_whitespace)
JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@pytest.fixture(scope="module")
def lltokenizer(tiktoken_gpt2):
    """llguidance's view of tiktoken's GPT-2 encoding, for constraints written out on transformers' generate."""
    from llguidance.tiktoken import lltokenizer_from_encoding

    return lltokenizer_from_encoding(tiktoken_gpt2)


def constrained(models, encoding, lltokenizer, grammar, prompt, max_tokens, seed, bias=None, **sampling) -> str:
    """transformers' text sampled from seed `seed` (helpers.transformers_sampled), each token held to
    llguidance's `grammar` (after `bias`, OpenAI's logit_bias, is added), decoded by tiktoken."""
    ids = encoding.encode(prompt)
    processors = [PenaltiesWrittenOut(len(ids), bias, 0.0, 0.0, 1.0)] if bias else []
    processors.append(ConstraintWrittenOut(lltokenizer, grammar, len(ids)))
    new = transformers_sampled(
        models[0], ids, max_tokens, seed, logits_processor=LogitsProcessorList(processors), **sampling
    )
    return encoding.decode([t for t in new if t != encoding.eot_token])


def test_structured_outputs_through_the_openai_client_equal_transformers_under_llguidance(
    models, client, tiktoken_gpt2, lltokenizer
):
    """OpenAI's response_format and vLLM's structured_outputs and guided_* fields (extra_body to the
    client): every choice holds to its constraint and is the text transformers samples from the
    same seed (choice i from seed + i) with llguidance's matcher of that constraint masking each
    step, over tiktoken's vocabulary."""
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    response = complete(client, prompt="A person:", max_tokens=40, n=3, seed=5, extra_body={"response_format": fmt})
    texts = [c.text for c in response.choices]
    person = LLMatcher.grammar_from_json_schema(PERSON, defaults=JSON)
    reference = (models, tiktoken_gpt2, lltokenizer)
    assert texts == [constrained(*reference, person, "A person:", 40, 5 + i) for i in range(3)]
    assert all(json.loads(t)["age"] <= 99 for t in texts) and {c.finish_reason for c in response.choices} == {"stop"}
    streamed = list(
        complete(client, prompt="A person:", max_tokens=40, seed=5, stream=True, extra_body={"response_format": fmt})
    )
    assert "".join(c.choices[0].text for c in streamed) == texts[0] and streamed[-1].choices[0].finish_reason == "stop"
    for extra, grammar in [
        (
            {"structured_outputs": {"choice": ["yes", "no", "maybe 🤔"]}},
            grammar_from("lark", 'start: "yes" | "no" | "maybe 🤔"'),
        ),
        ({"structured_outputs": {"regex": "[0-9]{2}:[0-9]{2}"}}, grammar_from("regex", "[0-9]{2}:[0-9]{2}")),
        ({"structured_outputs": {"json": PERSON}}, person),
        ({"guided_json": json.dumps(PERSON)}, person),
        ({"guided_choice": ["left", "right"]}, grammar_from("lark", 'start: "left" | "right"')),
        ({"guided_regex": "[a-c]{3}"}, grammar_from("regex", "[a-c]{3}")),
        ({"guided_grammar": 'root ::= "x" [0-9]'}, grammar_from("gbnf", 'root ::= "x" [0-9]')),
        (
            {"response_format": {"type": "json_object"}, "logit_bias": CLOSING},
            LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON),
        ),
    ]:
        got = complete(client, prompt="Q:", max_tokens=40, temperature=0.8, seed=1, extra_body=extra).choices[0]
        bias = {int(k): v for k, v in CLOSING.items()} if "logit_bias" in extra else None
        assert got.text == constrained(*reference, grammar, "Q:", 40, 1, bias, temperature=0.8), extra
        assert got.finish_reason == "stop", extra


def test_a_document_max_tokens_cuts_ends_length(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    choice = complete(client, prompt="A person:", max_tokens=4, seed=0, extra_body={"response_format": fmt}).choices[0]
    assert choice.finish_reason == "length" and choice.text.startswith('{"name": "')


def test_logit_bias_and_penalties_equal_transformers_with_the_same_rule(models, client, tiktoken_gpt2):
    """OpenAI's logit_bias, frequency and presence penalties and transformers' repetition_penalty
    (extra_body) give transformers' greedy text with those rules written out as a logits processor."""
    request = dict(
        prompt="The cat sat on the mat. The cat",
        max_tokens=20,
        temperature=0,
        frequency_penalty=0.7,
        presence_penalty=0.3,
        logit_bias={"13": -100, "262": 2.5},
    )
    got = complete(client, **request, extra_body={"repetition_penalty": 1.2}).choices[0].text
    ids = tiktoken_gpt2.encode(request["prompt"])
    rules = PenaltiesWrittenOut(len(ids), {13: -100, 262: 2.5}, frequency=0.7, presence=0.3, repetition=1.2)
    new = transformers_greedy(models[0], ids, 20, logits_processor=LogitsProcessorList([rules]))
    expected = tiktoken_gpt2.decode([t for t in new if t != tiktoken_gpt2.eot_token])
    assert (
        got == expected
        and got != complete(client, prompt=request["prompt"], max_tokens=20, temperature=0).choices[0].text
    )


# ------------------------------------------------------------------ a model that comes with no tokenizer: token ids

INDUCTION_2L = REPO / "tests" / "fixtures" / "induction_2l"  # trained here: 64 ids, no tokenizer
PROMPT_IDS = [3, 14, 15, 9, 26, 3, 14]


@pytest.fixture(scope="module")
def ids_server():
    """induction_2l served on token ids (its tokenizer None)."""
    from gpt2.model.model import GPT2

    yield from serving(GPT2.from_pretrained(INDUCTION_2L, device="cpu"), None, "induction_2l")


@pytest.fixture(scope="module")
def induction_hf():
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel.from_pretrained(INDUCTION_2L).eval()  # the same file, read by transformers


def test_a_model_with_no_tokenizer_answers_token_ids_with_transformers_token_ids(ids_server, induction_hf):
    """No text (""): each choice's token_ids, unasked, whole and streamed a chunk a token; sampled choices follow
    the one seed rule; an echoed prompt's log-probabilities name each token "token_id:N", as lm-eval scores ids."""
    client = ids_server.client()
    request = dict(model="induction_2l", prompt=PROMPT_IDS, max_tokens=10)
    greedy = transformers_greedy(induction_hf, PROMPT_IDS, 10)
    whole = client.completions.create(**request, temperature=0)
    choice = whole.choices[0].model_dump()
    assert (choice["text"], choice["prompt_token_ids"], choice["token_ids"]) == ("", PROMPT_IDS, greedy)
    assert choice["finish_reason"] == "length" and whole.usage.completion_tokens == 10
    chunks = [c.choices[0].model_dump() for c in client.completions.create(**request, temperature=0, stream=True)]
    assert [c["token_ids"] for c in chunks] == [[i] for i in greedy] and all(c["text"] == "" for c in chunks)
    assert chunks[0]["prompt_token_ids"] == PROMPT_IDS and chunks[-1]["finish_reason"] == "length"
    sampled = client.completions.create(**request, temperature=1.5, seed=7, n=2).choices
    expected = [transformers_sampled(induction_hf, PROMPT_IDS, 10, seed, temperature=1.5) for seed in (7, 8)]
    assert [c.model_dump()["token_ids"] for c in sampled] == expected and expected[0] != expected[1]
    scored = client.completions.create(**{**request, "max_tokens": 0}, echo=True, logprobs=2).choices[0].logprobs
    with torch.no_grad():
        logprobs = torch.log_softmax(induction_hf(torch.tensor([PROMPT_IDS])).logits[0], dim=-1)  # (T, V)
    assert scored.tokens == [f"token_id:{i}" for i in PROMPT_IDS] and scored.token_logprobs[0] is None
    given = logprobs[:-1].gather(-1, torch.tensor(PROMPT_IDS[1:])[:, None])[:, 0]
    assert torch.allclose(torch.tensor(scored.token_logprobs[1:]), given, atol=1e-4)
    assert set(scored.top_logprobs[1]) >= {f"token_id:{i}" for i in logprobs[0].topk(2).indices.tolist()}


@pytest.mark.parametrize(
    "body, param, message",
    [
        ({"prompt": "3 14 15"}, "prompt", "a text in prompt needs one: give token ids instead, a list of ints"),
        ({"prompt": [[3, 14], "text"]}, "prompt", "prompt 1: this model comes with no tokenizer"),
        ({"prompt": [3, 14], "stop": "\n"}, "stop", "stop strings need one: they end the text"),
        ({"prompt": [3, 14], "response_format": {"type": "json_object"}}, "response_format", "it constrains the text"),
    ],
)
def test_a_model_with_no_tokenizer_refuses_completions_of_text_with_a_400(ids_server, body, param, message):
    answer = post(ids_server, {"model": "induction_2l", "max_tokens": 2, **body})
    error = answer.json()["error"]
    assert answer.status_code == 400 and (error["param"], error["code"]) == (param, "tokenizer_required")
    assert "this model comes with no tokenizer" in error["message"] and message in error["message"]
