"""Training dictionaries on a model's streamed activations (gpt2.inspect.dictionary_training): the
metrics of each evaluation against the same numbers computed here with transformers' modules
(forward hooks: the site's vectors, the dictionary's output spliced in, the site zeroed), the
training itself (the reconstruction gets better), the saves read back, and the errors."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from helpers import hf_and_ours

from gpt2 import GPT2Error
from gpt2.data.batches import IGNORE, get_batch
from gpt2.data.files import open_data
from gpt2.inspect import load_sae, load_transcoders
from gpt2.inspect.dictionaries import DictionaryConfig
from gpt2.inspect.dictionary_training import TrainingSettings, train_dictionaries, transcoder_sites

CONFIG = dict(vocab_size=50257, n_positions=64, n_embd=32, n_layer=2, n_head=4)
SETTINGS = TrainingSettings(steps=60, batch_size=256, context=32, windows=8, eval_interval=30, eval_windows=4)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return hf_and_ours(tmp_path_factory.mktemp("dictionary-model"), seed=11, **CONFIG)


def eval_windows(data_dir) -> tuple[torch.Tensor, torch.Tensor]:
    """The windows an evaluation reads: the val split's, drawn as the module documents (seed + 1)."""
    data = open_data(data_dir)
    return get_batch(
        data.val,
        SETTINGS.context,
        SETTINGS.eval_windows,
        seed=SETTINGS.seed + 1,
        iteration=0,
        micro_step=0,
        mask=data.masks.get("val"),
        row=data.row,
    )


def hf_ce(hf, x, y, hooks=()) -> float:
    """transformers' next-token loss on positions 1.. of the windows, with forward hooks in place."""
    handles = [module.register_forward_hook(fn) for module, fn in hooks]
    with torch.no_grad():
        logits = hf(x).logits
    for h in handles:
        h.remove()
    return F.cross_entropy(logits[:, 1:].flatten(0, 1), y[:, 1:].flatten(), ignore_index=IGNORE).item()


def zero_after_first(module, args, out):
    out = out.clone()
    out[:, 1:] = 0
    return out


def splicing(block, d) -> list:
    """Forward hooks putting transcoder d's output in place of the block's MLP output (positions 1..)."""
    seen = {}

    def splice(module, args, out):
        out = out.clone()
        out[:, 1:] = d(seen["x"][:, 1:]).detach()
        return out

    return [(block.ln_2, lambda module, args, out: seen.update(x=out)), (block.mlp, splice)]


def mlp_io(hf, block, x) -> tuple[torch.Tensor, torch.Tensor]:
    """The block's MLP input and output at positions 1.., every window's, (N, C) each."""
    seen = {}
    handles = [
        block.ln_2.register_forward_hook(lambda module, args, out: seen.update(x=out)),
        block.mlp.register_forward_hook(lambda module, args, out: seen.update(y=out)),
    ]
    with torch.no_grad():
        hf(x)
    for h in handles:
        h.remove()
    return seen["x"][:, 1:].flatten(0, 1), seen["y"][:, 1:].flatten(0, 1)


def test_transcoder_set_metrics_equal_transformers(models, gpt2_data):
    hf, model = models
    run = train_dictionaries(
        model, gpt2_data, transcoder_sites(2), DictionaryConfig("jumprelu", d_dict=64, l0_coefficient=0.05), SETTINGS
    )
    assert [m["step"] for m in run.metrics] == [30, 60]
    x, y = eval_windows(gpt2_data)
    clean = hf_ce(hf, x, y)
    last = run.metrics[-1]["dictionaries"]
    for layer, (d, metrics) in enumerate(zip(run.dictionaries, last)):
        block = hf.transformer.h[layer]
        spliced = hf_ce(hf, x, y, splicing(block, d))
        zeroed = hf_ce(hf, x, y, [(block.mlp, zero_after_first)])
        assert abs(metrics["ce_clean"] - clean) < 1e-4 and abs(metrics["ce_spliced"] - spliced) < 1e-4
        assert abs(metrics["ce_zero"] - zeroed) < 1e-4
        recovered = (zeroed - spliced) / (zeroed - clean)
        assert abs(metrics["ce_recovered"] - recovered) < 1e-3
        xs, ys = mlp_io(hf, block, x)
        with torch.no_grad():
            f, out = d.encode(xs), d(xs)
        assert abs(metrics["l0"] - (f != 0).float().sum(-1).mean().item()) < 1e-4
        ev = 1 - (ys - out).pow(2).sum() / (ys - ys.mean(0)).pow(2).sum()
        assert abs(metrics["explained_variance"] - ev.item()) < 1e-4
        assert 0 <= metrics["dead"] <= 64


def test_sae_training_learns_and_saves(models, gpt2_data, tmp_path):
    _, model = models
    settings = TrainingSettings(**{**SETTINGS.__dict__, "steps": 120, "eval_interval": 40})
    run = train_dictionaries(
        model, gpt2_data, [("blocks.1.hook_resid_mid",) * 2], DictionaryConfig("topk", d_dict=128, k=8), settings
    )
    first, last = run.metrics[0]["dictionaries"][0], run.metrics[-1]["dictionaries"][0]
    assert last["l0"] == 8 and last["explained_variance"] > first["explained_variance"] + 0.05
    run.save(tmp_path / "out")
    sae = load_sae(tmp_path / "out" / "saelens")
    assert sae.hook_name == "blocks.1.hook_resid_mid" and sae.d_sae == 128
    record = json.loads((tmp_path / "out" / "training.json").read_text())
    assert record["metrics"] == json.loads(json.dumps(run.metrics)) and record["data"] == str(gpt2_data)
    assert not (tmp_path / "out" / "circuit-tracer").exists()


def test_transcoder_set_saved_for_circuit_tracer(models, gpt2_data, tmp_path):
    _, model = models
    settings = TrainingSettings(**{**SETTINGS.__dict__, "steps": 2, "eval_interval": 2})
    run = train_dictionaries(
        model, gpt2_data, transcoder_sites(2), DictionaryConfig("standard", d_dict=64, skip=True), settings
    )
    run.save(tmp_path / "out")
    x = torch.randn(5, 32)
    for layout in ("saelens", "circuit-tracer"):
        tcs = load_transcoders(tmp_path / "out" / layout)
        tcs.check_fits(model)
        for layer in range(2):
            torch.testing.assert_close(tcs[layer](x), run.dictionaries[layer](x).detach(), atol=1e-5, rtol=0)


def test_bad_training_input(models, gpt2_data, char_data):
    _, model = models
    config = DictionaryConfig("topk", d_dict=32, k=4)
    cases = [
        (dict(sites=[("h.0.attn.pattern",) * 2]), "site"),
        (dict(sites=[("h.7.resid_mid",) * 2]), "h.7.resid_mid"),
        (dict(settings=TrainingSettings(context=80)), "n_ctx"),
        (dict(data=char_data), "tokenizer"),
        (dict(data="/nonexistent"), "does not exist"),
    ]
    for change, match in cases:
        kwargs = dict(data=gpt2_data, sites=[("h.1", "h.1")], settings=SETTINGS) | change
        with pytest.raises(GPT2Error, match=match):
            train_dictionaries(model, kwargs["data"], kwargs["sites"], config, kwargs["settings"])
    with pytest.raises(GPT2Error, match="steps"):
        TrainingSettings(steps=0)
