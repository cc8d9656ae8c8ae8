"""POST /v1/circuits/{scores,head,patching,attribution} (gpt2.serve.circuits): each answer equals the
experiment done on transformers' GPT2LMHeadModel with the same weights, through its own hooks
and the formulas written out here; bad requests get a 400 naming the field."""

from __future__ import annotations

import pytest
import torch
from helpers import make_hf_model
from serve_fixtures import ENC, N_CTX, post

CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPTED = "When Mary and John went to the store, Mary gave a drink to"


@pytest.fixture(scope="module")
def hf():
    """The served model's weights (serve_fixtures' models) in transformers, its attention written out (eager)."""
    return make_hf_model(
        seed=5, vocab_size=50257, n_positions=N_CTX, n_embd=48, n_layer=2, n_head=3, attn_implementation="eager"
    )


def hooked(hf, ids, hooks):
    """transformers' logits (T, V) of one run with forward pre-hooks {module: fn(args) -> args}."""
    handles = [module.register_forward_pre_hook(fn) for module, fn in hooks.items()]
    try:
        with torch.no_grad():
            return hf(torch.tensor([ids])).logits[0]
    finally:
        for handle in handles:
            handle.remove()


REPEATED = "The cat sat on the mat. The cat sat on the mat."


def scores_of(A: torch.Tensor, ids: list[int]) -> dict[str, float]:
    """One head's three scores from its attention pattern A (T, T), written out."""
    T = len(ids)
    repeats = [q for q in range(T) if ids[q] in ids[:q]]
    return {
        "previous_token": float(sum(A[q, q - 1] for q in range(1, T)) / (T - 1)),
        "duplicate_token": float(
            sum(sum(A[q, p] for p in range(q) if ids[p] == ids[q]) for q in repeats) / len(repeats)
        ),
        "induction": float(
            sum(sum(A[q, p + 1] for p in range(q - 1) if ids[p] == ids[q]) for q in repeats) / len(repeats)
        ),
    }


def test_a_heads_scores_and_its_ablation_equal_transformers(server, hf):
    text = REPEATED
    ids = ENC.encode(text)
    layer, head, d = 1, 2, 48 // 3
    answer = post(server, {"prompt": text, "layer": layer, "head": head, "top_k": 4}, "/v1/circuits/head").json()
    with torch.no_grad():
        A = hf(torch.tensor([ids]), output_attentions=True).attentions[layer][0, head]  # (T, T)
    expected = scores_of(A, ids)
    assert answer["scores"].keys() == expected.keys()
    for kind, value in expected.items():
        assert answer["scores"][kind] == pytest.approx(float(value), abs=1e-5), kind

    def zero_head(module, args):  # c_proj's input: the heads' outputs side by side, (B, T, H * d)
        x = args[0].clone()
        x[..., head * d : (head + 1) * d] = 0
        return (x,)

    before = torch.softmax(hooked(hf, ids, {})[-1], -1)
    after = torch.softmax(hooked(hf, ids, {hf.transformer.h[layer].attn.c_proj: zero_head})[-1], -1)
    shown = [e["id"] for e in answer["next"]]
    assert shown[:4] == before.topk(4).indices.tolist() and set(after.topk(4).indices.tolist()) <= set(shown)
    for e in answer["next"]:  # a random model's probabilities are all near 1 / 50257: compared relatively
        assert e["before"] == pytest.approx(float(before[e["id"]]), rel=1e-4)
        assert e["after"] == pytest.approx(float(after[e["id"]]), rel=1e-4)
    assert (
        max(abs(e["after"] / e["before"] - 1) for e in answer["next"]) > 1e-3
    )  # the ablation moved them more than that
    plain = post(server, {"prompt": "Hello world", "layer": 0, "head": 0}, "/v1/circuits/head").json()["scores"]
    assert (
        plain["duplicate_token"] is None and plain["induction"] is None and plain["previous_token"] > 0
    )  # no token repeats


def test_every_heads_scores_equal_transformers_and_a_kind_with_no_repeat_is_null(server, hf):
    """/v1/circuits/scores, the playground's map of the heads: [layer][head] for each kind."""
    ids = ENC.encode(REPEATED)
    got = post(server, {"prompt": REPEATED}, "/v1/circuits/scores").json()
    with torch.no_grad():
        attentions = hf(torch.tensor([ids]), output_attentions=True).attentions
    assert got["ids"] == ids and [len(row) for row in got["scores"]["induction"]] == [3, 3]
    for layer, A in enumerate(attentions):
        for head in range(3):
            for kind, value in scores_of(A[0, head], ids).items():
                assert got["scores"][kind][layer][head] == pytest.approx(value, abs=1e-5), (kind, layer, head)
    plain = post(server, {"prompt": "Hello world"}, "/v1/circuits/scores").json()["scores"]
    assert plain["duplicate_token"] is None and plain["induction"] is None and len(plain["previous_token"]) == 2


