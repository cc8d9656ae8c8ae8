"""GPT2Config: the released sizes, invalid settings, Hugging Face's config.json."""

from __future__ import annotations

import json

import pytest

from gpt2 import ConfigError
from gpt2.checkpoints.config import GPT2Config


def test_released_presets():
    assert [
        (c.n_layer, c.n_head, c.n_embd)
        for c in map(GPT2Config.from_name, ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"])
    ] == [
        (12, 12, 768),
        (24, 16, 1024),
        (36, 20, 1280),
        (48, 25, 1600),
    ]
    for name in ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"]:
        config = GPT2Config.from_name(name)
        assert (config.n_ctx, config.n_vocab) == (1024, 50257)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(n_embd=100, n_head=12), "n_embd \\(100\\) must be divisible by n_head \\(12\\)"),
        (dict(n_layer=0), "n_layer must be a positive integer, got 0"),
        (dict(n_vocab=-5), "n_vocab must be a positive integer, got -5"),
        (dict(n_ctx=1.5), "n_ctx must be a positive integer"),
        (dict(positions="rotary"), "positions must be one of learned, sinusoidal; got 'rotary'"),
        (dict(activation="relu"), "activation must be one of gelu_tanh, gelu; got 'relu'"),
        (dict(dropout=1.0), "dropout must be in \\[0, 1\\)"),
        (dict(bias="yes"), "bias must be True or False"),
    ],
)
def test_invalid_configs(changes, message):
    with pytest.raises(ConfigError, match=message):
        GPT2Config(**changes)


def test_unknown_preset_lists_the_names():
    with pytest.raises(Exception, match="gpt2, gpt2-medium, gpt2-large, gpt2-xl"):
        GPT2Config.from_name("gpt3")


def test_hf_config_reads_and_writes_what_transformers_does(tmp_path):
    """Read: a config.json that transformers wrote. Written: transformers reads our settings from
    ours, and keeps our own keys (sinusoidal positions, no bias) when it writes the file again."""
    import transformers

    hf = transformers.GPT2Config(
        vocab_size=1000,
        n_positions=64,
        n_embd=32,
        n_head=4,
        n_layer=2,
        activation_function="gelu",
        resid_pdrop=0.2,
        embd_pdrop=0.2,
        attn_pdrop=0.2,
        layer_norm_epsilon=1e-6,
    )
    hf.save_pretrained(tmp_path / "theirs")
    ours = GPT2Config.from_hf_dict(json.loads((tmp_path / "theirs" / "config.json").read_text()))
    assert ours == GPT2Config(
        n_vocab=1000, n_ctx=64, n_embd=32, n_head=4, n_layer=2, activation="gelu", dropout=0.2, layer_norm_epsilon=1e-6
    )
    config = ours.replace(positions="sinusoidal", bias=False)
    read = transformers.GPT2Config.from_dict(config.to_hf_dict(eot_token=999))
    assert (read.vocab_size, read.n_positions, read.n_embd, read.n_head, read.n_layer, read.n_inner) == (
        1000,
        64,
        32,
        4,
        2,
        None,
    )
    assert (read.activation_function, read.resid_pdrop, read.embd_pdrop, read.attn_pdrop) == ("gelu", 0.2, 0.2, 0.2)
    assert (read.layer_norm_epsilon, read.bos_token_id, read.eos_token_id, read.tie_word_embeddings) == (
        1e-6,
        999,
        999,
        True,
    )
    read.save_pretrained(tmp_path / "again")
    assert GPT2Config.from_hf_dict(json.loads((tmp_path / "again" / "config.json").read_text())) == config


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("n_positions", -1, "config.json: n_positions must be a positive integer, got -1"),
        ("n_positions", "1024", "config.json: n_positions must be a positive integer, got '1024'"),
        ("vocab_size", 0, "config.json: vocab_size must be a positive integer, got 0"),
        ("resid_pdrop", 1.5, "config.json: resid_pdrop must be in \\[0, 1\\)"),
        ("n_layer", 0, "config.json: n_layer must be a positive integer, got 0"),
        ("gpt2_positions", "rotary", "config.json: gpt2_positions must be one of learned, sinusoidal"),
    ],
)
def test_a_bad_hf_config_names_its_own_key(key, value, message):
    """config.json's keys are Hugging Face's: an error names the key the user finds in the file."""
    hf = {**GPT2Config(n_vocab=100, n_ctx=16, n_embd=8, n_head=2, n_layer=1).to_hf_dict(), key: value}
    with pytest.raises(ConfigError, match=message):
        GPT2Config.from_hf_dict(hf)


def test_an_old_config_with_n_ctx_alone_names_n_ctx():
    hf = {"model_type": "gpt2", "n_ctx": 0}
    with pytest.raises(ConfigError, match="config.json: n_ctx must be a positive integer, got 0"):
        GPT2Config.from_hf_dict(hf)
