"""Dictionaries trained here (gpt2.inspect.dictionaries): SAELens's losses and their gradients
against SAELens's own training SAEs on the same weights, and the saves read back by SAELens, by
gpt2's loaders, and in circuit-tracer's layout as circuit-tracer's math reads it."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import circuit_tracer_forward
from safetensors.torch import load_file

from gpt2 import GPT2Error
from gpt2.inspect import load_sae, load_transcoders
from gpt2.inspect.dictionaries import Dictionary, DictionaryConfig, save_circuit_tracer, save_saelens

D_IN, D_DICT = 16, 48
SETTINGS = {
    "standard": dict(l1_coefficient=5.0),
    "jumprelu": dict(l0_coefficient=0.5, jumprelu_init_threshold=0.05, jumprelu_bandwidth=0.05),
    "topk": dict(k=4, aux_loss_coefficient=1.0),
}


def saelens_twin(architecture: str, seed: int = 0):
    """SAELens's training SAE of `architecture` with random weights, and gpt2's Dictionary holding them."""
    import sae_lens

    classes = {
        "standard": (sae_lens.StandardTrainingSAE, sae_lens.StandardTrainingSAEConfig),
        "jumprelu": (sae_lens.JumpReLUTrainingSAE, sae_lens.JumpReLUTrainingSAEConfig),
        "topk": (sae_lens.TopKTrainingSAE, sae_lens.TopKTrainingSAEConfig),
    }
    cls, config = classes[architecture]
    extra = {"rescale_acts_by_decoder_norm": False} if architecture == "topk" else {}
    ref = cls(config(d_in=D_IN, d_sae=D_DICT, **SETTINGS[architecture], **extra))
    ours = Dictionary(DictionaryConfig(architecture, d_in=D_IN, d_dict=D_DICT, **SETTINGS[architecture]))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
            getattr(ref, name).copy_(torch.randn(getattr(ref, name).shape, generator=g) * 0.3)
            getattr(ours, name).copy_(getattr(ref, name))
        if architecture == "jumprelu":
            ref.threshold.copy_(torch.rand(D_DICT, generator=g) * 0.3)
            ours.threshold.copy_(ref.threshold)
    return ref, ours


@pytest.mark.parametrize("architecture", ["standard", "jumprelu", "topk"])
def test_losses_and_gradients_are_saelens(architecture):
    from sae_lens.saes.sae import TrainStepInput

    ref, ours = saelens_twin(architecture)
    x = torch.randn(64, D_IN, generator=torch.Generator().manual_seed(1))
    dead = torch.rand(D_DICT, generator=torch.Generator().manual_seed(2)) > 0.5
    step = TrainStepInput(
        sae_in=x, coefficients={"l1": 5.0, "l0": 0.5}, dead_neuron_mask=dead, n_training_steps=0, is_logging_step=False
    )
    expected = ref.training_forward_pass(step)
    got = ours.losses(x, x, dead)
    for name, value in expected.losses.items():
        assert abs(got[name].item() - value.item()) <= 1e-5 * max(1.0, abs(value.item())), name
        assert value.item() > 0  # every term is exercised (the aux loss needs dead features)
    assert torch.equal(got["fired"], (expected.feature_acts != 0).any(0))
    expected.loss.backward()
    got["loss"].backward()
    for name, p in ref.named_parameters():
        torch.testing.assert_close(getattr(ours, name).grad, p.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("architecture", ["standard", "jumprelu", "topk"])
def test_sae_saved_loads_in_saelens_and_gpt2(tmp_path, architecture):
    from sae_lens import SAE

    _, ours = saelens_twin(architecture, seed=3)
    save_saelens(ours, tmp_path / "sae", "blocks.1.hook_resid_mid", metadata={"training_data": "d"})
    theirs = SAE.load_from_disk(str(tmp_path / "sae"), device="cpu")
    mine = load_sae(tmp_path / "sae")
    x = torch.randn(20, D_IN, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(theirs.encode(x), ours.encode(x), atol=1e-5, rtol=0)
        torch.testing.assert_close(theirs(x), ours(x), atol=1e-5, rtol=0)
        torch.testing.assert_close(mine.encode(x), ours.encode(x), atol=1e-5, rtol=0)
    assert mine.hook_name == "blocks.1.hook_resid_mid"
    cfg = json.loads((tmp_path / "sae" / "cfg.json").read_text())
    assert cfg["architecture"] == architecture and cfg["metadata"]["training_data"] == "d"


@pytest.mark.parametrize("architecture, skip", [("standard", False), ("standard", True), ("jumprelu", True)])
def test_transcoders_saved_load_in_saelens_circuit_tracer_layout_and_gpt2(tmp_path, architecture, skip):
    from sae_lens import SAE

    config = DictionaryConfig(architecture, d_in=D_IN, d_dict=D_DICT, d_out=D_IN, skip=skip)
    g = torch.Generator().manual_seed(5)
    layers = [Dictionary(config, g) for _ in range(2)]
    with torch.no_grad():
        for d in layers:
            for p in d.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
            if architecture == "jumprelu":
                d.threshold.abs_()
    for i, d in enumerate(layers):
        save_saelens(d, tmp_path / "saelens" / f"layer_{i}", f"blocks.{i}.mlp.hook_in", f"blocks.{i}.hook_mlp_out")
    save_circuit_tracer(layers, tmp_path / "ct", scan="test")
    x = torch.randn(20, D_IN, generator=torch.Generator().manual_seed(6))
    for i, d in enumerate(layers):
        theirs = SAE.load_from_disk(str(tmp_path / "saelens" / f"layer_{i}"), device="cpu")
        weights = load_file(str(tmp_path / "ct" / f"layer_{i}.safetensors"))
        acts, out = circuit_tracer_forward(x, weights)  # circuit-tracer's encode and decode, written out
        with torch.no_grad():
            torch.testing.assert_close(theirs(x), d(x), atol=1e-5, rtol=0)
            torch.testing.assert_close(acts, d.encode(x), atol=1e-5, rtol=0)
            torch.testing.assert_close(out, d(x), atol=1e-5, rtol=0)
    for path in (tmp_path / "saelens", tmp_path / "ct"):
        tcs = load_transcoders(path)
        assert (tcs.input_step, tcs.output_step) == ("ln_2", "mlp.c_proj")
        torch.testing.assert_close(tcs[1](x), layers[1](x).detach(), atol=1e-5, rtol=0)


def test_bad_configs(tmp_path):
    cases = [
        (dict(architecture="gated"), "architecture"),
        (dict(architecture="topk", k=100), "k=100"),
        (dict(d_dict=0), "d_dict"),
        (dict(l1_coefficient=-1.0), "l1_coefficient"),
    ]
    for change, match in cases:
        with pytest.raises(GPT2Error, match=match):
            DictionaryConfig(**{"d_in": 8, "d_dict": 32, **change})
    with pytest.raises(GPT2Error, match="skip"):
        Dictionary(DictionaryConfig(d_in=8, d_dict=32, skip=True))
    sae = Dictionary(DictionaryConfig("topk", d_in=8, d_dict=32, k=4, d_out=8))
    with pytest.raises(GPT2Error, match="circuit-tracer reads"):
        save_circuit_tracer([sae], tmp_path / "ct", scan="x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    with pytest.raises(GPT2Error, match="already exists"):
        save_saelens(sae, tmp_path / "full", "blocks.0.mlp.hook_in")
