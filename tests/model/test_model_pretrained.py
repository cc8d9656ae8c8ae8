"""A model's files (gpt2.model.pretrained): what `GPT2.save_pretrained` writes, transformers loads, and
`GPT2.from_pretrained` loads back, tensor for tensor; saving is atomic; a tokenizer goes along."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import logits_of, make_hf_model, nanogpt_model
from safetensors.torch import load_file, save_file

from gpt2 import InvalidArgumentError
from gpt2.checkpoints.config import GPT2Config
from gpt2.checkpoints.weights import read_tensors
from gpt2.model.model import GPT2
from gpt2.model.pretrained import hf_state_dict
from gpt2.reference import ReferenceModel

TINY = dict(vocab_size=101, n_positions=24, n_embd=48, n_layer=3, n_head=3)
TOLERANCE = 1e-4  # max absolute difference of fp32 logits


def max_diff(a, b) -> float:
    return float((torch.as_tensor(a) - torch.as_tensor(b)).abs().max())


IDX = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(3))


# ------------------------------------------------------------------ loading


def test_every_parameter_comes_from_the_file(hf_dir):
    model = GPT2.from_pretrained(hf_dir, device="cpu")
    assert not any(p.device.type == "meta" for p in model.parameters())
    assert not any(b.device.type == "meta" for b in model.buffers())
    saved = load_file(hf_dir / "model.safetensors")
    ours = hf_state_dict(model)
    assert set(ours) == {k for k in saved if k != "lm_head.weight"}
    for name, tensor in ours.items():
        assert torch.equal(tensor, saved[name]), name


# ------------------------------------------------------------------ saving what transformers loads, and back


def test_we_save_what_transformers_loads_and_back(hf_dir, hf_small, tmp_path):
    from transformers import GPT2LMHeadModel

    ours = GPT2.from_pretrained(hf_dir, device="cpu")
    ours.save_pretrained(tmp_path / "ours")
    assert sorted(p.name for p in (tmp_path / "ours").iterdir()) == ["config.json", "model.safetensors"]
    theirs = GPT2LMHeadModel.from_pretrained(tmp_path / "ours").eval()
    assert (logits_of(theirs, IDX) - logits_of(hf_small, IDX)).abs().max() == 0
    again = GPT2.from_pretrained(tmp_path / "ours", device="cpu")
    assert (logits_of(again, IDX) - logits_of(ours, IDX)).abs().max() == 0


def test_the_zero_biases_and_position_table_saved_for_transformers_read_back(tmp_path):
    from transformers import GPT2LMHeadModel

    model = nanogpt_model()
    model.save_pretrained(tmp_path / "ours")
    assert "transformer.h.0.mlp.c_fc.bias" in load_file(tmp_path / "ours" / "model.safetensors")
    config, tensors = read_tensors(tmp_path / "ours")
    assert set(tensors) == set(hf_state_dict(model))  # what the model has, no more
    # transformers' own copy (it saves every bias and wpe), and bfloat16 ones, read back too: a CPU model's
    # (narrow matrices only) and one all in bfloat16, the table included, as a GPU model's
    GPT2LMHeadModel.from_pretrained(tmp_path / "ours").save_pretrained(tmp_path / "theirs")
    GPT2.from_pretrained(tmp_path / "ours", device="cpu", dtype="bfloat16").save_pretrained(tmp_path / "bf16")
    (tmp_path / "all-bf16").mkdir()
    (tmp_path / "all-bf16" / "config.json").write_bytes((tmp_path / "ours" / "config.json").read_bytes())
    narrow = {k: v.to(torch.bfloat16) for k, v in load_file(tmp_path / "ours" / "model.safetensors").items()}
    save_file(narrow, tmp_path / "all-bf16" / "model.safetensors")
    expected = logits_of(model, IDX)
    for name, tolerance in (("ours", 0), ("theirs", 0), ("bf16", 0.1), ("all-bf16", 0.1)):
        loaded = GPT2.from_pretrained(tmp_path / name, device="cpu")
        assert loaded.config == model.config and set(hf_state_dict(loaded)) == set(tensors)
        assert (logits_of(loaded, IDX) - expected).abs().max() <= tolerance, name
        assert np.abs(ReferenceModel.load(tmp_path / name)(IDX[0].numpy()) - expected[0].numpy()).max() < max(
            tolerance, 1e-4
        )


@pytest.mark.parametrize(
    "options",
    [dict(bias=False), dict(positions="sinusoidal"), dict(bias=False, positions="sinusoidal", activation="gelu")],
    ids=["nobias", "sinusoidal", "all"],
)
def test_transformers_loads_every_option_with_nothing_newly_initialised(options, tmp_path):
    """transformers' GPT-2 has biases and a learned wpe only: we save zeros and the fixed table there."""
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2(GPT2Config(n_vocab=90, n_ctx=20, n_embd=24, n_head=3, n_layer=2, **options)).eval()
    with torch.no_grad():  # off their initial values (LayerNorms at 1), so that a weight left behind shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(tmp_path)
    theirs, info = GPT2LMHeadModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info.values()), info  # nothing missing (newly initialised), unexpected or mismatched
    idx = torch.randint(0, 90, (2, 20))
    with torch.no_grad():
        assert max_diff(theirs.eval()(idx).logits, model(idx)) < TOLERANCE


