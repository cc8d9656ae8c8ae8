"""gpt2.inspect: every step of a trace against the same step of transformers' GPT2LMHeadModel
(forward hooks on its modules, its eager attention's probabilities, its hidden states), patches
against the same patch made with a hook there, and the NumPy engine's own trace."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import hf_and_ours, transformer_lens_from_hf

from gpt2 import InputTypeError, InvalidArgumentError
from gpt2.checkpoints.config import GPT2Config
from gpt2.errors import ContextLengthError, TokenIdError
from gpt2.inspect.names import step_of
from gpt2.inspect.tracing import activation_names, logit_lens_top, next_token_report, trace
from gpt2.inspect.walkthrough import walkthrough
from gpt2.model.model import GPT2
from gpt2.model.pretrained import hf_state_dict
from gpt2.reference import ReferenceModel
from gpt2.tokenizer import Tokenizer

SHAPES = [  # (n_layer, n_head, n_embd, T)
    (2, 4, 32, 7),
    (3, 2, 48, 16),
    (1, 1, 16, 1),
]
TOL = 1e-4
TL_ONLY = (
    "resid_pre",
    "resid_mid",
    "attn.result",
    *(f"{ln}.{part}" for ln in ("ln_1", "ln_2", "ln_f") for part in ("scale", "normalized")),
)


def pair(tmp_path, n_layer: int, n_head: int, n_embd: int, seed: int = 0, vocab: int = 97):
    """transformers' model with eager attention and gpt2's, on the same random weights."""
    return hf_and_ours(
        tmp_path,
        seed,
        vocab_size=vocab,
        n_positions=32,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        attn_implementation="eager",
    )


def hf_activations(hf, ids: list[int], hooks: dict | None = None) -> tuple[dict[str, torch.Tensor], object]:
    """Each step of transformers' pass, by gpt2.inspect's name, the batch dimension dropped;
    `hooks` {module name: forward hook} changes its pass as a patch would."""
    acts: dict[str, torch.Tensor] = {}
    modules = dict(hf.named_modules())

    def keep(name: str):
        return lambda module, args, out: acts.__setitem__(name, (out[0] if isinstance(out, tuple) else out)[0].clone())

    handles = [
        modules["transformer.wte"].register_forward_hook(keep("wte")),
        modules["transformer.wpe"].register_forward_hook(keep("wpe")),
        modules["transformer.ln_f"].register_forward_hook(keep("ln_f")),
    ]
    for i in range(hf.config.n_layer):
        p = f"transformer.h.{i}"
        for step in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.act", "mlp.c_proj"):
            handles.append(modules[f"{p}.{step}"].register_forward_hook(keep(f"h.{i}.{step.replace('act', 'gelu')}")))
        handles.append(modules[p].register_forward_hook(keep(f"h.{i}")))
        # the heads' outputs side by side, as attn.c_proj receives them
        handles.append(
            modules[f"{p}.attn.c_proj"].register_forward_pre_hook(
                lambda module, args, i=i: acts.__setitem__(f"h.{i}.attn.z_merged", args[0][0].clone())
            )
        )
    for name, hook in (hooks or {}).items():
        handles.append(modules[name].register_forward_hook(hook))
    try:
        with torch.no_grad():
            out = hf(torch.tensor([ids]), output_attentions=True, output_hidden_states=True)
    finally:
        for h in handles:
            h.remove()
    for i, pattern in enumerate(out.attentions):
        acts[f"h.{i}.attn.pattern"] = pattern[0]
    return acts, out


def split_heads(x: torch.Tensor, n_head: int) -> torch.Tensor:
    """(T, C) -> (H, T, C/H)."""
    T, C = x.shape
    return x.view(T, n_head, C // n_head).transpose(0, 1)


def random_ids(T: int, vocab: int = 97, seed: int = 1) -> list[int]:
    return torch.randint(0, vocab, (T,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("n_layer,n_head,n_embd,T", SHAPES)
def test_every_step_equals_transformers(tmp_path, n_layer, n_head, n_embd, T):
    hf, model = pair(tmp_path, n_layer, n_head, n_embd)
    ids = random_ids(T)
    ours = trace(model, ids, names=activation_names(n_layer))
    theirs, out = hf_activations(hf, ids)
    assert (ours.logits - out.logits[0]).abs().max() < TOL
    compared = 0
    for name, value in theirs.items():
        if name.endswith("z_merged"):
            continue
        assert ours.activations[name].shape == value.shape, name
        assert (ours.activations[name] - value).abs().max() < TOL, name
        compared += 1
    for i in range(n_layer):  # the per-head steps, from transformers' fused projection
        q, k, v = (split_heads(part, n_head) for part in theirs[f"h.{i}.attn.c_attn"].split(n_embd, dim=-1))
        for part, expected in zip("qkv", (q, k, v)):
            assert (ours.activations[f"h.{i}.attn.{part}"] - expected).abs().max() < TOL
        scores = ours.activations[f"h.{i}.attn.scores"]
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        assert torch.isneginf(scores[:, future]).all()
        expected = (q @ k.transpose(-1, -2) / math.sqrt(n_embd // n_head))[:, ~future]
        assert (scores[:, ~future] - expected).abs().max() < TOL
        z = ours.activations[f"h.{i}.attn.z"]  # (H, T, d) -> (T, C), as c_proj receives it
        assert (z.transpose(0, 1).reshape(T, n_embd) - theirs[f"h.{i}.attn.z_merged"]).abs().max() < TOL
    assert compared == 2 + 9 * n_layer + 1  # wte, wpe, nine steps a block, ln_f
    assert set(ours.activations) == set(activation_names(n_layer))


@pytest.mark.parametrize("n_layer,n_head,n_embd,T", SHAPES)
def test_logit_lens_equals_transformers_hidden_states_read_out(tmp_path, n_layer, n_head, n_embd, T):
    hf, model = pair(tmp_path, n_layer, n_head, n_embd)
    ids = random_ids(T, seed=2)
    ours = trace(model, ids)
    _, out = hf_activations(hf, ids)
    probs, top_ids = logit_lens_top(ours)  # (L + 1, T): each layer's top token
    with torch.no_grad():
        for layer in range(n_layer + 1):  # transformers' hidden_states[layer] enters block `layer`
            # its last hidden state has ln_f applied already: the lens at n_layer is the logits
            expected = (
                hf.lm_head(hf.transformer.ln_f(out.hidden_states[layer]))[0] if layer < n_layer else out.logits[0]
            )
            assert (ours.logit_lens(layer) - expected).abs().max() < TOL, layer
            best = torch.softmax(expected, dim=-1).max(dim=-1)
            assert torch.equal(top_ids[layer], best.indices) and (probs[layer] - best.values).abs().max() < 1e-5, layer


def test_zeroing_an_mlp_equals_the_same_hook_in_transformers(tmp_path):
    hf, model = pair(tmp_path, 3, 4, 32)
    ids = random_ids(9)
    ours = trace(model, ids, patch={"h.1.mlp.c_proj": torch.zeros_like})
    theirs, out = hf_activations(
        hf, ids, {"transformer.h.1.mlp": lambda module, args, output: torch.zeros_like(output)}
    )
    plain = trace(model, ids)
    assert (ours.logits - out.logits[0]).abs().max() < TOL
    assert (ours.activations["h.2.attn.pattern"] - theirs["h.2.attn.pattern"]).abs().max() < TOL
    assert (ours.logits - plain.logits).abs().max() > 1e-2  # the patch changed the answer
    assert (ours.activations["h.1.mlp.c_proj"] == 0).all()  # the value recorded is the patched one


def test_zeroing_one_head_equals_the_same_hook_in_transformers(tmp_path):
    hf, model = pair(tmp_path, 2, 4, 32)
    ids, head, d = random_ids(8), 2, 8

    def zero_head(z: torch.Tensor) -> torch.Tensor:  # (H, T, d)
        z[head] = 0
        return z

    def zero_slice(module, args):  # c_proj's input (B, T, C): the heads side by side
        x = args[0].clone()
        x[..., head * d : (head + 1) * d] = 0
        return (x,)

    ours = trace(model, ids, patch={"h.0.attn.z": zero_head})
    modules = dict(hf.named_modules())
    handle = modules["transformer.h.0.attn.c_proj"].register_forward_pre_hook(zero_slice)
    try:
        with torch.no_grad():
            expected = hf(torch.tensor([ids])).logits[0]
    finally:
        handle.remove()
    assert (ours.logits - expected).abs().max() < TOL
    assert (ours.logits - trace(model, ids).logits).abs().max() > 1e-3


def test_patching_in_another_runs_activation_equals_transformers(tmp_path):
    hf, model = pair(tmp_path, 2, 2, 32)
    clean, corrupt = random_ids(6, seed=3), random_ids(6, seed=4)
    stream = trace(model, clean).activations["h.0"]  # (T, C)

    def at_position_3(x: torch.Tensor) -> torch.Tensor:
        x[3] = stream[3]
        return x

    ours = trace(model, corrupt, patch={"h.0": at_position_3})

    def hook(module, args, output):
        hidden = (output[0] if isinstance(output, tuple) else output).clone()
        hidden[0, 3] = stream[3]
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    _, out = hf_activations(hf, corrupt, {"transformer.h.0": hook})
    assert (ours.logits - out.logits[0]).abs().max() < TOL
    assert (ours.activations["h.0"][3] == stream[3]).all()


@pytest.mark.parametrize("variant", [{}, {"positions": "sinusoidal"}, {"activation": "gelu"}, {"bias": False}])
def test_numpy_engine_gives_the_same_trace(variant):
    torch.manual_seed(0)
    model = GPT2(GPT2Config(n_vocab=61, n_ctx=16, n_embd=24, n_head=3, n_layer=2, **variant)).eval()
    ids = random_ids(11, vocab=61)
    # the steps the NumPy engine names (the scales, each head's result and the stream's copies: against TransformerLens)
    written_out = [n for n in activation_names(2) if step_of(n) not in TL_ONLY]
    ours = trace(model, ids, names=written_out)
    reference = ReferenceModel(model.config, {k: v.numpy() for k, v in hf_state_dict(model).items()})
    logits, theirs = reference.trace(ids)
    assert set(theirs) == set(ours.activations)
    for name, value in theirs.items():
        mine = ours.activations[name].numpy()
        finite = np.isfinite(value)  # the scores' masked entries are -inf in both
        assert (np.isfinite(mine) == finite).all(), name
        assert np.abs(mine[finite] - value[finite]).max() < TOL, name
    assert np.abs(ours.logits.numpy() - logits).max() < TOL
    assert (ours.logits - model(torch.tensor([ids]))[0]).abs().max() < TOL  # and the model's own pass


def test_narrow_weights_trace_as_the_model_runs(tmp_path):
    _, model = pair(tmp_path, 2, 4, 32)
    int8 = GPT2.from_pretrained(tmp_path, device="cpu", dtype="int8")
    ids = random_ids(10)
    ours = trace(int8, ids)
    assert (ours.logits - int8(torch.tensor([ids]))[0]).abs().max() < TOL
    assert ours.logits.dtype == torch.float32


def test_names_records_only_what_was_asked(tmp_path):
    _, model = pair(tmp_path, 2, 4, 32)
    ids = random_ids(12)
    small = trace(model, ids, names=["h.1.attn.pattern", "ln_f"])
    assert set(small.activations) == {"h.1.attn.pattern", "ln_f"}
    assert (small.logits - trace(model, ids).logits).abs().max() == 0  # the same pass, less kept
    with pytest.raises(InvalidArgumentError, match=r"entering block 1 needs h\.0, which this trace did not record"):
        small.logit_lens(1)
    default = trace(model, ids).activations
    assert "h.0.attn.pattern" in default and "h.0.attn.q" not in default and "h.0.attn.scores" not in default


def test_text_goes_through_the_models_tokenizer(tmp_path, tiktoken_gpt2):
    _, model = pair(tmp_path, 1, 2, 16, vocab=50257)
    text = "Hello, world.<|endoftext|> It's 2026"  # its <|endoftext|> is characters, as ever
    t = trace(model, text)
    assert t.ids == tiktoken_gpt2.encode(text, disallowed_special=())
    assert t.tokens == [tiktoken_gpt2.decode([i]) for i in t.ids]


def test_next_token_report_equals_transformers_log_probabilities(tmp_path):
    hf, model = pair(tmp_path, 2, 4, 32)
    ids = random_ids(9)
    report = next_token_report(trace(model, ids), k=3)
    with torch.no_grad():
        logprobs = torch.log_softmax(hf(torch.tensor([ids])).logits[0], dim=-1)
    assert report["logprobs"][0] is None and report["ranks"][0] is None
    for t in range(1, len(ids)):
        assert abs(report["logprobs"][t] - logprobs[t - 1, ids[t]].item()) < TOL
        assert report["ranks"][t] == 1 + int((logprobs[t - 1] > logprobs[t - 1, ids[t]]).sum())
    for t in range(len(ids)):
        expected = logprobs[t].topk(3)
        assert [e["id"] for e in report["top"][t]] == expected.indices.tolist()
        assert max(abs(e["logprob"] - v) for e, v in zip(report["top"][t], expected.values.tolist())) < TOL


# ------------------------------------------------------------------ bad input


def test_bad_input_gets_one_clear_error(tmp_path):
    _, model = pair(tmp_path, 2, 2, 16)
    with pytest.raises(
        InvalidArgumentError,
        match=r"patch: unknown activation 'h\.2\.ln_1'; "
        r"the names are wte, wpe, h\.\{i\}\.resid_pre, .*h\.\{i\}\.ln_1, .*\(i in 0\.\.1\), ln_f",
    ) as e:
        trace(model, [1, 2], patch={"h.2.ln_1": torch.zeros_like})
    assert e.value.param == "patch"
    with pytest.raises(InvalidArgumentError, match=r"names: unknown activation 'attn'"):
        trace(model, [1, 2], names=["attn"])
    with pytest.raises(InputTypeError, match="names must be a collection of activation names, got the string 'ln_f'"):
        trace(model, [1, 2], names="ln_f")
    with pytest.raises(
        InvalidArgumentError, match=r"patch\['h\.0\.mlp\.gelu'\] must return a tensor of shape \[3, 64\], got \[3, 16\]"
    ):
        trace(model, [1, 2, 3], patch={"h.0.mlp.gelu": lambda x: x[:, :16]})
    with pytest.raises(
        InvalidArgumentError, match=r"patch\['ln_f'\] must return a tensor of shape \[2, 16\], got NoneType"
    ):
        trace(model, [1, 2], patch={"ln_f": lambda x: None})
    with pytest.raises(ContextLengthError, match="33 tokens is longer than the model's context of n_ctx=32"):
        trace(model, [1] * 33)
    with pytest.raises(InvalidArgumentError, match="the text is empty"):
        trace(model, [])
    with pytest.raises(TokenIdError, match="97"):
        trace(model, [1, 97])
    with pytest.raises(InvalidArgumentError, match="ids must be 1-D token ids"):
        trace(model, torch.tensor([[[1, 2]]]))
    with pytest.raises(InputTypeError, match="trace takes a GPT2 model, got str"):
        trace("gpt2", [1, 2])
    t = trace(model, [1, 2])
    for layer in (-1, 3, 1.0, True):
        with pytest.raises(InvalidArgumentError, match=r"layer must be a whole number in 0\.\.2"):
            t.logit_lens(layer)
    with pytest.raises(InvalidArgumentError, match="k must be a whole number in 1..97, got 0"):
        next_token_report(t, k=0)
    model.tokenizer = None
    with pytest.raises(InvalidArgumentError, match="this model has no tokenizer"):
        trace(model, "some text")


def test_import_gpt2_then_gpt2_inspect_trace(tmp_path):
    import subprocess
    import sys

    code = (
        "import gpt2, sys; assert 'torch' not in sys.modules; "
        "print(gpt2.inspect.trace.__name__, gpt2.inspect.Trace.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.split() == ["trace", "Trace"], out.stderr


# ------------------------------------------------------------------ batches, gradients, patches by name


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_each_prompt_of_a_padded_batch_equals_its_own_trace(tmp_path, padding_side):
    _, model = pair(tmp_path, 2, 3, 48)
    prompts = [random_ids(T, seed=T) for T in (5, 11, 1, 8)]
    every = activation_names(2)
    batch = trace(model, prompts, names=every, padding_side=padding_side)
    assert batch.batched and batch.logits.shape == (4, 11, 97)
    assert batch.attention_mask.sum(-1).tolist() == [5, 11, 1, 8]
    assert batch.attention_mask[0, 0 if padding_side == "right" else -1]  # the first prompt's tokens on its side
    for b, ids in enumerate(prompts):
        alone, row = trace(model, ids, names=every), batch.prompt(b)
        assert row.ids == ids
        assert (row.logits - alone.logits).abs().max() < 1e-5
        for name in every:
            mine, theirs = row.activations[name], alone.activations[name]
            assert mine.shape == theirs.shape, name
            finite = torch.isfinite(theirs)
            assert (torch.isfinite(mine) == finite).all(), name
            assert (mine[finite] - theirs[finite]).abs().max() < 1e-5, name
        assert int(batch.positions(-1)[b]) == (len(ids) - 1 if padding_side == "right" else 10)
    assert torch.isfinite(batch.logits).all()  # a pad's row stays finite


def test_a_batch_tensor_equals_each_row_and_patches_see_the_batch(tmp_path):
    _, model = pair(tmp_path, 2, 2, 32)
    ids = torch.randint(0, 97, (3, 7), generator=torch.Generator().manual_seed(2))
    seen = []

    def zero_head_1(z, name):  # TransformerLens's fn(x, hook) habit: the step's name second
        seen.append((name, tuple(z.shape)))
        z[:, 1] = 0
        return z

    batch = trace(model, ids, patch={"blocks.1.attn.hook_z": zero_head_1})
    assert batch.attention_mask.all() and seen == [("h.1.attn.z", (3, 2, 7, 16))]
    for b in range(3):
        alone = trace(model, ids[b], patch={"h.1.attn.z": lambda z: torch.cat([z[:1], torch.zeros_like(z[1:])])})
        assert (batch.logits[b] - alone.logits).abs().max() < 1e-5
    assert (batch.logits - trace(model, ids).logits).abs().max() > 1e-3  # the patch did something


def test_a_trace_with_grad_gives_each_steps_gradient(tmp_path):
    hf, model = pair(tmp_path, 2, 3, 48)
    tl = transformer_lens_from_hf(hf)
    ids = torch.randint(0, 97, (2, 6), generator=torch.Generator().manual_seed(3))
    t = trace(model, ids, names=["h.0", "h.1.attn.pattern", "wte"], grad=True)
    (t.logits[:, -1, 5] - t.logits[:, -1, 7]).sum().backward()
    grads = {}
    for hook in ("blocks.0.hook_resid_post", "blocks.1.attn.hook_pattern", "hook_embed"):
        tl.add_hook(hook, lambda g, hook: grads.__setitem__(hook.name, g.detach().clone()), dir="bwd")
    logits = tl(ids)
    (logits[:, -1, 5] - logits[:, -1, 7]).sum().backward()
    tl.reset_hooks()
    assert (t.activations["h.0"].grad - grads["blocks.0.hook_resid_post"]).abs().max() < 1e-5
    assert (t.activations["h.1.attn.pattern"].grad - grads["blocks.1.attn.hook_pattern"]).abs().max() < 1e-5
    assert (t.activations["wte"].grad - grads["hook_embed"]).abs().max() < 1e-5
    assert all(p.grad is None for p in model.parameters())  # the weights are not touched
    assert all(p.requires_grad for p in model.parameters())  # and left as they were
    assert trace(model, ids[0], names=["h.0"]).activations["h.0"].grad_fn is None  # off by default


def test_prepend_bos_puts_endoftext_before_the_text(tiktoken_gpt2):
    model = GPT2(GPT2Config(n_vocab=50257, n_ctx=32, n_embd=16, n_head=2, n_layer=1)).eval()
    model.tokenizer = Tokenizer.gpt2()
    text = "The dog chased the"
    assert trace(model, text).ids == tiktoken_gpt2.encode(text)  # gpt2's default: the text as given
    assert trace(model, text, prepend_bos=True).ids == [50256, *tiktoken_gpt2.encode(text)]  # TransformerLens's
    batch = trace(model, [text, "A cat"], prepend_bos=True, padding_side="left")
    assert batch.prompt(1).ids == [50256, *tiktoken_gpt2.encode("A cat")]
    assert trace(model, [1, 2], prepend_bos=True).ids == [1, 2]  # ids run as given
    with pytest.raises(InvalidArgumentError, match="padding_side must be right or left, got 'top'"):
        trace(model, [text, text], padding_side="top")
    with pytest.raises(TokenIdError, match=r"ids\[1\]: .*50257"):
        trace(model, [[1, 2], [3, 50257]])
    with pytest.raises(InvalidArgumentError, match=r"walkthrough reads one sequence's trace: give one row"):
        walkthrough(batch)
