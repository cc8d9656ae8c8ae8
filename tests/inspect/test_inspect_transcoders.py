"""Transcoders (gpt2.inspect.transcoders) in circuit-tracer's and SAELens's layouts.

circuit-tracer (0.5) cannot be installed beside our pins: its layout and math are written out here
from its source, circuit_tracer/transcoder/single_layer_transcoder.py (`TranscoderSet.to_safetensors`,
`load_relu_transcoder`, `SingleLayerTranscoder.encode/decode/compute_skip`),
transcoder/activation_functions.py (`jumprelu`: x * (x > threshold)) and utils/caching.py (its
config.yaml: model_kind, feature_input_hook, feature_output_hook, the optional list `transcoders`).
SAELens's transcoders are saved and run by SAELens itself (sae_lens/saes/transcoder.py)."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import circuit_tracer_forward, circuit_tracer_layer, hf_and_ours, write_circuit_tracer

from gpt2 import GPT2Error
from gpt2.inspect import trace
from gpt2.inspect.transcoders import Transcoder, TranscoderSet, load_transcoder, load_transcoders

CONFIG = dict(vocab_size=50257, n_positions=64, n_embd=32, n_layer=2, n_head=4)
IDS = [464, 3290, 26172, 262, 3797, 13, 383, 3797, 4966, 1497]
D_T = 48


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return hf_and_ours(tmp_path_factory.mktemp("transcoders-model"), seed=7, **CONFIG)


def hf_ln_2(hf, layer: int) -> torch.Tensor:
    """(T, C): transformers' ln_2 output of block `layer`, read with a forward hook."""
    got = []
    handle = hf.transformer.h[layer].ln_2.register_forward_hook(lambda m, args, out: got.append(out))
    with torch.no_grad():
        hf(torch.tensor([IDS]))
    handle.remove()
    return got[0][0]


@pytest.mark.parametrize("jumprelu", [False, True])
@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("listed", [False, True])
def test_circuit_tracer_set_on_the_models_mlp_inputs(models, tmp_path, jumprelu, skip, listed):
    hf, model = models
    layers = {i: circuit_tracer_layer(10 * i + 2 * jumprelu + skip, jumprelu, skip) for i in range(2)}
    write_circuit_tracer(tmp_path / "set", layers, listed=listed)
    tcs = load_transcoders(tmp_path / "set")
    tcs.check_fits(model)
    assert isinstance(tcs, TranscoderSet) and len(tcs) == 2 and tcs.d_transcoder == D_T
    assert (tcs.input_step, tcs.output_step) == ("ln_2", "mlp.c_proj")
    t = trace(model, IDS, names=[f"h.{i}.ln_2" for i in range(2)])
    for i, tc in enumerate(tcs):
        assert (tc.layer, tc.input_site, tc.output_site) == (i, f"h.{i}.ln_2", f"h.{i}.mlp.c_proj")
        assert tc.activation == ("jumprelu" if jumprelu else "relu") and (tc.W_skip is not None) == skip
        x = t.activations[f"h.{i}.ln_2"]
        torch.testing.assert_close(x, hf_ln_2(hf, i), atol=1e-5, rtol=0)  # the site is transformers' ln_2
        acts, out = circuit_tracer_forward(x, layers[i])
        torch.testing.assert_close(tc.encode(x), acts, atol=1e-5, rtol=0)
        torch.testing.assert_close(tc(x), out, atol=1e-5, rtol=0)
        if jumprelu:
            assert (acts < 0).any()  # the negative thresholds are exercised


def saelens_transcoder(architecture: str, hook_name: str, hook_name_out: str, seed: int, d_in: int = 32):
    """A SAELens transcoder of `architecture` with random weights (thresholds partly negative)."""
    sae_lens = pytest.importorskip("sae_lens")
    from sae_lens.saes.sae import SAEMetadata

    cls, cfg_cls = sae_lens.saes.sae.get_sae_class(architecture)
    cfg = cfg_cls(
        d_in=d_in,
        d_sae=D_T,
        d_out=d_in,
        apply_b_dec_to_input=False,
        metadata=SAEMetadata(hook_name=hook_name, hook_name_out=hook_name_out),
    )
    tc = cls(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in tc.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if name != "threshold" else 0.2))
    return tc.eval()


def test_saelens_set_of_mixed_sites_is_an_error(tmp_path):
    for i, hook in enumerate(["blocks.0.ln2.hook_normalized", "blocks.1.mlp.hook_in"]):
        ref = saelens_transcoder("transcoder", hook, f"blocks.{i}.hook_mlp_out", seed=i)
        ref.save_model(tmp_path / "set" / f"layer_{i}")
    one_line_error(load_transcoders, tmp_path / "set", "must agree", tmp_path / "set" / "layer_1")


