"""Sparse autoencoders saved by SAELens (gpt2.inspect.saes), against transformers' activations on
the same weights (read with hooks) put through SAELens's encoder written out here.

The first tests' reference is SAELens's source, written out in `saelens_encode` / `saelens_decode` from
sae_lens/saes/sae.py (`SAE.process_sae_in`, `_setup_activation_normalization`),
sae_lens/saes/standard_sae.py (`StandardSAE.encode`, `decode`) and sae_lens/saes/jumprelu_sae.py
(`JumpReLUSAE.encode`), SAELens 6.x. The SAE files are laid out as its `SAE.save_model` writes
them: cfg.json (6.x: the hook under "metadata"; before 6.0: `hook_name` at the top) and
sae_weights.safetensors. The last ones save SAEs of each architecture SAELens trains (standard,
jumprelu, topk, batchtopk) with SAELens itself, and compare gpt2's encode and decode with its own."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import hf_and_ours, transformer_lens_from_hf
from safetensors.torch import load_file, save_file

from gpt2 import GPT2Error
from gpt2.cli import main
from gpt2.inspect import load_sae, sae_features, top_features, trace

CONFIG = dict(vocab_size=50257, n_positions=64, n_embd=32, n_layer=2, n_head=4)
TEXT = "When Mary and John went to the store, John gave a drink to"
D_SAE = 48


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    directory = tmp_path_factory.mktemp("saes-model")
    return (*hf_and_ours(directory, seed=5, **CONFIG), directory)


def write_sae(
    directory,
    hook_name: str,
    architecture: str = "standard",
    normalize: str = "none",
    apply_b_dec: bool = True,
    d_in: int = 32,
    new_format: bool = True,
    seed: int = 0,
) -> dict:
    """An SAE of random weights in SAELens's layout; its tensors returned."""
    g = torch.Generator().manual_seed(seed)
    weights = {
        "W_enc": torch.randn(d_in, D_SAE, generator=g) * 0.3,
        "b_enc": torch.randn(D_SAE, generator=g) * 0.1,
        "W_dec": torch.randn(D_SAE, d_in, generator=g) * 0.3,
        "b_dec": torch.randn(d_in, generator=g) * 0.1,
    }
    if architecture == "jumprelu":
        weights["threshold"] = torch.rand(D_SAE, generator=g) * 0.5
    cfg = {
        "d_in": d_in,
        "d_sae": D_SAE,
        "dtype": "float32",
        "device": "cpu",
        "apply_b_dec_to_input": apply_b_dec,
        "normalize_activations": normalize,
        "architecture": architecture,
    }
    if new_format:  # SAELens 6.x's SAEConfig.to_dict
        cfg |= {"reshape_activations": "none", "metadata": {"hook_name": hook_name, "sae_lens_version": "6.12.1"}}
    else:  # before 6.0: the hook at the top
        cfg |= {"hook_name": hook_name, "hook_layer": int(hook_name.split(".")[1]), "model_name": "gpt2"}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cfg.json").write_text(json.dumps(cfg))
    save_file(weights, str(directory / "sae_weights.safetensors"))
    return weights


def hf_activation(hf, ids: list[int], hook: str, layer: int) -> torch.Tensor:
    """(T, C): transformers' activation at a TransformerLens hook, read with a forward hook."""
    block, got = hf.transformer.h[layer], []
    module, pre = {
        "hook_resid_pre": (block, True),
        "hook_resid_mid": (block.ln_2, True),
        "hook_resid_post": (block, False),
        "hook_attn_out": (block.attn, False),
        "hook_mlp_out": (block.mlp, False),
    }[hook]
    if pre:  # the module's input: the stream entering the block, or the one ln_2 normalises (after attention)
        handle = module.register_forward_pre_hook(
            lambda m, args, kwargs: got.append(args[0] if args else kwargs["hidden_states"]), with_kwargs=True
        )
    else:
        handle = module.register_forward_hook(
            lambda m, args, out: got.append(out[0] if isinstance(out, tuple) else out)
        )
    with torch.no_grad():
        hf(torch.tensor([ids]))
    handle.remove()
    return got[0][0]


