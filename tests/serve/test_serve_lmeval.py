"""The end-of-text token in `gpt2 serve`'s log-probabilities, and lm-evaluation-harness through
the server: on a model that ends its texts (after a ".", <|endoftext|> is the greedy next token),
every generated token is listed, <|endoftext|> too, so that lm-eval's `local-completions`, which
reads `token_logprobs[ctxlen:-1]` after one generated token, scores as transformers does and as
lm-eval's own `hf` model does on the same weights."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import httpx
import lm_eval
import pytest
import torch
from helpers import make_ending_model, serving
from lm_eval.models.openai_completions import LocalCompletionsAPI
from lm_eval.tasks import TaskManager

from gpt2 import Tokenizer
from gpt2.model.model import GPT2

ENC = Tokenizer.gpt2()
EOT = ENC.eot_token
N_CTX = 64
TASKS = (
    Path(__file__).resolve().parents[1] / "fixtures" / "lmeval"
)  # gpt2_endings: contexts scored with three endings each


@pytest.fixture(scope="module")
def ending_model(tmp_path_factory):
    """helpers.make_ending_model: (transformers' model, ours loaded from its directory, the directory)."""
    directory = tmp_path_factory.mktemp("ending")
    hf = make_ending_model(directory, N_CTX)
    return hf, GPT2.from_pretrained(directory, device="cpu"), str(directory)


@pytest.fixture(scope="module")
def server(ending_model):
    yield from serving(ending_model[1], ENC)


def transformers_logprobs(hf, ids: list[int]) -> torch.Tensor:
    """log_softmax of transformers' logits over `ids`, (T, V) in float64."""
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].double(), dim=-1)


