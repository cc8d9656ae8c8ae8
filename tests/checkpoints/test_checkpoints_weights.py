"""Reading weights in every format, and every way a checkpoint can be wrong (saving: test_model_pretrained.py)."""

from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest
import torch
from helpers import REPO, logits_of, make_hf_model, nanogpt_model
from safetensors.torch import load_file, save_file

from gpt2 import CheckpointError, CheckpointNotFoundError, ConfigError, InputTypeError, Tokenizer, UnknownModelError
from gpt2.checkpoints.config import GPT2Config
from gpt2.checkpoints.weights import locate, read_tensors
from gpt2.model.model import GPT2
from gpt2.reference import ReferenceModel

TF_FIXTURE = REPO / "tests" / "fixtures" / "tf_gpt2_tiny"


IDX = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(3))


# ------------------------------------------------------------------ the routes


def test_pytorch_model_bin_route(hf_small, tmp_path):
    # transformers' legacy format: the state dict pickled by torch.save, beside config.json
    hf_small.config.save_pretrained(tmp_path)
    torch.save(hf_small.state_dict(), tmp_path / "pytorch_model.bin")
    assert locate(tmp_path).format == "pytorch"
    ours = GPT2.from_pretrained(tmp_path, device="cpu")
    assert (logits_of(ours, IDX) - logits_of(hf_small, IDX)).abs().max() < 1e-4
    assert np.abs(ReferenceModel.load(tmp_path)(IDX[0].numpy()) - logits_of(hf_small, IDX)[0].numpy()).max() < 1e-4


