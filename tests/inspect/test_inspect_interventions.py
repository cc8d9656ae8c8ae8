"""Feature interventions (gpt2.inspect.interventions) against circuit-tracer's `feature_intervention`
written with TransformerLens 3.9's hooks as its TransformerLens backend does it
(replacement_model_transformerlens.py: the patterns cached from the unchanged run and put back,
each block's transcoder features read at its MLP's input with position 0 read as 0, and
(value - activation) * W_dec added to the intervened blocks' MLP outputs). circuit-tracer itself:
benchmarks/attribution_graph.py (benchmarks/RESULTS.md)."""

from __future__ import annotations

import pytest
import torch
from helpers import (
    circuit_tracer_forward,
    circuit_tracer_layer,
    hf_and_ours,
    transformer_lens_from_hf,
    write_circuit_tracer,
)

from gpt2 import GPT2Error
from gpt2.inspect import feature_intervention, load_transcoders

CONFIG = dict(vocab_size=50257, n_positions=64, n_embd=32, n_layer=2, n_head=4)
IDS = [50256, 464, 3290, 26172, 262, 3797, 13, 383, 3797, 4966]
L = 2


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    hf, ours = hf_and_ours(tmp_path_factory.mktemp("interventions-model"), seed=3, **CONFIG)
    return hf, ours, transformer_lens_from_hf(hf)


@pytest.fixture(scope="module")
def transcoders(tmp_path_factory):
    directory = tmp_path_factory.mktemp("interventions-set")
    layers = {i: circuit_tracer_layer(5 + i, True, True, b_enc=-0.3) for i in range(L)}
    write_circuit_tracer(directory, layers)
    return layers, load_transcoders(directory)


def reference(tl, layers, ids, changes, freeze):
    """circuit-tracer's feature_intervention, written with TransformerLens's hooks: (logits, activations)."""
    _, cache = tl.run_with_cache(torch.tensor([ids]))
    acts = [None] * L

    def read(x, hook):
        i = hook.layer()
        a, _ = circuit_tracer_forward(x[0] * tl.blocks[i].ln2.w + tl.blocks[i].ln2.b, layers[i])
        a[0] = 0
        acts[i] = a
        return x

    def add(out, hook):
        i = hook.layer()
        deltas = torch.zeros_like(acts[i])
        for layer, position, feature, value in changes:
            if layer == i:
                deltas[position, feature] = value - acts[i][position, feature]
        return out + (deltas @ layers[i]["W_dec"])[None]

    hooks = [(f"blocks.{i}.ln2.hook_normalized", read) for i in range(L)]
    hooks += [(f"blocks.{i}.hook_mlp_out", add) for i in range(L)]
    if freeze:
        hooks += [(f"blocks.{i}.attn.hook_pattern", lambda x, hook: cache[hook.name]) for i in range(L)]
    with torch.no_grad():
        logits = tl.run_with_hooks(torch.tensor([ids]), fwd_hooks=hooks)[0]
    return logits, torch.stack(acts)


@pytest.mark.parametrize("freeze", [True, False])
@pytest.mark.parametrize(
    "changes",
    [
        [(0, 3, 7, 0.0)],  # zero one feature
        [(0, 2, 5, 4.0), (1, 6, 11, 0.0), (0, 8, 1, 2.5)],  # set some, at several blocks
        [(0, slice(2, 7), 9, 3.0)],  # at a run of positions
        [(0, 4, 3, 9.0), (0, 4, 3, 2.0)],  # the same feature twice: the later wins
    ],
)
def test_equals_circuit_tracers_intervention(models, transcoders, changes, freeze):
    hf, model, tl = models
    layers, tcs = transcoders
    result = feature_intervention(model, IDS, tcs, changes, freeze_attention=freeze)
    logits, acts = reference(tl, layers, IDS, changes, freeze)
    torch.testing.assert_close(result.logits, logits, atol=1e-4, rtol=0)
    torch.testing.assert_close(result.activations, acts, atol=1e-5, rtol=0)
    with torch.no_grad():
        clean = hf(torch.tensor([IDS])).logits[0]
    torch.testing.assert_close(result.clean_logits, clean, atol=1e-4, rtol=0)
    assert (result.logits - clean).abs().max() > 1e-3  # the change changed something: the test can fail