def completion(server, **body) -> dict:
    response = httpx.post(server.url + "/v1/completions", json={"model": "tiny", **body}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


# ------------------------------------------------------------------ lm-eval's slicing

PAIRS = [  # (context, continuation) as lm-eval scores them
    ("The capital of France is", " Paris."),  # ends in ".": the model would end the text next
    ("Water boils at", " one hundred degrees."),
    ("And so the story is over", "."),  # one token: without the end's entry, lm-eval's slice is empty (0.0)
    ("Two plus two is", " four"),
    ("Once upon a", " time"),
    ("The capital of France is Paris.", "<|endoftext|>"),  # does the text end here? the greedy answer: yes
]


def test_lm_evals_slicing_of_one_generated_token_equals_transformers_loglikelihoods(ending_model, server):
    """lm-eval's local-completions request (echo, logprobs 1, max_tokens 1, built by its
    _create_payload) and its parse_logprobs: sum(token_logprobs[ctxlen:-1]) and is-greedy, as
    transformers' log_softmax gives them, whether or not the token generated is <|endoftext|>."""
    hf = ending_model[0]
    contexts = [ENC.encode(context) for context, _ in PAIRS]
    prompts = [c + ENC.encode(continuation, allowed_special="all") for c, (_, continuation) in zip(contexts, PAIRS)]
    payload = LocalCompletionsAPI._create_payload(SimpleNamespace(model="tiny"), prompts, generate=False)
    assert (payload["echo"], payload["logprobs"], payload["max_tokens"]) == (True, 1, 1)
    scored = LocalCompletionsAPI.parse_logprobs(
        completion(server, **payload), tokens=prompts, ctxlens=list(map(len, contexts))
    )
    generated_end = []
    for (loglikelihood, greedy), prompt, context in zip(scored, prompts, contexts, strict=True):
        logprobs = transformers_logprobs(hf, prompt)
        continuation = range(len(context), len(prompt))
        expected = sum(float(logprobs[t - 1, prompt[t]]) for t in continuation)
        assert abs(loglikelihood - expected) < 1e-4, (loglikelihood, expected)
        assert greedy == all(int(logprobs[t - 1].argmax()) == prompt[t] for t in continuation)
        generated_end.append(int(logprobs[-1].argmax()) == EOT)
    assert generated_end == [True, True, True, False, False, True]  # both kinds of last token are read
    assert scored[-1][1]  # and <|endoftext|> after "." is the greedy continuation


# ------------------------------------------------------------------ lm-eval itself


def lm_eval_samples(model: str, model_args: str) -> list[dict]:
    """lm-eval's per-sample results of the gpt2_endings task for one of its models, by doc."""
    tasks = TaskManager(include_path=str(TASKS), include_defaults=False)
    results = lm_eval.simple_evaluate(
        model=model, model_args=model_args, tasks=["gpt2_endings"], task_manager=tasks, log_samples=True
    )
    return sorted(results["samples"]["gpt2_endings"], key=lambda sample: sample["doc_id"])


def test_lm_eval_local_completions_scores_each_sample_as_its_hf_model(ending_model, server):
    """lm-eval's local-completions against the server (its tokenizer the server's /tokenize, in
    requests of 3 prompts) and lm-eval's hf model on the same weights: every ending's
    loglikelihood within 1e-4, the same is-greedy."""
    served = lm_eval_samples(
        "local-completions", f"model=tiny,base_url={server.url}/v1/completions,max_length={N_CTX},batch_size=3"
    )
    local = lm_eval_samples("hf", f"pretrained={ending_model[2]},device=cpu,dtype=float32")
    docs = json.loads((TASKS / "endings.json").read_text(encoding="utf-8"))
    assert len(served) == len(local) == len(docs) and sum(len(doc["endings"]) for doc in docs) == 21
    for ours, theirs in zip(served, local):
        assert ours["arguments"] == theirs["arguments"]  # the same contexts and endings
        for (ll, greedy), (expected, expected_greedy) in zip(
            [r[0] for r in ours["resps"]], [r[0] for r in theirs["resps"]], strict=True
        ):
            assert abs(ll - expected) < 1e-4 and greedy == expected_greedy, (ours["doc_id"], ll, expected)


# ------------------------------------------------------------------ every token listed

PROMPTS = [
    "The capital of France is",
    "Once upon a time",
]  # the first's greedy text ends (" fraction." then the end), the second's runs on
LISTS = ("tokens", "token_logprobs", "text_offset")


def greedy_tokens(hf, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy continuation, to its <|endoftext|> (kept) or max_new_tokens."""
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=EOT, pad_token_id=EOT
        )
    return out[0, len(prompt) :].tolist()


def streamed_lists(server, body: dict) -> dict[int, dict[str, list]]:
    """Each choice's logprobs lists and token_ids, its streamed chunks' joined, by index."""
    joined: dict[int, dict[str, list]] = {}
    with httpx.stream(
        "POST", server.url + "/v1/completions", json={"model": "tiny", "stream": True, **body}, timeout=60
    ) as response:
        for line in response.iter_lines():
            for c in json.loads(line.removeprefix("data: "))["choices"] if line.startswith("data: {") else []:
                lists = joined.setdefault(c["index"], {key: [] for key in (*LISTS, "token_ids")})
                lists["token_ids"] += c["token_ids"]
                for key in LISTS:
                    lists[key] += c["logprobs"][key]
    return joined


def test_every_token_generated_is_listed_end_of_text_included_whole_and_streamed(ending_model, server):
    """completions' logprobs list each token the choice took (its `token_ids`, `usage`'s count),
    <|endoftext|> by its name at the text's end, with transformers' log-probability; the text is
    without it. Streamed, the chunks' lists join to the whole answer's."""
    hf = ending_model[0]
    prompts = [ENC.encode(prompt) for prompt in PROMPTS]
    expected = [greedy_tokens(hf, prompt, 8) for prompt in prompts]
    assert expected[0][-1] == EOT and EOT not in expected[1]  # one choice ends, one runs to max_tokens
    body = {"prompt": PROMPTS, "n": 2, "max_tokens": 8, "temperature": 0, "logprobs": 2, "return_token_ids": True}
    for echo in (False, True):
        whole = completion(server, echo=echo, **body)
        assert (
            whole["usage"]["completion_tokens"]
            == sum(len(c["token_ids"]) for c in whole["choices"])
            == 2 * sum(map(len, expected))
        )
        for choice in whole["choices"]:
            prompt, new = prompts[choice["index"] // 2], expected[choice["index"] // 2]
            text = (PROMPTS[choice["index"] // 2] if echo else "") + ENC.decode([t for t in new if t != EOT])
            assert (
                choice["token_ids"] == new
                and choice["text"] == text
                and choice["finish_reason"] == ("stop" if EOT in new else "length")
            )
            lp, logprobs = choice["logprobs"], transformers_logprobs(hf, prompt + new)
            assert lp["tokens"][len(prompt) if echo else 0 :] == [
                ENC.decode([t]) for t in new
            ]  # "<|endoftext|>" for the end
            first = len(lp["tokens"]) - len(new)  # the generated tokens' entries follow an echoed prompt's
            for k, token in enumerate(new):
                at = logprobs[len(prompt) - 1 + k]
                assert abs(lp["token_logprobs"][first + k] - float(at[token])) < 1e-4
                assert abs(max(lp["top_logprobs"][first + k].values()) - float(at.max())) < 1e-4
            if EOT in new:
                assert lp["text_offset"][-1] == len(text) > lp["text_offset"][-2]
        streamed = streamed_lists(server, {"echo": echo, **body})
        for choice in whole["choices"]:
            assert streamed[choice["index"]] == {
                "token_ids": choice["token_ids"],
                **{key: choice["logprobs"][key] for key in LISTS},
            }


def test_a_stop_string_before_the_end_leaves_its_tokens_and_the_end_unlisted(server):
    """A stop string's tokens are not the text's, nor the <|endoftext|> after them: neither is listed."""
    choice = completion(server, prompt=PROMPTS[0], max_tokens=8, temperature=0, logprobs=0, stop=".")["choices"][0]
    assert choice["text"] == " fraction" and choice["finish_reason"] == "stop"
    assert choice["logprobs"]["tokens"] == [" fraction"] and choice["logprobs"]["text_offset"] == [0]
