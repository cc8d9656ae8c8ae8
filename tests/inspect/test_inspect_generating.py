"""gpt2.inspect.trace_generation: a generation's activations, computed with the KV cache, against
one trace of the whole text (issue 38's criterion), against transformers' own `generate` on the
same weights (its tokens, hidden states and attention), and against gpt2's `generate`'s tokens."""

from __future__ import annotations

import pytest
import torch
from helpers import hf_and_ours, transformers_greedy, transformers_sampled

from gpt2 import InputTypeError, InvalidArgumentError
from gpt2.errors import ContextLengthError
from gpt2.inspect.generating import trace_generation
from gpt2.inspect.tracing import activation_names, trace
from gpt2.tokenizer import Tokenizer

VOCAB, CTX, N_EMBD, N_LAYER, N_HEAD = 97, 32, 32, 2, 4
PROMPT = [5, 17, 60, 3, 42, 17, 88]
NEW = 8
ALL = activation_names(N_LAYER)  # q, k, v, scores and z too


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """transformers' model (eager attention, which keeps its probabilities) and gpt2's on the same
    random weights, drawn wider than GPT-2's (std 0.2, not 0.02) so that greedy decoding does
    not repeat one token, and activations stay of order 1 (std 0.4 takes the stream to 18, where
    float32's rounding alone is 1e-5)."""
    return hf_and_ours(
        tmp_path_factory.mktemp("generating"),
        vocab_size=VOCAB,
        n_positions=CTX,
        n_embd=N_EMBD,
        n_layer=N_LAYER,
        n_head=N_HEAD,
        attn_implementation="eager",
        initializer_range=0.2,
    )


def assert_same_activations(got, expected, tol=1e-5):
    assert got.keys() == expected.keys()
    for name in expected:  # -inf in the same places (the scores' keys after each query), within tol elsewhere
        torch.testing.assert_close(got[name], expected[name], atol=tol, rtol=0, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize(
    "sampling", [dict(temperature=0), dict(temperature=0.9, top_k=40, seed=7)], ids=["greedy", "sampled"]
)
def test_every_position_equals_one_trace_of_the_whole_text(pair, sampling):
    """The issue's criterion: prompt, then one position a step over the KV cache, gives what one
    pass over the prompt and the tokens generated gives, for every name (the full (H, T, T)
    scores and patterns included), and the same logits."""
    model = pair[1]
    got = trace_generation(model, PROMPT, NEW, names=ALL, **sampling)
    assert got.ids[: len(PROMPT)] == PROMPT and len(got.new_ids) == NEW and got.prompt_length == len(PROMPT)
    whole = trace(model, got.ids, names=ALL)
    assert_same_activations(got.activations, whole.activations)
    torch.testing.assert_close(got.logits, whole.logits, atol=1e-5, rtol=0)
    assert got.activations["h.1.attn.pattern"].shape == (N_HEAD, len(PROMPT) + NEW, len(PROMPT) + NEW)


def test_tokens_hidden_states_and_attention_equal_transformers_generate(pair):
    """transformers' greedy `generate` with its own KV cache, on the same weights: the same
    tokens; its hidden states (the stream entering each block, then ln_f's output) and its
    attention probabilities at every position it computes (all but the last token, which it
    never feeds back) within 1e-4."""
    hf, model = pair
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([PROMPT]),
            max_new_tokens=NEW,
            do_sample=False,
            output_hidden_states=True,
            output_attentions=True,
            return_dict_in_generate=True,
            pad_token_id=VOCAB - 1,
        )
    assert out.sequences.shape == (1, len(PROMPT) + NEW)  # no early <|endoftext|>: a full comparison
    got = trace_generation(model, PROMPT, NEW, temperature=0)
    assert got.ids == out.sequences[0].tolist()
    T = len(PROMPT) + NEW - 1  # the positions transformers computed: the prompt at step 0, then one a step
    ours = [got.residual(layer)[:T] for layer in range(N_LAYER)] + [got.activations["ln_f"][:T]]
    for layer, theirs in enumerate(zip(*out.hidden_states)):  # (prompt (1, T_p, C), then (1, 1, C) a step) per layer
        torch.testing.assert_close(ours[layer], torch.cat(theirs, dim=1)[0], atol=1e-4, rtol=0)
    for layer, theirs in enumerate(zip(*out.attentions)):  # (1, H, T_step, S_step): each row's keys so far
        rows = [a[0, :, :, :] for a in theirs]
        ours_rows = got.activations[f"h.{layer}.attn.pattern"][:, :T]
        start = 0
        for r in rows:
            torch.testing.assert_close(ours_rows[:, start : start + r.size(1), : r.size(2)], r, atol=1e-4, rtol=0)
            assert not ours_rows[:, start : start + r.size(1), r.size(2) :].any()  # the keys it cannot see: 0
            start += r.size(1)


