"""gpt2.inspect.names: TransformerLens's hook names and short names, each read as the gpt2 step
it names, checked against TransformerLens's own HookedTransformer on the same weights (its
cache, of the same steps), for one sequence and for a batch."""

from __future__ import annotations

import pytest
import torch
from helpers import hf_and_ours, transformer_lens_from_hf

from gpt2 import InvalidArgumentError
from gpt2.inspect.names import TL_BLOCK, TL_GLOBAL, activation_names, canonical, canonical_to_tl, short_name
from gpt2.inspect.tracing import trace

N_LAYER, N_HEAD, N_EMBD, VOCAB = 2, 3, 48, 97
TOL = 1e-5


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """gpt2's model and TransformerLens's (each head's result kept) on transformers' random weights."""
    hf, ours = hf_and_ours(
        tmp_path_factory.mktemp("names"),
        0,
        vocab_size=VOCAB,
        n_positions=32,
        n_embd=N_EMBD,
        n_layer=N_LAYER,
        n_head=N_HEAD,
    )
    return ours, transformer_lens_from_hf(hf, use_attn_result=True)


def as_ours(tl_name: str, value: torch.Tensor) -> torch.Tensor:
    """A TransformerLens cache entry in gpt2's layout: per-head steps heads first."""
    if tl_name.rsplit(".", 1)[-1] in ("hook_q", "hook_k", "hook_v", "hook_z", "hook_result"):
        return value.transpose(-3, -2)  # (B, T, H, x) -> (B, H, T, x)
    return value


def test_every_transformer_lens_hook_is_the_same_step(models):
    ours, tl = models
    ids = torch.randint(0, VOCAB, (3, 11), generator=torch.Generator().manual_seed(0))
    _, cache = tl.run_with_cache(ids)
    tl_names = [n for n in cache.keys() if canonical(n, N_LAYER) is not None]
    assert len(tl_names) == len(TL_GLOBAL) + N_LAYER * len(TL_BLOCK)  # every hook TL has for GPT-2 is mapped
    t = trace(ours, ids, names=tl_names)  # TransformerLens's names, as trace takes them
    assert set(t.activations) == {canonical(n, N_LAYER) for n in tl_names}
    for name in tl_names:
        theirs = as_ours(name, cache[name])
        assert t[name].shape == theirs.shape, name
        finite = torch.isfinite(theirs)
        assert (torch.isfinite(t[name]) == finite).all(), name
        assert (t[name][finite] - theirs[finite]).abs().max() < TOL, name
        # one sequence: the batch dimension dropped
        one = trace(ours, ids[1], names=[name])
        assert (one[name][torch.isfinite(one[name])] - theirs[1][finite[1]]).abs().max() < TOL, name


@pytest.mark.parametrize(
    "key",
    [
        ("pattern", 0),
        ("attn", 1),
        ("attn_scores", 1),
        ("q", 0),
        ("key", 1),
        ("z", 1),
        ("result", 0),
        ("resid_pre", 1),
        ("resid_mid", 0),
        ("resid_post", 1),
        ("attn_out", 0),
        ("mlp_out", 1),
        ("pre", 0),
        ("post", 1),
        ("scale", 0, "ln1"),
        ("normalized", 1, "ln2"),
        ("embed",),
        ("pos_embed",),
        ("scale",),
        ("normalized",),
    ],
)
def test_short_names_read_what_transformer_lens_reads(models, key):
    ours, tl = models
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    _, cache = tl.run_with_cache(ids)
    name = short_name(*key)
    t = trace(ours, ids, names=[name])
    theirs = as_ours(canonical_to_tl(name), cache[key if len(key) > 1 else key[0]])
    finite = torch.isfinite(theirs)
    assert (t[key][finite] - theirs[finite]).abs().max() < TOL
    assert canonical(canonical_to_tl(name), N_LAYER) == name


def test_names_and_filters_and_errors(models):
    ours, _ = models
    every = activation_names(N_LAYER)
    assert all(canonical(n, N_LAYER) == n for n in every)  # gpt2's own names are themselves
    t = trace(ours, [1, 2, 3], names=lambda n: n.endswith("hook_pattern"))  # a filter over TL's names
    assert sorted(t.activations) == [f"h.{i}.attn.pattern" for i in range(N_LAYER)]
    t = trace(ours, [1, 2, 3], names=lambda n: n.startswith("h.1.mlp"))  # or over gpt2's
    assert sorted(t.activations) == ["h.1.mlp.c_fc", "h.1.mlp.c_proj", "h.1.mlp.gelu"]
    with pytest.raises(InvalidArgumentError, match=r"names: unknown activation 'blocks\.2\.hook_resid_post'"):
        trace(ours, [1, 2], names=["blocks.2.hook_resid_post"])
    with pytest.raises(InvalidArgumentError, match="patch names one step twice"):
        trace(ours, [1, 2], patch={"h.0": torch.zeros_like, "blocks.0.hook_resid_post": torch.zeros_like})
    with pytest.raises(InvalidArgumentError, match=r"this trace did not record 'h\.0\.attn\.z'"):
        trace(ours, [1, 2])["z", 0]
    with pytest.raises(InvalidArgumentError, match="needs which LayerNorm: 'ln1' or 'ln2'"):
        trace(ours, [1, 2])["scale", 0]
    with pytest.raises(InvalidArgumentError, match=r"name: unknown activation 'h\.2\.attn\.pattern'.*\(i in 0\.\.1\)"):
        trace(ours, [1, 2])["pattern", 2]  # a block the model lacks
    with pytest.raises(InvalidArgumentError, match="unknown short name 'patern'"):
        trace(ours, [1, 2])["patern", 0]