@pytest.mark.parametrize(
    "vocabulary, n_vocab, files, eos",
    [
        (
            "gpt2",
            50257,
            ["merges.txt", "tokenizer.json", "tokenizer_config.json", "vocab.json"],
            50256,
        ),  # GPT-2's, assumed
        (
            "padded",
            50304,
            ["merges.txt", "tokenizer.json", "tokenizer_config.json", "vocab.json"],
            50256,
        ),  # nanoGPT's 50304
        ("char", 3, ["chars.json", "tokenizer.json", "tokenizer_config.json"], None),
        ("unknown", 101, [], None),
    ],
)
def test_save_pretrained_writes_the_tokenizer_and_its_end_of_text_id(vocabulary, n_vocab, files, eos, tmp_path):
    from transformers import GPT2LMHeadModel

    from gpt2 import Tokenizer
    from gpt2.tokenizer import CharTokenizer

    model = GPT2(GPT2Config(n_vocab=n_vocab, n_ctx=8, n_embd=8, n_head=2, n_layer=1))
    model.tokenizer = {"padded": Tokenizer.gpt2(), "char": CharTokenizer(list("abc"))}.get(vocabulary)
    model.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["config.json", "model.safetensors", *files])
    # transformers' generate stops at eos: <|endoftext|>, never the last id (an ordinary character, or padding)
    theirs = GPT2LMHeadModel.from_pretrained(tmp_path)
    assert theirs.config.eos_token_id == theirs.config.bos_token_id == theirs.generation_config.eos_token_id == eos


@pytest.mark.parametrize("vocabulary", ["gpt2", "char"])
def test_transformers_pipeline_generates_what_we_generate(vocabulary, tmp_path):
    """A saved model and its tokenizer, in transformers: AutoModelForCausalLM + AutoTokenizer + the
    text-generation pipeline, greedy, give our greedy text (nanoGPT's choices: no biases; sinusoidal too)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    from gpt2 import Tokenizer
    from gpt2.generation.generate import generate_text
    from gpt2.tokenizer import CharTokenizer

    tokenizer = (
        Tokenizer.gpt2() if vocabulary == "gpt2" else CharTokenizer.from_text("abcdefghijklmnopqrstuvwxyz ,.!?'\n")
    )
    positions = "sinusoidal" if vocabulary == "gpt2" else "learned"
    torch.manual_seed(0)
    model = GPT2(
        GPT2Config(n_vocab=tokenizer.n_vocab, n_ctx=48, n_embd=32, n_head=2, n_layer=2, bias=False, positions=positions)
    )
    with torch.no_grad():  # away from the initial weights, whose greedy text is one token over and over
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    model.tokenizer = tokenizer
    model.save_pretrained(tmp_path)
    generator = pipeline(
        "text-generation",
        model=AutoModelForCausalLM.from_pretrained(tmp_path),
        tokenizer=AutoTokenizer.from_pretrained(tmp_path),
    )
    prompt = "hello, world. it's a"
    theirs = generator(prompt, max_new_tokens=24, do_sample=False)[0]["generated_text"]
    loaded = GPT2.from_pretrained(tmp_path, device="cpu")
    ours = generate_text(loaded, loaded.tokenizer, prompt, max_new_tokens=24, temperature=0)[0]
    assert theirs == prompt + ours
    assert len(set(loaded.tokenizer.encode(ours))) > 3  # not one token over and over


# ------------------------------------------------------------------ dtypes, and atomic saving


def test_a_bfloat16_cpu_model_saves_in_the_checkpoint_layout(tmp_path):
    hf = make_hf_model(**TINY)
    hf.save_pretrained(tmp_path)
    GPT2.from_pretrained(tmp_path, device="cpu", dtype="bfloat16").save_pretrained(tmp_path / "out")
    saved, original = load_file(tmp_path / "out" / "model.safetensors"), hf.state_dict()
    name = "transformer.h.0.attn.c_attn.weight"  # (in, out) as Conv1D holds it, though the model stores it (out, in)
    assert saved[name].dtype == torch.bfloat16 and torch.equal(saved[name], original[name].to(torch.bfloat16))
    assert torch.equal(saved["transformer.h.0.ln_1.weight"], original["transformer.h.0.ln_1.weight"])


def test_save_overwrites_and_keeps_dtype(hf_dir, tmp_path):
    model = GPT2.from_pretrained(hf_dir, device="cpu", dtype="bfloat16")
    model.save_pretrained(tmp_path / "ckpt")
    model.save_pretrained(tmp_path / "ckpt")
    assert load_file(tmp_path / "ckpt" / "model.safetensors")["transformer.wte.weight"].dtype == torch.bfloat16
    assert GPT2.from_pretrained(tmp_path / "ckpt", device="cpu", dtype="bfloat16").dtype == torch.bfloat16


def test_an_int8_model_is_not_saved(tmp_path):
    make_hf_model(**TINY).save_pretrained(tmp_path)
    model = GPT2.from_pretrained(tmp_path, device="cpu", dtype="int8")
    with pytest.raises(InvalidArgumentError, match="an int8 model is not saved: its weights were quantised"):
        model.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_failed_save_leaves_the_old_checkpoint_intact(hf_dir, tmp_path, monkeypatch):
    model = GPT2.from_pretrained(hf_dir, device="cpu")
    model.save_pretrained(tmp_path / "ckpt")
    before = (tmp_path / "ckpt" / "model.safetensors").read_bytes()

    def crash(tensors, path, metadata=None):
        Path(path).write_bytes(b"half a file")
        raise KeyboardInterrupt  # e.g. Ctrl-C in the middle of writing

    monkeypatch.setattr("gpt2.model.pretrained.save_file", crash)
    with torch.no_grad():
        model.transformer.wte.weight.add_(1.0)
    with pytest.raises(KeyboardInterrupt):
        model.save_pretrained(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["config.json", "model.safetensors"]