# Each answer given (as text, or as an id) or left to its default: the clean run's top token, the
# corrupted run's. Not both defaults: this random model's two runs have the same top token.
@pytest.mark.parametrize(
    "given", [{"other": ENC.encode(" John")[0]}, {"answer": " Mary"}], ids=["clean-top-vs-id", "text-vs-corrupted-top"]
)
def test_resid_pre_patching_equals_transformers_patched_by_hooks(server, hf, given):
    clean, corrupted = ENC.encode(CLEAN), ENC.encode(CORRUPTED)
    with torch.no_grad():
        streams = hf(torch.tensor([clean]), output_hidden_states=True).hidden_states  # [l]: entering block l
    answer = ENC.encode(given["answer"])[0] if "answer" in given else int(hooked(hf, clean, {})[-1].argmax())
    other = given["other"] if "other" in given else int(hooked(hf, corrupted, {})[-1].argmax())
    body = given
    got = post(server, {"clean": CLEAN, "corrupted": CORRUPTED, **body}, "/v1/circuits/patching").json()
    assert (got["answer"]["id"], got["other"]["id"], got["site"], got["axes"]) == (
        answer,
        other,
        "resid_pre",
        ["layer", "position"],
    )
    diff = lambda logits: float(logits[-1, answer] - logits[-1, other])  # noqa: E731
    assert got["clean"]["logit_diff"] == pytest.approx(diff(hooked(hf, clean, {})), abs=1e-4)
    assert got["corrupted"]["logit_diff"] == pytest.approx(diff(hooked(hf, corrupted, {})), abs=1e-4)
    grid = torch.tensor(got["grid"])
    assert grid.shape == (2, len(clean))
    for layer, block in enumerate(hf.transformer.h):
        for t in range(len(clean)):

            def take_clean(module, args, t=t, layer=layer):  # the stream entering the block, at t, from the clean run
                x = args[0].clone()
                x[0, t] = streams[layer][0, t]
                return (x, *args[1:])

            assert float(grid[layer, t]) == pytest.approx(diff(hooked(hf, corrupted, {block: take_clean})), abs=1e-4), (
                layer,
                t,
            )


@torch.no_grad()
def test_logit_attribution_equals_transformers_pieces_through_ln_f(server, hf):
    ids = ENC.encode(CLEAN)
    got = post(server, {"prompt": CLEAN, "answer": " Mary", "other": " John"}, "/v1/circuits/attribution").json()
    a, o = ENC.encode(" Mary")[0], ENC.encode(" John")[0]
    seen = {}
    hooks = [
        block.attn.c_proj.register_forward_pre_hook(lambda m, args, i=i: seen.__setitem__(f"z{i}", args[0][0]))
        for i, block in enumerate(hf.transformer.h)
    ]
    hooks += [
        block.mlp.register_forward_hook(lambda m, args, out, i=i: seen.__setitem__(f"mlp{i}", out[0]))
        for i, block in enumerate(hf.transformer.h)
    ]
    hooks.append(hf.transformer.ln_f.register_forward_pre_hook(lambda m, args: seen.__setitem__("x", args[0][0])))
    out = hf(torch.tensor([ids]), output_hidden_states=True)
    for hook in hooks:
        hook.remove()
    ln_f, direction = hf.transformer.ln_f, hf.transformer.wte.weight[a] - hf.transformer.wte.weight[o]
    x = seen["x"][-1]
    scale = (x.var(unbiased=False) + ln_f.eps).sqrt()
    effect = lambda piece: float(((piece - piece.mean()) / scale * ln_f.weight) @ direction)  # noqa: E731
    d = 48 // 3
    for i, block in enumerate(hf.transformer.h):
        W = block.attn.c_proj.weight  # Conv1D: (in, out)
        for h in range(3):
            assert got["heads"][i][h] == pytest.approx(
                effect(seen[f"z{i}"][-1, h * d : (h + 1) * d] @ W[h * d : (h + 1) * d]), abs=1e-4
            )
        assert got["mlps"][i] == pytest.approx(effect(seen[f"mlp{i}"][-1]), abs=1e-4)
        assert got["biases"][i] == pytest.approx(effect(block.attn.c_proj.bias), abs=1e-4)
    assert got["embed"] == pytest.approx(effect(out.hidden_states[0][0, -1]), abs=1e-4)
    assert got["biases"][2] == pytest.approx(float(ln_f.bias @ direction), abs=1e-4)
    assert got["total"] == pytest.approx(float(out.logits[0, -1, a] - out.logits[0, -1, o]), abs=1e-4)
    assert (got["answer"], got["other"]) == ({"token": " Mary", "id": a}, {"token": " John", "id": o})