@pytest.mark.parametrize(
    "sampling",
    [dict(temperature=1.0, seed=3), dict(temperature=0.7, top_p=0.9, seed=11), dict(temperature=0)],
    ids=["seed", "top_p", "greedy"],
)
def test_tokens_are_transformers_generates_with_the_same_seed(pair, sampling):
    """The tokens are transformers' `generate`'s on the same weights with the same settings: its
    draws from torch's generator seeded as gpt2 documents a seed (helpers.transformers_sampled),
    or, greedy, its argmax; so the traced loop draws from the same stream as gpt2's `generate`."""
    hf, model = pair
    if sampling["temperature"] == 0:
        expected = transformers_greedy(hf, PROMPT, NEW)
    else:
        options = {name: value for name, value in sampling.items() if name != "seed"}
        expected = transformers_sampled(hf, PROMPT, NEW, sampling["seed"], **options)
    assert len(expected) == NEW  # no early end: a full comparison
    assert trace_generation(model, PROMPT, NEW, **sampling).new_ids == expected


def test_a_patch_applies_at_every_step(pair):
    """A patch (block 0's MLP ablated) applies to the prompt and to every new position: the
    activations are those of one trace of the whole text with the same patch, and the greedy
    tokens are that trace's most likely next tokens."""
    model = pair[1]
    patch = {"h.0.mlp.c_proj": torch.zeros_like}
    got = trace_generation(model, PROMPT, NEW, temperature=0, patch=patch)
    whole = trace(model, got.ids, patch=patch)
    assert_same_activations(got.activations, whole.activations)
    assert got.new_ids == whole.logits[len(PROMPT) - 1 : -1].argmax(-1).tolist()
    assert got.new_ids != trace_generation(model, PROMPT, NEW, temperature=0).new_ids  # the patch changed the text


def test_generation_stops_at_eos(pair):
    """With eos_token_id, generation stops after it, and the trace ends with it."""
    model = pair[1]
    first = trace_generation(model, PROMPT, NEW, temperature=0).new_ids
    stopped = trace_generation(model, PROMPT, NEW, temperature=0, eos_token_id=first[2])
    assert stopped.new_ids == first[: first.index(first[2]) + 1]
    assert len(stopped.logits) == len(stopped.ids) == stopped.activations["h.1"].size(0)


def test_a_generation_may_fill_the_context(pair):
    """A prompt and new tokens of exactly n_ctx positions: the last token's own pass included."""
    got = trace_generation(pair[1], list(range(CTX - 3)), 3, temperature=0)
    assert len(got.ids) == CTX and got.activations["h.1.attn.pattern"].shape == (N_HEAD, CTX, CTX)


@pytest.mark.parametrize(
    "args, kwargs, error, words",
    [
        ((PROMPT, 0), {}, InvalidArgumentError, ["max_new_tokens", "0"]),
        ((PROMPT, 1.5), {}, InvalidArgumentError, ["max_new_tokens", "1.5"]),
        ((list(range(28)), 5), {}, ContextLengthError, ["28 tokens", "5 new tokens", "n_ctx=32"]),
        ((list(range(33)), 1), {}, ContextLengthError, ["33", "32"]),
        ((PROMPT, 4), {"names": ["h.9"]}, InvalidArgumentError, ["'h.9'"]),
        ((PROMPT, 4), {"temperature": -1}, InvalidArgumentError, ["temperature"]),
        ((PROMPT, 4), {"top_k": 98}, InvalidArgumentError, ["top_k"]),
        ((PROMPT, 4), {"seed": -1}, InvalidArgumentError, ["seed"]),
    ],
)
def test_bad_input(pair, args, kwargs, error, words):
    with pytest.raises(error) as e:
        trace_generation(pair[1], *args, **kwargs)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_takes_a_gpt2_model():
    with pytest.raises(InputTypeError, match="trace_generation takes a GPT2 model"):
        trace_generation(object(), PROMPT, 4)


def test_a_traced_generation_records_the_new_steps_and_takes_prepend_bos(tmp_path):
    _, model = hf_and_ours(tmp_path, 0, vocab_size=50257, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    model.tokenizer = Tokenizer.gpt2()
    names = ["h.1.resid_mid", "h.0.attn.result", "h.1.ln_2.scale", "blocks.0.attn.hook_pattern"]
    generated = trace_generation(model, "The dog", 4, temperature=0, names=names, prepend_bos=True)
    assert generated.ids[0] == 50256 and generated.prompt_length == 3
    whole = trace(model, generated.ids, names=names)  # the whole text at once, no cache
    for name in ("h.1.resid_mid", "h.0.attn.result", "h.1.ln_2.scale", "h.0.attn.pattern"):
        assert (generated.activations[name] - whole.activations[name]).abs().max() < 1e-5, name