def saelens_encode(x, w, normalize: str, apply_b_dec: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """SAELens's SAE.encode, written out: (feature activations, hidden_pre)."""
    if normalize == "constant_norm_rescale":
        x = x * (x.shape[-1] ** 0.5) / x.norm(dim=-1, keepdim=True)
    elif normalize == "layer_norm":
        x = x - x.mean(dim=-1, keepdim=True)
        x = x / (x.std(dim=-1, keepdim=True) + 1e-5)
    sae_in = x - w["b_dec"] * apply_b_dec
    hidden_pre = sae_in @ w["W_enc"] + w["b_enc"]
    acts = torch.relu(hidden_pre)
    if "threshold" in w:
        acts = acts * (hidden_pre > w["threshold"]).to(acts.dtype)
    return acts, hidden_pre


def saelens_decode(f, x, w, normalize: str) -> torch.Tensor:
    out = f @ w["W_dec"] + w["b_dec"]
    if normalize == "constant_norm_rescale":
        out = out / ((x.shape[-1] ** 0.5) / x.norm(dim=-1, keepdim=True))
    elif normalize == "layer_norm":
        mu = x.mean(dim=-1, keepdim=True)
        out = out * (x - mu).std(dim=-1, keepdim=True) + mu
    return out


CASES = [
    ("blocks.0.hook_resid_pre", "standard", "none", True, True),
    ("blocks.1.hook_resid_pre", "jumprelu", "none", True, False),
    ("blocks.1.hook_resid_mid", "standard", "constant_norm_rescale", False, True),
    ("blocks.1.hook_resid_post", "jumprelu", "layer_norm", True, True),  # the last block's output: before ln_f
    ("blocks.0.hook_attn_out", "standard", "none", True, False),
    ("blocks.1.hook_mlp_out", "jumprelu", "expected_average_only_in", True, True),
]


@pytest.mark.parametrize("hook_name, architecture, normalize, apply_b_dec, new_format", CASES)
def test_sae_features_are_saelens_encoder_on_transformers_activations(
    models, tmp_path, hook_name, architecture, normalize, apply_b_dec, new_format
):
    hf, ours, _ = models
    w = write_sae(tmp_path / "sae", hook_name, architecture, normalize, apply_b_dec, new_format=new_format)
    sae = load_sae(tmp_path / "sae")
    t = trace(ours, TEXT)
    _, hook = hook_name.rsplit(".", 1)
    x = hf_activation(hf, t.ids, hook, int(hook_name.split(".")[1]))
    expected, pre = saelens_encode(x, w, normalize, apply_b_dec)
    assert (expected > 0).any() and (expected == 0).any()
    if architecture == "jumprelu":  # the threshold zeroes some features ReLU alone would keep
        assert ((pre > 0) & (pre <= w["threshold"])).any()
    features = sae_features(ours, sae, TEXT)  # traced for the SAE's site only
    assert features.shape == (len(t.ids), D_SAE)
    assert torch.allclose(features, expected, atol=1e-5)
    assert torch.allclose(sae_features(t, sae), expected, atol=1e-5)  # from a default trace
    assert torch.allclose(sae.decode(features, x), saelens_decode(expected, x, w, normalize), atol=1e-5)


def test_top_features_are_the_largest_active_ones():
    f = torch.tensor([[0.0, 3.0, 1.0, 0.0, 2.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    assert top_features(f, 2) == [[(1, 3.0), (4, 2.0)], []]
    assert top_features(f, 9) == [[(1, 3.0), (4, 2.0), (2, 1.0)], []]


def test_inspect_sae_prints_each_tokens_top_features(models, tmp_path, capsys):
    hf, ours, model_dir = models
    w = write_sae(tmp_path / "sae", "blocks.1.hook_resid_pre", "jumprelu", seed=1)
    ids = ours.tokenizer.encode_ordinary(TEXT)
    expected, _ = saelens_encode(hf_activation(hf, ids, "hook_resid_pre", 1), w, "none", True)
    assert main(["inspect", "--sae", str(tmp_path / "sae"), TEXT, "--model", str(model_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "token",
        "top",
        "5",
        "features",
        "of",
        "blocks.1.hook_resid_pre",
        "(d_sae=48):",
        "id",
        "value",
    ]
    assert len(lines) == 1 + len(ids)
    for line, token_id, row in zip(lines[1:], ids, expected):
        assert line.startswith(repr(ours.tokenizer.decode([token_id])))
        best = row.topk(5)
        shown = [(int(i), float(v)) for i, v in zip(best.indices, best.values) if v > 0]
        printed = line[line.index("  ") :].split()
        assert [int(i) for i in printed[::2]] == [i for i, _ in shown]
        assert [float(v) for v in printed[1::2]] == pytest.approx([v for _, v in shown], abs=1e-3)
    assert (
        main(["inspect", "--sae", str(tmp_path / "sae"), TEXT, "--model", str(model_dir), "--json", "--top-k", "3"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["ids"] == ids and out["hook_name"] == "blocks.1.hook_resid_pre"
    for row, exp in zip(out["features"], expected):
        best = exp.topk(3)
        assert [f["id"] for f in row] == [int(i) for i, v in zip(best.indices, best.values) if v > 0]
        assert [f["value"] for f in row] == pytest.approx([float(v) for v in best.values if v > 0], abs=1e-5)


# cfg.json keys that contradict each other, the hook, or the tensors: each its own error.
STRICT_CFG = {
    "two hooks": {"hook_name": "blocks.1.hook_resid_pre"},
    "hook_layer": {"hook_layer": 1},
    "reshape z": {"reshape_activations": "hook_z"},
    "reshape": {"reshape_activations": "flatten"},
    "no k": {"architecture": "topk"},
    "k too big": {"architecture": "topk", "k": 49},
    "k of standard": {"k": 5},
    "rescale": {"rescale_acts_by_decoder_norm": True},
    "activation_fn": {"activation_fn_str": "tanh-relu"},
    "topk jumprelu": {"architecture": "jumprelu", "activation_fn": "topk", "activation_fn_kwargs": {"k": 3}},
    "two ks": {"architecture": "topk", "k": 4, "activation_fn": "topk", "activation_fn_kwargs": {"k": 3}},
    "no threshold": {"architecture": "jumprelu"},
    "no topk_threshold": {"architecture": "batchtopk"},
}
STRICT_MESSAGES = [
    (
        "two hooks",
        "gpt2: error: DIR/cfg.json: hook_name 'blocks.1.hook_resid_pre' and "
        "metadata.hook_name 'blocks.0.hook_resid_pre' disagree",
    ),
    (
        "hook_layer",
        "gpt2: error: DIR/cfg.json: hook_layer 1 disagrees with hook_name 'blocks.0.hook_resid_pre', at block 0",
    ),
    (
        "reshape z",
        "gpt2: error: DIR/cfg.json: reshape_activations 'hook_z' is for SAEs of attn.hook_z, "
        "but hook_name is 'blocks.0.hook_resid_pre'",
    ),
    ("reshape", "gpt2: error: DIR/cfg.json: reshape_activations 'flatten' is not one of none, hook_z"),
    ("no k", "gpt2: error: DIR/cfg.json: a topk SAE's k must be a whole number in 1..d_sae=48, got None"),
    ("k too big", "gpt2: error: DIR/cfg.json: a topk SAE's k must be a whole number in 1..d_sae=48, got 49"),
    ("k of standard", "gpt2: error: DIR/cfg.json: k is 5, but a standard SAE has no k (topk's)"),
    (
        "rescale",
        "gpt2: error: DIR/cfg.json: rescale_acts_by_decoder_norm is true, but a standard SAE does not rescale",
    ),
    ("activation_fn", "gpt2: error: DIR/cfg.json: activation_fn 'tanh-relu' is not one gpt2 reads: relu, topk"),
    ("topk jumprelu", "gpt2: error: DIR/cfg.json: activation_fn 'topk' and architecture 'jumprelu' disagree"),
    ("two ks", "gpt2: error: DIR/cfg.json: k 4 and activation_fn_kwargs.k 3 disagree"),
    (
        "no threshold",
        "gpt2: error: DIR/sae_weights.safetensors has no tensor 'threshold' "
        "(a jumprelu SAE has W_enc, b_enc, W_dec, b_dec, threshold)",
    ),
    (
        "no topk_threshold",
        "gpt2: error: DIR/sae_weights.safetensors has no tensor 'topk_threshold' "
        "(a batchtopk SAE has W_enc, b_enc, W_dec, b_dec, topk_threshold)",
    ),
    (
        "extra tensor",
        "gpt2: error: DIR/sae_weights.safetensors has a tensor 'threshold', which a standard SAE "
        "(cfg.json's architecture) does not have: it has W_enc, b_enc, W_dec, b_dec",
    ),
]


def broken(directory, what: str) -> None:
    """Spoil an SAE directory written by write_sae."""
    cfg = json.loads((directory / "cfg.json").read_text())
    if what == "no cfg":
        (directory / "cfg.json").unlink()
    elif what == "no weights":
        (directory / "sae_weights.safetensors").unlink()
    elif what == "cfg not json":
        (directory / "cfg.json").write_text("{ not json")
    elif what == "weights corrupt":
        (directory / "sae_weights.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    elif what == "extra tensor":  # a jumprelu's threshold in an SAE cfg.json calls standard
        weights = load_file(str(directory / "sae_weights.safetensors")) | {"threshold": torch.zeros(D_SAE)}
        save_file(weights, str(directory / "sae_weights.safetensors"))
    else:
        cfg |= {
            "width": {"d_in": 64},
            "arch": {"architecture": "gated"},
            "hook": {"metadata": {"hook_name": "blocks.0.hook_z"}},
            "layer": {"metadata": {"hook_name": "blocks.2.hook_resid_pre"}},
            "d_sae": {"d_sae": 47},
            **STRICT_CFG,
        }[what]
        (directory / "cfg.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    "what, message",
    [
        (
            "missing",
            "gpt2: error: DIR is not a directory: an SAE is a directory holding cfg.json and sae_weights.safetensors",
        ),
        ("no cfg", "gpt2: error: DIR/cfg.json does not exist"),
        ("no weights", "gpt2: error: DIR/sae_weights.safetensors does not exist"),
        ("cfg not json", "gpt2: error: DIR/cfg.json is not valid JSON"),
        ("weights corrupt", "gpt2: error: DIR/sae_weights.safetensors is truncated or corrupt"),
        (
            "width",
            "gpt2: error: DIR/cfg.json: the SAE reads vectors of d_in=64, "
            "but the model's h.0.resid_pre has 32 (n_embd=32)",
        ),
        (
            "arch",
            "gpt2: error: DIR/cfg.json: architecture 'gated' is not one gpt2 reads: "
            "standard, jumprelu, topk, batchtopk",
        ),
        (
            "hook",
            "gpt2: error: DIR/cfg.json: hook 'blocks.0.hook_z' is not one gpt2 reads: give one of gpt2's steps "
            "(h.L.resid_pre, ...) or TransformerLens's hooks (blocks.L.{hook_resid_pre, hook_resid_mid, "
            "hook_resid_post, hook_attn_out, hook_mlp_out}, ...)",
        ),
        (
            "layer",
            "gpt2: error: DIR/cfg.json: hook 'blocks.2.hook_resid_pre' is at block 2, "
            "but the model has blocks 0..1 (n_layer=2)",
        ),
        (
            "d_sae",
            "gpt2: error: DIR/sae_weights.safetensors: W_enc has shape [32, 48], "
            "but cfg.json's d_in=32 and d_sae=47 make it [32, 47]",
        ),
        *STRICT_MESSAGES,
    ],
)
def test_bad_sae_is_one_line_naming_the_file(models, tmp_path, capsys, what, message):
    _, ours, model_dir = models
    directory = tmp_path / "sae"
    if what != "missing":
        write_sae(directory, "blocks.0.hook_resid_pre", d_in=64 if what == "width" else 32)
        broken(directory, what)
    code = main(["inspect", "--sae", str(directory), "a b", "--model", str(model_dir)])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith(message.replace("DIR", str(directory))) and err.count("\n") == 1, err
    with pytest.raises(GPT2Error):  # the same in Python
        sae_features(ours, load_sae(directory), "a b")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--walk"], "gpt2: error: --sae shows each token's SAE features: give it without --walk"),
        (["--heads"], "gpt2: error: --sae shows each token's SAE features: give it without --heads"),
        (["--top-k", "0"], "gpt2: error: --top-k must be a positive integer"),
    ],
)
def test_inspect_sae_flags_it_does_not_take_are_one_line(models, tmp_path, capsys, argv, message):
    write_sae(tmp_path / "sae", "blocks.0.hook_resid_pre")
    code = main(["inspect", "--sae", str(tmp_path / "sae"), "a b", "--model", str(models[2]), *argv])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.startswith(message) and err.count("\n") == 1, err


def test_decode_of_a_normalising_sae_needs_its_input(tmp_path):
    write_sae(tmp_path / "sae", "blocks.0.hook_resid_pre", normalize="layer_norm")
    sae = load_sae(tmp_path / "sae")
    with pytest.raises(GPT2Error, match="give decode the activations x that were encoded"):
        sae.decode(torch.zeros(3, D_SAE))


@pytest.mark.parametrize(
    "hook_name, tl_hook, d_in",
    [
        ("blocks.1.attn.hook_z", "blocks.1.attn.hook_z", 32),  # heads side by side, as SAELens reads hook_z
        ("blocks.0.mlp.hook_post", "blocks.0.mlp.hook_post", 128),
        ("h.1.resid_mid", "blocks.1.hook_resid_mid", 32),  # gpt2's own name
        ("blocks.0.ln2.hook_normalized", "blocks.0.ln2.hook_normalized", 32),
    ],
)
def test_an_sae_reads_any_step_by_transformer_lens_name_or_gpt2s(models, tmp_path, hook_name, tl_hook, d_in):
    hf, ours, _ = models
    w = write_sae(tmp_path / "sae", hook_name, d_in=d_in)
    ids = trace(ours, TEXT).ids
    _, cache = transformer_lens_from_hf(hf).run_with_cache(torch.tensor([ids]), remove_batch_dim=True)
    x = cache[tl_hook]
    x = x.flatten(-2) if x.dim() == 3 else x  # hook_z: (T, H, d) -> (T, H * d)
    expected, _ = saelens_encode(x, w, "none", True)
    assert torch.allclose(sae_features(ours, load_sae(tmp_path / "sae"), TEXT), expected, atol=1e-5)


def saelens_sae(kind: str, hook_name: str, normalize: str, seed: int = 0):
    """An SAE of random weights made with SAELens's own classes: kind is an architecture, "topk-rescale"
    (rescale_acts_by_decoder_norm), or "topk-training" / "batchtopk" (its training SAEs, which
    rescale by default)."""
    import sae_lens
    from sae_lens.saes.sae import SAEMetadata

    reshape = "hook_z" if hook_name.endswith("hook_z") else "none"
    common = dict(d_in=32, d_sae=D_SAE, normalize_activations=normalize, reshape_activations=reshape)
    common["metadata"] = SAEMetadata(hook_name=hook_name)
    cls, cfg = {
        "standard": (sae_lens.StandardSAE, lambda: sae_lens.StandardSAEConfig(**common)),
        "jumprelu": (sae_lens.JumpReLUSAE, lambda: sae_lens.JumpReLUSAEConfig(**common)),
        "topk": (sae_lens.TopKSAE, lambda: sae_lens.TopKSAEConfig(k=5, **common)),
        "topk-rescale": (
            sae_lens.TopKSAE,
            lambda: sae_lens.TopKSAEConfig(k=7, rescale_acts_by_decoder_norm=True, **common),
        ),
        "topk-training": (sae_lens.TopKTrainingSAE, lambda: sae_lens.TopKTrainingSAEConfig(k=6, **common)),
        "batchtopk": (sae_lens.BatchTopKTrainingSAE, lambda: sae_lens.BatchTopKTrainingSAEConfig(k=6.0, **common)),
    }[kind]
    sae = cls(cfg())
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sae.named_parameters():
            p.copy_(
                torch.rand(p.shape, generator=g) * 0.5
                if name == "threshold"
                else torch.randn(p.shape, generator=g) * 0.3
            )
        if kind == "batchtopk":
            sae.topk_threshold.fill_(0.5)
    return sae


@pytest.mark.parametrize(
    "kind, hook_name, normalize, inference",
    [
        ("standard", "blocks.0.hook_resid_pre", "none", False),
        ("jumprelu", "blocks.1.hook_resid_post", "layer_norm", False),
        ("topk", "blocks.1.hook_mlp_out", "none", False),
        ("topk-rescale", "blocks.0.attn.hook_z", "constant_norm_rescale", False),
        ("topk-training", "blocks.1.hook_resid_mid", "none", False),  # a training save: rescales
        ("topk-training", "blocks.1.hook_resid_mid", "none", True),  # its inference save: norms folded
        ("batchtopk", "blocks.0.hook_attn_out", "none", False),  # a training save: read as its jumprelu
        ("batchtopk", "blocks.0.hook_attn_out", "none", True),  # SAELens's inference save: a jumprelu
    ],
)
def test_sae_saved_by_saelens_encodes_and_decodes_as_saelens(models, tmp_path, kind, hook_name, normalize, inference):
    import sae_lens

    _, ours, _ = models
    made = saelens_sae(kind, hook_name, normalize)
    if inference or kind in ("topk-training", "batchtopk"):
        made.save_inference_model(tmp_path / "inference")
    (made.save_inference_model if inference else made.save_model)(tmp_path / "sae")
    # What SAELens runs: its inference SAE, loaded from disk (a batchtopk training save it loads only so)
    reference = sae_lens.SAE.load_from_disk(tmp_path / ("inference" if kind == "batchtopk" else "sae"))
    sae = load_sae(tmp_path / "sae")
    x = sae.input_of(trace(ours, TEXT, names=sae.names()))  # (T, 32): the hook's activations, gpt2's trace
    x_ref = x.unflatten(-1, (4, 8)) if hook_name.endswith("hook_z") else x  # SAELens reshapes hook_z itself
    with torch.no_grad():
        expected = reference.encode(x_ref)
        expected_out = reference.decode(expected).reshape(x.shape)
    assert (expected > 0).any() and (expected == 0).any()
    if kind.startswith("topk"):
        assert ((expected != 0).sum(-1) <= reference.cfg.k).all()
    features = sae.encode(x)
    assert torch.allclose(features, expected, atol=1e-5)
    assert torch.allclose(sae.decode(features, x), expected_out, atol=1e-5)
    assert torch.allclose(sae_features(ours, sae, TEXT), expected, atol=1e-5)


def hf_block_output_replaced(hf, layer: int, ids, replace) -> torch.Tensor:
    """transformers' logits (T, V) with block `layer`'s output (its residual stream out) put through
    `replace` (T, C) -> (T, C) by a forward hook."""

    def hook(module, args, out):
        return (replace(out[0][0])[None], *out[1:]) if isinstance(out, tuple) else replace(out[0])[None]

    handle = hf.transformer.h[layer].register_forward_hook(hook)
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0]
    handle.remove()
    return logits


@pytest.mark.parametrize("kind", ["standard", "jumprelu", "topk"])
def test_trace_splices_an_sae_as_saelens_reconstructs(models, tmp_path, kind):
    hf, model, _ = models
    ref = saelens_sae(kind, "blocks.1.hook_resid_post", "none", seed=2)
    ref.save_model(tmp_path / "sae")
    sae = load_sae(tmp_path / "sae")
    ids = model.tokenizer.encode_ordinary(TEXT)
    t = trace(model, ids, saes=[sae])
    with torch.no_grad():
        expected = hf_block_output_replaced(hf, 1, ids, lambda x: ref(x))
        clean = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(t.logits, expected, atol=1e-4, rtol=0)  # the pass went on with the reconstruction
    assert (t.logits - clean).abs().max() > 1e-2
    x = t.activations["h.1"]
    with torch.no_grad():
        torch.testing.assert_close(t.activations["h.1.hook_sae_acts_post"], ref.encode(x), atol=1e-5, rtol=0)
        torch.testing.assert_close(t.activations["h.1.hook_sae_recons"], ref(x), atol=1e-5, rtol=0)
    assert "h.1.hook_sae_error" not in t.activations
    kept = trace(model, ids, saes=[sae], error_term=True)  # the error added back: the model's own pass
    torch.testing.assert_close(kept.logits, clean, atol=1e-4, rtol=0)
    torch.testing.assert_close(kept.activations["h.1.hook_sae_error"], x - ref(x).detach(), atol=1e-5, rtol=0)


def test_feature_patching_between_a_clean_and_a_corrupted_run(models, tmp_path):
    hf, model, _ = models
    ref = saelens_sae("standard", "blocks.0.hook_resid_post", "none", seed=4)
    ref.save_model(tmp_path / "sae")
    sae = load_sae(tmp_path / "sae")
    clean_ids = model.tokenizer.encode_ordinary(TEXT)
    corrupted_ids = model.tokenizer.encode_ordinary(TEXT.replace("Mary", "Alice"))
    assert len(clean_ids) == len(corrupted_ids)
    clean = trace(model, clean_ids, saes=[sae], error_term=True)
    features = clean.activations["h.0.hook_sae_acts_post"]
    position = 2  # the name's: its features taken from the clean run into the corrupted one

    def take(f):
        f = f.clone()
        f[position] = features[position]
        return f

    patched = trace(model, corrupted_ids, saes=[sae], error_term=True, patch={"h.0.hook_sae_acts_post": take})

    def expected(x):  # the corrupted run's error kept, its features at the position the clean run's
        with torch.no_grad():
            f = ref.encode(x)
            error = x - ref.decode(f)
            f[position] = ref.encode(clean.activations["h.0"])[position]
            return ref.decode(f) + error

    torch.testing.assert_close(
        patched.logits, hf_block_output_replaced(hf, 0, corrupted_ids, expected), atol=1e-4, rtol=0
    )
    corrupted = trace(model, corrupted_ids)
    assert (patched.logits[position:] - corrupted.logits[position:]).abs().max() > 1e-3


def test_a_batch_spliced_equals_each_prompt_alone(models, tmp_path):
    _, model, _ = models
    saelens_sae("topk", "blocks.1.hook_resid_mid", "none", seed=5).save_model(tmp_path / "sae")
    sae = load_sae(tmp_path / "sae")
    texts = [TEXT, "The war lasted from the year 1732 to the year 17"]
    batch = trace(model, texts, saes=[sae])
    for b, text in enumerate(texts):
        alone = trace(model, text, saes=[sae])
        n = len(alone.ids)
        torch.testing.assert_close(batch.logits[b, :n], alone.logits, atol=1e-4, rtol=0)
        got = batch.activations["h.1.resid_mid.hook_sae_acts_post"][b, :n]
        torch.testing.assert_close(got, alone.activations["h.1.resid_mid.hook_sae_acts_post"], atol=1e-5, rtol=0)


def test_trace_saes_errors(models, tmp_path):
    _, model, _ = models
    saelens_sae("standard", "blocks.1.hook_resid_mid", "none").save_model(tmp_path / "sae")
    sae = load_sae(tmp_path / "sae")
    with pytest.raises(GPT2Error, match="saes must hold"):
        trace(model, TEXT, saes=["sae"])
    with pytest.raises(GPT2Error, match="two dictionaries write h.1.resid_mid"):
        trace(model, TEXT, saes=[sae, sae])
    with pytest.raises(GPT2Error, match="unknown activation"):
        trace(model, TEXT, saes=[sae], patch={"h.0.hook_sae_acts_post": torch.zeros_like})
    with pytest.raises(GPT2Error, match="unknown activation"):  # no error step without error_term
        trace(model, TEXT, saes=[sae], patch={"h.1.resid_mid.hook_sae_error": torch.zeros_like})