def test_changing_a_model_loaded_from_pytorch_model_bin_never_changes_the_file(hf_small, tmp_path):
    # its tensors are mapped from the file copy-on-write: training must not write through
    hf_small.config.save_pretrained(tmp_path)
    torch.save(hf_small.state_dict(), tmp_path / "pytorch_model.bin")
    before = (tmp_path / "pytorch_model.bin").read_bytes()
    model = GPT2.from_pretrained(tmp_path, device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    del model
    assert (tmp_path / "pytorch_model.bin").read_bytes() == before
    again = GPT2.from_pretrained(tmp_path, device="cpu")
    assert (logits_of(again, IDX) - logits_of(hf_small, IDX)).abs().max() < 1e-4


def test_safetensors_without_transformer_prefix(hf_small, tmp_path):
    # the hub's openai-community/gpt2 file names tensors "h.0.attn.c_attn.weight", "wte.weight", ...
    tensors = {
        k.removeprefix("transformer."): v.contiguous()
        for k, v in hf_small.state_dict().items()
        if k != "lm_head.weight"
    }
    save_file(tensors, tmp_path / "model.safetensors")
    hf_small.config.save_pretrained(tmp_path)
    ours = GPT2.from_pretrained(tmp_path, device="cpu")
    assert (logits_of(ours, IDX) - logits_of(hf_small, IDX)).abs().max() < 1e-4


def test_tensorflow_release_route():
    """OpenAI's original TF checkpoint (a tiny one written by real TensorFlow) against transformers."""
    from transformers import GPT2Config as HFConfig
    from transformers import GPT2LMHeadModel

    hparams = json.loads((TF_FIXTURE / "hparams.json").read_text())
    expected = np.load(TF_FIXTURE / "expected.npz")  # the arrays TensorFlow was given
    hf = GPT2LMHeadModel(
        HFConfig(
            vocab_size=hparams["n_vocab"],
            n_positions=hparams["n_ctx"],
            n_embd=hparams["n_embd"],
            n_layer=hparams["n_layer"],
            n_head=hparams["n_head"],
        )
    ).eval()
    state = {}
    for name in expected.files:  # an independent mapping: TF name -> transformers name, by hand
        key = name.removeprefix("model/").replace("/", ".")
        for tf_suffix, hf_suffix in ((".g", ".weight"), (".b", ".bias"), (".w", ".weight")):
            if key.endswith(tf_suffix):
                key = key[: -len(tf_suffix)] + hf_suffix
        key = key.replace("wte", "wte.weight").replace("wpe", "wpe.weight")
        key = "transformer." + (key.replace("h", "h.", 1) if key.startswith("h") else key)
        array = expected[name]
        state[key] = torch.from_numpy(array[0] if array.ndim == 3 else array)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert unexpected == [] and [m for m in missing if "lm_head" not in m] == []
    hf.tie_weights()

    ours = GPT2.from_pretrained(TF_FIXTURE, device="cpu")
    assert ours.config == GPT2Config.from_openai_hparams(hparams)
    idx = torch.randint(0, hparams["n_vocab"], (2, hparams["n_ctx"]), generator=torch.Generator().manual_seed(4))
    expected_logits = logits_of(hf, idx)
    assert (logits_of(ours, idx) - expected_logits).abs().max() < 1e-4
    reference = ReferenceModel.load(TF_FIXTURE)
    assert np.abs(reference(idx[1].numpy()) - expected_logits[1].numpy()).max() < 1e-4


def test_read_tensors_is_float32_and_canonical(hf_dir):
    config, tensors = read_tensors(hf_dir)
    assert config.n_embd == 48
    assert tensors["transformer.h.0.attn.c_attn.weight"].shape == (48, 144)  # (in, out)
    assert all(t.dtype == np.float32 for t in tensors.values())


# ------------------------------------------------------------------ names and the hub


def test_unknown_model_name_lists_the_released_ones():
    with pytest.raises(UnknownModelError, match="unknown model 'gpt-3'.*gpt2, gpt2-medium, gpt2-large, gpt2-xl"):
        GPT2.from_pretrained("gpt-3")


def test_a_model_that_is_not_a_name_or_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # '' would be the current directory, were it read as a path
    for load in (GPT2.from_pretrained, ReferenceModel.load, locate):
        with pytest.raises(
            InputTypeError, match="a model is a released name \\(gpt2, .*\\) or a directory path, got NoneType"
        ):
            load(None)
        with pytest.raises(UnknownModelError, match="the model name is empty: give a released name"):
            load("")


def test_released_name_offline_says_how_to_pass_a_path(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    start = time.monotonic()
    with pytest.raises(
        CheckpointNotFoundError,
        match="could not download .gpt2.*pass a local directory.*or shakespeare_char, the small model gpt2 ships",
    ):
        GPT2.from_pretrained("gpt2")
    assert time.monotonic() - start < 20  # no network retries


# ------------------------------------------------------------------ damaged checkpoints


def test_missing_and_empty_directories(tmp_path):
    with pytest.raises(UnknownModelError):
        GPT2.from_pretrained(tmp_path / "nowhere")
    with pytest.raises(CheckpointNotFoundError, match="holds no GPT-2 checkpoint"):
        GPT2.from_pretrained(tmp_path)


def test_config_without_weights(hf_dir):
    (hf_dir / "model.safetensors").unlink()
    with pytest.raises(
        CheckpointNotFoundError, match="has config.json but neither model.safetensors nor pytorch_model.bin"
    ):
        GPT2.from_pretrained(hf_dir)


def test_file_instead_of_directory(hf_dir):
    with pytest.raises(CheckpointError, match="is a file; pass the directory"):
        GPT2.from_pretrained(hf_dir / "model.safetensors")


def test_truncated_safetensors(hf_dir):
    data = (hf_dir / "model.safetensors").read_bytes()
    (hf_dir / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors is truncated or corrupt"):
        GPT2.from_pretrained(hf_dir)


def test_truncated_pytorch_bin(hf_small, tmp_path):
    hf_small.config.save_pretrained(tmp_path)
    torch.save(hf_small.state_dict(), tmp_path / "pytorch_model.bin")
    data = (tmp_path / "pytorch_model.bin").read_bytes()
    (tmp_path / "pytorch_model.bin").write_bytes(data[: len(data) // 3])
    with pytest.raises(CheckpointError, match="pytorch_model.bin is truncated or corrupt"):
        GPT2.from_pretrained(tmp_path)


def test_corrupt_config_json(hf_dir):
    (hf_dir / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="config.json is not valid JSON"):
        GPT2.from_pretrained(hf_dir)


def test_config_that_does_not_fit_the_tensors(hf_dir):
    config = json.loads((hf_dir / "config.json").read_text())
    config["n_embd"] = 60  # the tensors are 48 wide
    (hf_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        CheckpointError,
        match="tensor 'transformer.h.0.attn.c_attn.bias' has shape \\[144\\], "
        "but the config \\(.*n_embd=60.*\\) needs \\[180\\]",
    ):
        GPT2.from_pretrained(hf_dir)


def test_missing_tensor(hf_dir):
    tensors = load_file(hf_dir / "model.safetensors")
    del tensors["transformer.h.1.mlp.c_fc.bias"]
    save_file(tensors, hf_dir / "model.safetensors")
    with pytest.raises(CheckpointError, match="lacks tensor\\(s\\) transformer.h.1.mlp.c_fc.bias"):
        GPT2.from_pretrained(hf_dir)


def test_unexpected_tensor(hf_dir):
    tensors = load_file(hf_dir / "model.safetensors")
    tensors["transformer.h.0.attn.q_norm.weight"] = torch.ones(48)
    save_file(tensors, hf_dir / "model.safetensors")
    with pytest.raises(CheckpointError, match="unexpected tensor 'transformer.h.0.attn.q_norm.weight'"):
        GPT2.from_pretrained(hf_dir)


def test_unsupported_hf_options(hf_dir):
    config = json.loads((hf_dir / "config.json").read_text())
    config["activation_function"] = "relu"
    (hf_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="activation_function 'relu' is not supported"):
        GPT2.from_pretrained(hf_dir)


# ------------------------------------------------------------------ what the config says, and the tokenizer


def test_a_trained_bias_or_position_table_the_config_lacks_is_an_error_naming_it(tmp_path):
    nanogpt_model().save_pretrained(tmp_path)
    original = load_file(tmp_path / "model.safetensors")
    bias = original["transformer.h.1.attn.c_attn.bias"].clone()
    bias[5] = 0.01  # e.g. fine-tuned in transformers, config.json left as it was
    save_file({**original, "transformer.h.1.attn.c_attn.bias": bias}, tmp_path / "model.safetensors")
    message = "tensor 'transformer.h.1.attn.c_attn.bias' is not zero, but config.json's \"gpt2_bias\": false says"
    for load in (lambda: GPT2.from_pretrained(tmp_path, device="cpu"), lambda: ReferenceModel.load(tmp_path)):
        with pytest.raises(CheckpointError, match=re.escape(message)):
            load()
    save_file(
        {**original, "transformer.wpe.weight": original["transformer.wpe.weight"] + 0.05},
        tmp_path / "model.safetensors",
    )
    message = (
        "tensor 'transformer.wpe.weight' is not the sinusoidal position table that config.json's \"gpt2_positions\""
    )
    for load in (lambda: GPT2.from_pretrained(tmp_path, device="cpu"), lambda: ReferenceModel.load(tmp_path)):
        with pytest.raises(CheckpointError, match=re.escape(message)):
            load()


def test_a_checkpoint_comes_with_its_tokenizer(tmp_path):
    from gpt2.tokenizer import CharTokenizer

    # GPT-2's vocabulary and no tokenizer files: GPT-2's tokenizer
    make_hf_model(vocab_size=50257, n_positions=8, n_embd=16, n_layer=1, n_head=2).save_pretrained(tmp_path / "bpe")
    assert GPT2.from_pretrained(tmp_path / "bpe", device="cpu").tokenizer is Tokenizer.gpt2()
    # another vocabulary and no files: none, and the command line says so
    make_hf_model(vocab_size=65, n_positions=8, n_embd=16, n_layer=1, n_head=2).save_pretrained(tmp_path / "char")
    assert GPT2.from_pretrained(tmp_path / "char", device="cpu").tokenizer is None
    from gpt2.cli import main

    assert main(["generate", "--model", str(tmp_path / "char"), "hi"]) == 2
    # a character vocabulary saved beside the weights travels with the model
    chars = CharTokenizer([chr(c) for c in range(32, 97)])
    chars.save(tmp_path / "char")
    model = GPT2.from_pretrained(tmp_path / "char", device="cpu")
    assert model.tokenizer.__getstate__() == chars.__getstate__()
    model.save_pretrained(tmp_path / "copy")
    assert GPT2.from_pretrained(tmp_path / "copy", device="cpu").tokenizer.decode([33, 34]) == "AB"
    # a tokenizer larger than the model's vocabulary is refused
    CharTokenizer([chr(c) for c in range(32, 132)]).save(tmp_path / "char")
    with pytest.raises(CheckpointError, match="the tokenizer has 100 ids, more than the model's vocabulary of 65"):
        GPT2.from_pretrained(tmp_path / "char", device="cpu")