@pytest.mark.parametrize(
    "architecture", ["transcoder", "skip_transcoder", "jumprelu_transcoder", "jumprelu_skip_transcoder"]
)
def test_saelens_transcoders_match_saelens(models, tmp_path, architecture):
    hf, model = models
    refs = []
    for i in range(2):
        ref = saelens_transcoder(architecture, f"blocks.{i}.mlp.hook_in", f"blocks.{i}.hook_mlp_out", seed=i)
        ref.save_model(tmp_path / "set" / f"layer_{i}")
        refs.append(ref)
    tcs = load_transcoders(tmp_path / "set")
    tcs.check_fits(model)
    t = trace(model, IDS, names=tcs.names())
    for i, (tc, ref) in enumerate(zip(tcs, refs)):
        assert (tc.input_site, tc.output_site) == (f"h.{i}.ln_2", f"h.{i}.mlp.c_proj")
        x = t.activations[f"h.{i}.ln_2"]
        with torch.no_grad():
            features = ref.encode(x)
            torch.testing.assert_close(tc.encode(x), features, atol=1e-5, rtol=0)
            torch.testing.assert_close(tc.decode(features), ref.decode(features), atol=1e-5, rtol=0)
            torch.testing.assert_close(tc(x), ref(x), atol=1e-5, rtol=0)
        if "jumprelu" in architecture:
            assert ((ref.encode(x) == 0) & (torch.relu(x @ ref.W_enc + ref.b_enc) > 0)).any()  # thresholds cut
    one = load_transcoder(tmp_path / "set" / "layer_1")
    assert isinstance(one, Transcoder) and one.layer == 1


def test_saelens_hooks_read_as_sites(tmp_path):
    ref = saelens_transcoder("transcoder", "blocks.0.ln2.hook_normalized", "blocks.0.hook_mlp_out", seed=0)
    ref.save_model(tmp_path / "tc")
    tc = load_transcoder(tmp_path / "tc")
    assert (tc.input_site, tc.output_site) == ("h.0.ln_2.normalized", "h.0.mlp.c_proj")
    assert len(load_transcoders(tmp_path / "tc")) == 1  # one directory: a set of one, layer 0's


def saved_saelens(tmp_path, cfg_changes: dict, architecture: str = "transcoder") -> tuple:
    """A SAELens transcoder saved by SAELens, its cfg.json then changed: (directory, cfg path)."""
    ref = saelens_transcoder(architecture, "blocks.0.mlp.hook_in", "blocks.0.hook_mlp_out", seed=0)
    directory = tmp_path / "tc"
    ref.save_model(directory)
    cfg_path = directory / "cfg.json"
    cfg = json.loads(cfg_path.read_text())
    for key, value in cfg_changes.items():
        place, key = (cfg["metadata"], key[5:]) if key.startswith("meta_") else (cfg, key)
        place[key] = value
    cfg_path.write_text(json.dumps(cfg))
    return directory, cfg_path


def one_line_error(load, path, match: str, named) -> None:
    """`load(path)` raises one GPT2Error, one line, naming `named` and matching `match`."""
    with pytest.raises(GPT2Error, match=match) as e:
        load(path)
    assert str(named) in str(e.value) and "\n" not in str(e.value)


def test_circuit_tracer_errors(models, tmp_path):
    hf, model = models
    ok = {i: circuit_tracer_layer(i, True, False) for i in range(2)}
    write_circuit_tracer(tmp_path / "gap", {0: ok[0], 2: ok[1]})
    one_line_error(load_transcoders, tmp_path / "gap", "layer_1.safetensors", tmp_path / "gap")
    write_circuit_tracer(tmp_path / "short", {0: ok[0]})
    with pytest.raises(GPT2Error, match="no transcoder for layers 1") as e:
        load_transcoders(tmp_path / "short").check_fits(model)
    assert str(tmp_path / "short") in str(e.value)
    write_circuit_tracer(tmp_path / "narrow", {i: circuit_tracer_layer(i, False, False, d_model=16) for i in range(2)})
    with pytest.raises(GPT2Error, match="d_model=16.*n_embd=32") as e:
        load_transcoders(tmp_path / "narrow").check_fits(model)
    assert "layer_0.safetensors" in str(e.value)
    odd = dict(ok[0]) | {"activation_function.k": torch.tensor(4.0)}
    write_circuit_tracer(tmp_path / "topk", {0: odd, 1: ok[1]})
    one_line_error(load_transcoders, tmp_path / "topk", "activation function", "layer_0.safetensors")
    write_circuit_tracer(tmp_path / "clt", ok, model_kind="cross_layer_transcoder")
    one_line_error(load_transcoders, tmp_path / "clt", "model_kind 'cross_layer_transcoder'", "config.yaml")
    write_circuit_tracer(tmp_path / "hook", ok, feature_output_hook="mlp.hook_result")
    one_line_error(load_transcoders, tmp_path / "hook", "'mlp.hook_result' is not a site", "config.yaml")
    write_circuit_tracer(tmp_path / "pattern", ok, feature_input_hook="attn.hook_pattern")
    one_line_error(load_transcoders, tmp_path / "pattern", "not a site", "config.yaml")
    bad = dict(ok[1]) | {"W_dec": torch.zeros(D_T, 31)}
    write_circuit_tracer(tmp_path / "shape", {0: ok[0], 1: bad})
    one_line_error(load_transcoders, tmp_path / "shape", r"W_dec has shape \[48, 31\]", "layer_1.safetensors")
    mixed = {0: ok[0], 1: circuit_tracer_layer(1, True, True)}  # one layer with a skip connection, one without
    write_circuit_tracer(tmp_path / "mixed", mixed)
    one_line_error(load_transcoders, tmp_path / "mixed", "must agree", "layer_1.safetensors")
    write_circuit_tracer(tmp_path / "hub", ok, transcoders=["hf://someone/tc/layer_0.safetensors"])
    one_line_error(load_transcoders, tmp_path / "hub", "downloads nothing", "config.yaml")
    one_line_error(load_transcoders, tmp_path / "nowhere", "not a directory", tmp_path / "nowhere")