def test_frozen_attention_keeps_earlier_positions(models, transcoders):
    _, model, _ = models
    _, tcs = transcoders
    changed = [(0, 5, 7, 6.0)]
    frozen = feature_intervention(model, IDS, tcs, changed)
    free = feature_intervention(model, IDS, tcs, changed, freeze_attention=False)
    for result in (frozen, free):  # causal: positions before 5 never see the change
        torch.testing.assert_close(result.logits[:5], result.clean_logits[:5], atol=1e-5, rtol=0)
    assert (frozen.logits[6:] - free.logits[6:]).abs().max() > 1e-4  # later positions read it through attention


def test_top_changes(models, transcoders):
    _, model, _ = models
    _, tcs = transcoders
    result = feature_intervention(model, IDS, tcs, [(1, 9, 2, 8.0)])
    rows = result.top_changes(3)
    before, after = result.clean_logits[-1].softmax(-1), result.logits[-1].softmax(-1)
    assert [r["id"] for r in rows[:3]] == before.topk(3).indices.tolist()
    assert set(after.topk(3).indices.tolist()) <= {r["id"] for r in rows}
    for r in rows:
        assert r["token"] == model.tokenizer.decode([r["id"]])
        assert abs(r["before"] - before[r["id"]].item()) < 1e-6 and abs(r["after"] - after[r["id"]].item()) < 1e-6


@pytest.mark.parametrize(
    "changes, match",
    [
        ("zero it", "list of"),
        ([(0, 1, 2)], r"interventions\[0\] must be"),
        ([(2, 1, 2, 0.0)], "layer"),
        ([(0, 10, 2, 0.0)], "position"),
        ([(0, 1, 48, 0.0)], "feature"),
        ([(0, 1, 2, "big")], "value must be a number"),
    ],
)
def test_bad_interventions(models, transcoders, changes, match):
    _, model, _ = models
    _, tcs = transcoders
    with pytest.raises(GPT2Error, match=match):
        feature_intervention(model, IDS, tcs, changes)


def test_steering_vectors_of_saes_and_transcoders(models, transcoders, tmp_path):
    import sae_lens
    from sae_lens.saes.sae import SAEMetadata

    from gpt2.inspect import load_sae, steering_vector

    layers, tcs = transcoders
    got = steering_vector(tcs, 7, 2.5, layer=1)  # a transcoder's feature writes the MLP's output: block 1's stream
    assert list(got) == [1]
    torch.testing.assert_close(got[1], 2.5 * layers[1]["W_dec"][7])
    assert list(steering_vector(tcs[0], 3)) == [0]
    for hook, block in (("blocks.1.hook_resid_post", 1), ("blocks.1.hook_resid_pre", 0), ("blocks.0.hook_mlp_out", 0)):
        sae = sae_lens.StandardSAE(sae_lens.StandardSAEConfig(d_in=32, d_sae=16, metadata=SAEMetadata(hook_name=hook)))
        sae.save_model(tmp_path / hook)
        got = steering_vector(load_sae(tmp_path / hook), 5, -1.0)
        assert list(got) == [block]
        torch.testing.assert_close(got[block], -sae.W_dec[5].detach())
    sae_lens.StandardSAE(
        sae_lens.StandardSAEConfig(d_in=32, d_sae=16, metadata=SAEMetadata(hook_name="blocks.0.hook_resid_mid"))
    ).save_model(tmp_path / "mid")
    for args, match in (
        ((load_sae(tmp_path / "mid"), 1), "not in the stream between blocks"),
        ((tcs, 1), "needs the layer"),
        ((tcs, 48, 1.0, 0), "feature"),
        (("tc", 1), "takes an SAE"),
    ):
        with pytest.raises(GPT2Error, match=match):
            steering_vector(*args)
