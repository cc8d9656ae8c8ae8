"""POST /v1/inspect (gpt2.serve.inspection): attention, log-probabilities and the logit lens equal
transformers', bad inspections get a 400, and the answer's bound."""

from __future__ import annotations

import pytest
import torch
from helpers import REPO, Running, assert_walk_equals_transformers, make_hf_model
from serve_fixtures import ENC, N_CTX, api_token, post

from gpt2.errors import GPT2Error
from gpt2.serve import Limits


def test_inspect_equals_transformers_attention_logprobs_and_logit_lens(models, server):
    hf = make_hf_model(
        seed=5, vocab_size=50257, n_positions=N_CTX, n_embd=48, n_layer=2, n_head=3, attn_implementation="eager"
    )
    text = "The quick brown fox jumps over the lazy dog."
    ids = ENC.encode(text)
    answer = post(server, {"model": "tiny", "prompt": text, "top_k": 3}, "/v1/inspect").json()
    assert answer["ids"] == ids and answer["tokens"] == [api_token(i) for i in ids]
    with torch.no_grad():
        out = hf(torch.tensor([ids]), output_attentions=True, output_hidden_states=True)
    logprobs = torch.log_softmax(out.logits[0], dim=-1)  # (T, V)
    assert answer["logprobs"][0] is None
    assert torch.allclose(
        torch.tensor(answer["logprobs"][1:]), logprobs[:-1].gather(-1, torch.tensor(ids[1:])[:, None])[:, 0], atol=1e-4
    )
    for position, top in enumerate(answer["top_logprobs"]):
        best = logprobs[position].topk(3)
        assert [e["id"] for e in top] == best.indices.tolist() and [e["token"] for e in top] == [
            api_token(e["id"]) for e in top
        ]
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
    (
        {"prompt": [15496] * 129},
        "prompt",
        "This model's maximum context length is 128 tokens, however your prompt has 129",
    ),
]


@pytest.mark.parametrize(
    "body, param, message", BAD_INSPECTIONS, ids=[b[1] + str(i) for i, b in enumerate(BAD_INSPECTIONS)]
)
def test_a_bad_inspection_gets_a_400_naming_the_field(server, body, param, message):
    response = post(server, body, "/v1/inspect")
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == param and message in error["message"]
    assert post(server, {"prompt": "hi", "model": "other"}, "/v1/inspect").status_code == 404


def test_an_inspection_past_the_answer_bound_is_refused_saying_how_far_it_goes(models):
    running = Running(
        lambda: (models[1], ENC), limits=Limits(max_inspect_cells=6 * 20 * 20)
    )  # 2 layers x 3 heads: 20 tokens
    try:
        assert post(running, {"prompt": [15496] * 20}, "/v1/inspect").status_code == 200
        error = post(running, {"prompt": [15496] * 21}, "/v1/inspect").json()["error"]
        assert (error["param"], error["code"]) == ("prompt", "inspection_too_large")
        assert (
            "2 layers x 3 heads x 21 x 21 = 2,646 attention probabilities, over this server's limit of 2,400"
            in error["message"]
        )
        assert "at most 20 tokens" in error["message"]
    finally:
        running.stop()
    with pytest.raises(GPT2Error, match="max_inspect_cells must be"):
        Limits(max_inspect_cells=0).check()


INDUCTION_2L = REPO / "tests" / "fixtures" / "induction_2l"  # trained here: 64 ids, no tokenizer


def test_a_model_with_no_tokenizer_is_inspected_on_token_ids():
    """/v1/inspect of a prompt of ids: transformers' log-probabilities, each token "token_id:N"; a text is a 400."""
    from transformers import GPT2LMHeadModel

    from gpt2.model.model import GPT2

    ids = [3, 14, 15, 9, 26, 3, 14]
    running = Running(lambda: (GPT2.from_pretrained(INDUCTION_2L, device="cpu"), None), "induction_2l")
    try:
        answer = post(running, {"prompt": ids, "top_k": 2}, "/v1/inspect").json()
        refused = post(running, {"prompt": "3 14 15"}, "/v1/inspect")
    finally:
        running.stop()
    with torch.no_grad():
        logprobs = torch.log_softmax(GPT2LMHeadModel.from_pretrained(INDUCTION_2L)(torch.tensor([ids])).logits[0], -1)
    assert answer["ids"] == ids and answer["tokens"] == [f"token_id:{i}" for i in ids]
    given = logprobs[:-1].gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    assert torch.allclose(torch.tensor(answer["logprobs"][1:]), given, atol=1e-4)
    assert [[e["token"] for e in top] for top in answer["top_logprobs"]] == [
        [f"token_id:{i}" for i in row] for row in logprobs.topk(2).indices.tolist()
    ]
    error = refused.json()["error"]
    assert refused.status_code == 400 and (error["param"], error["code"]) == ("prompt", "tokenizer_required")


def test_walk_equals_transformers_with_the_prompts_merges_in_the_apis_words(models, server):
    hf = make_hf_model(
        seed=5, vocab_size=50257, n_positions=N_CTX, n_embd=48, n_layer=2, n_head=3, attn_implementation="eager"
    )
    text = "Hello<|endoftext|> unbelievable"
    answer = post(server, {"model": "tiny", "prompt": text, "top_k": 12}, "/v1/walk").json()
    assert answer["ids"] == ENC.encode(text, allowed_special="all")  # the server reads special tokens in text
    assert answer["tokens"] == [api_token(i) for i in answer["ids"]]
    assert [e["token"] for e in answer["next"]] == [api_token(e["id"]) for e in answer["next"]]
    assert_walk_equals_transformers(answer, hf)
    assert [w["word"] for w in answer["bpe"]] == ["Hello", "<|endoftext|>", " unbelievable"]
    by_ids = post(server, {"prompt": answer["ids"], "top_k": 12}, "/v1/walk").json()
    assert by_ids["bpe"] is None and by_ids["steps"] == answer["steps"]


def test_a_walk_names_every_token_of_a_vocabulary_smaller_than_top_k(char_server):
    answer = post(char_server, {"prompt": "ROMEO:", "top_k": 100}, "/v1/walk").json()
    logits = next(s for s in answer["steps"] if s["name"] == "logits")["values"]
    assert len(answer["next"]) == len(logits) == 65  # the model's 65 characters, each once, highest logit first
    assert sorted(e["id"] for e in answer["next"]) == list(range(65))
    assert [e["logit"] for e in answer["next"]] == sorted((e["logit"] for e in answer["next"]), reverse=True)
    assert all(abs(e["logit"] - logits[e["id"]]) < 1e-5 for e in answer["next"])


@pytest.mark.parametrize(
    "body, param, message",
    [
        ({"prompt": "hi", "top_k": 101}, "top_k", "top_k must be an integer from 1 to 100, got 101"),
        ({"prompt": ["one", "two"]}, "prompt", "/v1/walk looks at one prompt at a time, got 2"),
        ({"prompt": [15496] * 129}, "prompt", "This model's maximum context length is 128 tokens"),
    ],
)
def test_a_bad_walk_gets_a_400_naming_the_field(server, body, param, message):
    response = post(server, body, "/v1/walk")
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == param and message in error["message"]