def test_saelens_errors(models, tmp_path):
    hf, model = models
    cases = [
        (dict(architecture="topk_transcoder"), "architecture 'topk_transcoder'"),
        (dict(architecture="standard"), "load_sae"),
        (dict(hook_name="blocks.0.hook_resid_pre"), "at the top but"),  # contradicts metadata's
        (dict(hook_layer=1), "hook_layer=1 contradicts"),
        (dict(meta_hook_name_out="blocks.1.hook_mlp_out"), "writes block 1"),
        (dict(meta_hook_name="blocks.0.attn.hook_pattern"), "not a site"),
        (dict(meta_hook_name="blocks.0.hook_nonsense"), "not a site"),
        (dict(meta_hook_name_out=None), "no hook_name_out"),
        (dict(apply_b_dec_to_input=True), "apply_b_dec_to_input=True"),
        (dict(normalize_activations="layer_norm"), "normalize_activations='layer_norm'"),
        (dict(activation_fn="topk"), "activation_fn='topk'"),
        (dict(d_out=31), r"W_dec has shape \[48, 32\]"),
    ]
    for changes, match in cases:
        directory, cfg_path = saved_saelens(tmp_path, changes)
        one_line_error(load_transcoder, directory, match, directory)
    # the skip connection's tensor in a plain transcoder's file: the architecture and the weights disagree
    directory, _ = saved_saelens(tmp_path, {}, architecture="skip_transcoder")
    cfg = json.loads((directory / "cfg.json").read_text()) | {"architecture": "transcoder"}
    (directory / "cfg.json").write_text(json.dumps(cfg))
    one_line_error(load_transcoder, directory, "W_skip are not a transcoder's", "sae_weights.safetensors")
    narrow = saelens_transcoder("transcoder", "blocks.0.mlp.hook_in", "blocks.0.hook_mlp_out", seed=0, d_in=16)
    narrow.save_model(tmp_path / "narrow" / "layer_0")
    narrow.save_model(tmp_path / "narrow" / "layer_1")
    one_line_error(load_transcoders, tmp_path / "narrow", "are both layer 0's", tmp_path / "narrow" / "layer_1")
    narrow.cfg.metadata.hook_name, narrow.cfg.metadata.hook_name_out = "blocks.1.mlp.hook_in", "blocks.1.hook_mlp_out"
    narrow.save_model(tmp_path / "narrow" / "layer_1")
    with pytest.raises(GPT2Error, match="d_model=16.*n_embd=32") as e:
        load_transcoders(tmp_path / "narrow").check_fits(model)
    assert str(tmp_path / "narrow" / "layer_0") in str(e.value)


@pytest.mark.parametrize("skip", [False, True])
def test_trace_splices_a_transcoder_set_in_place_of_the_mlps(models, tmp_path, skip):
    hf, model = models
    layers = {i: circuit_tracer_layer(20 + i, True, skip) for i in range(2)}
    write_circuit_tracer(tmp_path / "set", layers)
    tcs = load_transcoders(tmp_path / "set")
    seen, handles = {}, []
    for i, block in enumerate(hf.transformer.h):  # each MLP's output: circuit-tracer's transcoder of its input
        handles.append(block.ln_2.register_forward_hook(lambda m, a, out, i=i: seen.update({i: out})))
        handles.append(
            block.mlp.register_forward_hook(lambda m, a, out, i=i: circuit_tracer_forward(seen[i], layers[i])[1])
        )
    with torch.no_grad():
        expected = hf(torch.tensor([IDS])).logits[0]
    for h in handles:
        h.remove()
    t = trace(model, IDS, saes=[tcs])
    torch.testing.assert_close(t.logits, expected, atol=1e-4, rtol=0)
    acts, _ = circuit_tracer_forward(t.activations["h.1.ln_2"], layers[1])
    torch.testing.assert_close(t.activations["h.1.mlp.c_proj.hook_sae_acts_post"], acts, atol=1e-5, rtol=0)
    kept = trace(model, IDS, saes=[tcs[0]], error_term=True)  # one block's, the error added back: unchanged
    torch.testing.assert_close(kept.logits, trace(model, IDS).logits, atol=1e-5, rtol=0)