BAD_CIRCUITS = [
    ("head", {"prompt": "hi", "layer": 2, "head": 0}, "layer", "layer must be an integer from 0 to 1, got 2"),
    ("head", {"prompt": "hi", "layer": -1, "head": 0}, "layer", "layer must be an integer from 0 to 1, got -1"),
    ("head", {"prompt": "hi", "layer": 0, "head": 3}, "head", "head must be an integer from 0 to 2, got 3"),
    (
        "head",
        {"prompt": "hi", "layer": 0, "head": 0, "kind": "induction"},
        "kind",
        "Unrecognized request argument supplied: kind",
    ),
    (
        "head",
        {"prompt": [15496] * 129, "layer": 0, "head": 0},
        "prompt",
        "This model's maximum context length is 128 tokens, however your prompt has 129",
    ),
    (
        "patching",
        {"clean": "a b", "corrupted": "c d", "site": "resid_post"},
        "site",
        "unknown site 'resid_post': the sites are resid_pre, attn_out, mlp_out, head, head_pos",
    ),
    (
        "patching",
        {"clean": "Hello world", "corrupted": "Hello"},
        "corrupted",
        "clean and corrupted must have the same length: clean has 2 tokens, corrupted 1",
    ),
    ("patching", {"clean": [15496] * 129, "corrupted": "Hello"}, "clean", "however your clean has 129 tokens"),
    (
        "patching",
        {"clean": [15496] * 91, "corrupted": [995] * 91},
        "clean",
        "runs the model 182 times over 91 tokens = 16,562 tokens, "
        "over this server's limit of 16,384 (max_patching_tokens): at most 90",
    ),
    (  # a head's queries at each position: n_layer x n_head x T runs of T tokens, 2 x 3 x 53 x 53 > 16,384
        "patching",
        {"clean": [15496] * 53, "corrupted": [995] * 53, "site": "head_q_pos"},
        "clean",
        "runs the model 318 times over 53 tokens = 16,854 tokens, "
        "over this server's limit of 16,384 (max_patching_tokens): at most 52 tokens",
    ),
    (
        "patching",
        {"clean": "a b", "corrupted": "c d", "site": "block_every"},
        "site",
        "unknown site 'block_every': the sites are resid_pre, attn_out, mlp_out, head, head_pos, resid_mid, head_q, ",
    ),
    (
        "patching",
        {"clean": "a b", "corrupted": "c d", "answer": " Mary Mary"},
        "answer",
        "answer must be one token of the model's vocabulary, but ' Mary Mary' is 2",
    ),
    (
        "patching",
        {"clean": "a b", "corrupted": "c d", "answer": ""},
        "answer",
        "answer is empty: give one token's text",
    ),
    (
        "patching",
        {"clean": "a b", "corrupted": "c d", "answer": " Mary", "other": " Mary"},
        "other",
        "answer and other are the same token, ' Mary' (id 5335): "
        "logit(answer) - logit(other) is 0 whatever the model does",
    ),
    (
        "patching",
        {"clean": "a b", "corrupted": "a b"},
        "other",  # one text twice: both runs' top token is the same
        "; answer: the clean run's top token; other: the corrupted run's top token): "
        "logit(answer) - logit(other) is 0 whatever the model does",
    ),
    (
        "patching",
        {"clean": "a b", "corrupted": "c d", "answer": " Mary", "other": 5335},
        "other",
        "answer and other are the same token",
    ),
    ("attribution", {"prompt": "hi", "answer": 5335, "other": " Mary"}, "other", "answer and other are the same token"),
    ("attribution", {"prompt": "hi", "other": ""}, "other", "other is empty"),
    ("scores", {"prompt": [15496] * 129}, "prompt", "This model's maximum context length is 128 tokens"),
    ("attribution", {"prompt": "hi", "other": 50257}, "other", "token id 50257 in other is out of range"),
    ("attribution", {"prompt": [15496] * 129}, "prompt", "This model's maximum context length is 128 tokens"),
]


@pytest.mark.parametrize(
    "route, body, param, message", BAD_CIRCUITS, ids=[f"{b[0]}-{b[2]}{i}" for i, b in enumerate(BAD_CIRCUITS)]
)
def test_a_bad_circuits_request_gets_a_400_naming_the_field(server, route, body, param, message):
    response = post(server, body, f"/v1/circuits/{route}")
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == param and message in error["message"], error
