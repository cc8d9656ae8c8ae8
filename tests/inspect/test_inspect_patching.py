"""gpt2.inspect.patching: activation patching against the same patches made with forward hooks on
transformers' GPT2LMHeadModel (same random weights), its sanity cases checked with transformers'
unpatched runs, batched against one run at a time, and its bad inputs. Attribution patching
against the same first-order estimate written out on transformers' activations and autograd
gradients, its ranking of the sites against activation patching's on the shipped trained model
(Spearman's correlation by scipy),
and its bad inputs."""

from __future__ import annotations

import pytest
import torch
from helpers import hf_and_ours, transformer_lens_from_hf
from scipy.stats import spearmanr
from transformer_lens import patching as tl_patching

from gpt2 import InputTypeError, InvalidArgumentError
from gpt2.errors import ContextLengthError
from gpt2.inspect import activation_patching, attribution_patching, logit_diff, normalised_logit_diff, trace
from gpt2.inspect.patching import AXES
from gpt2.model.model import GPT2
from gpt2.tokenizer import Tokenizer
from gpt2.tokenizer.char import CharTokenizer

N_LAYER, N_HEAD, N_EMBD, VOCAB, CTX = 2, 4, 32, 97, 16
CLEAN = [5, 17, 42, 8, 63, 29, 11]
P = 3  # the one position where the corrupted input differs
CORRUPTED = CLEAN[:P] + [77] + CLEAN[P + 1 :]
T, D = len(CLEAN), N_EMBD // N_HEAD
ANSWER, OTHER = 12, 40
SHAPES = {
    "resid_pre": (N_LAYER, T),
    "attn_out": (N_LAYER, T),
    "mlp_out": (N_LAYER, T),
    "head": (N_LAYER, N_HEAD),
    "head_pos": (N_LAYER, N_HEAD, T),
}
TOL = 1e-4
SITES = tuple(SHAPES)  # the sites checked against transformers' hooks; the others against TransformerLens, below


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """transformers' model and gpt2's on the same random weights, drawn wide (std 0.4, not 0.02)
    so that the logits and the differences patching makes are of order 1, not 0.01."""
    return hf_and_ours(
        tmp_path_factory.mktemp("patching"),
        vocab_size=VOCAB,
        n_positions=CTX,
        n_embd=N_EMBD,
        n_layer=N_LAYER,
        n_head=N_HEAD,
        attn_implementation="eager",
        initializer_range=0.4,
    )


@pytest.fixture(scope="module")
def grids(pair):
    """Each site's grid, logit_diff(ANSWER, OTHER), computed once."""
    return {
        site: activation_patching(pair[1], CLEAN, CORRUPTED, logit_diff(ANSWER, OTHER), site, batch_size=5)
        for site in SITES
    }


def hf_logit_diff(hf, ids: list[int], hooks: list[tuple[str, str, object]] = ()) -> float:
    """transformers' logits[-1, ANSWER] - logits[-1, OTHER]; hooks: (module, "pre" or "post", hook)."""
    modules = dict(hf.named_modules())
    handles = [
        modules[m].register_forward_pre_hook(h) if kind == "pre" else modules[m].register_forward_hook(h)
        for m, kind, h in hooks
    ]
    try:
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0]
    finally:
        for h in handles:
            h.remove()
    return float(logits[-1, ANSWER] - logits[-1, OTHER])


# Where each site is, in transformers' modules: (module, hook kind, the site's tensor from the hook's
# arguments, the hook's return value with that tensor replaced).
HF_SITES = {
    "resid_pre": ("transformer.h.{l}", "pre", lambda args, out: args[0], lambda args, out, x: (x, *args[1:])),
    "attn_out": ("transformer.h.{l}.attn", "post", lambda args, out: out[0], lambda args, out, x: (x, *out[1:])),
    "mlp_out": ("transformer.h.{l}.mlp", "post", lambda args, out: out, lambda args, out, x: x),
    # the heads' outputs side by side, as c_proj receives them: head h is channels h*D..(h+1)*D
    "head": ("transformer.h.{l}.attn.c_proj", "pre", lambda args, out: args[0], lambda args, out, x: (x, *args[1:])),
}


def hf_patched(hf, site: str, l: int, index: tuple) -> float:
    """transformers' corrupted run with one activation (batch 0, then `index`) replaced by its clean run's."""
    module, kind, get, put = HF_SITES["head" if site.startswith("head") else site]
    module = module.format(l=l)
    clean = {}

    def read(module_, args, out=None):
        clean["x"] = get(args, out).clone()

    def write(module_, args, out=None):
        x = get(args, out).clone()
        x[(0, *index)] = clean["x"][(0, *index)]
        return put(args, out, x)

    hf_logit_diff(hf, CLEAN, [(module, kind, read)])
    return hf_logit_diff(hf, CORRUPTED, [(module, kind, write)])


def hf_index(site: str, entry: tuple) -> tuple[int, tuple]:
    """An entry of our grid -> (layer, index into transformers' (T, C) tensor at that site)."""
    if site == "head":
        l, h = entry
        return l, (slice(None), slice(h * D, (h + 1) * D))
    if site == "head_pos":
        l, h, t = entry
        return l, (t, slice(h * D, (h + 1) * D))
    l, t = entry
    return l, (t,)


ENTRIES = {
    "resid_pre": [(0, P), (1, P), (1, T - 1)],
    "attn_out": [(0, P), (1, T - 1), (1, P + 1)],
    "mlp_out": [(0, P), (1, T - 1), (0, T - 1)],
    "head": [(0, 1), (1, 2), (1, 3)],
    "head_pos": [(0, 0, P), (1, 2, T - 1), (1, 3, P + 1)],
}


@pytest.mark.parametrize("site", SITES)
def test_entries_equal_transformers_patched_with_hooks(pair, grids, site):
    hf, _ = pair
    assert tuple(grids[site].shape) == SHAPES[site] and grids[site].dtype == torch.float32
    for entry in ENTRIES[site]:
        expected = hf_patched(hf, site, *hf_index(site, entry))
        assert abs(float(grids[site][entry]) - expected) < TOL, (site, entry)
    # the entries checked do change the metric: they are not all the unpatched corrupted run's
    corrupted = hf_logit_diff(hf, CORRUPTED)
    assert max(abs(float(grids[site][e]) - corrupted) for e in ENTRIES[site]) > 1e-2


def test_sanity_against_transformers_unpatched_runs(pair, grids):
    hf, model = pair
    clean, corrupted = hf_logit_diff(hf, CLEAN), hf_logit_diff(hf, CORRUPTED)
    assert abs(clean - corrupted) > 1  # the two runs differ: the checks below can tell them apart
    resid = grids["resid_pre"]
    # the one token that differs, patched where it enters block 0: the whole clean input
    assert abs(float(resid[0, P]) - clean) < TOL
    # where clean == corrupted (the other tokens at block 0, every position before P at any site) nothing changes
    unchanged = [
        resid[0, :P],
        resid[0, P + 1 :],
        resid[:, :P],
        grids["attn_out"][:, :P],
        grids["mlp_out"][:, :P],
        grids["head_pos"][..., :P],
    ]
    for values in unchanged:
        assert torch.allclose(values, torch.full_like(values, corrupted), atol=TOL)
    # normalised: corrupted -> 0, clean -> 1, and in between as transformers' runs place it
    norm = activation_patching(
        model, CLEAN, CORRUPTED, normalised_logit_diff(model, CLEAN, CORRUPTED, ANSWER, OTHER), "resid_pre"
    )
    assert abs(float(norm[0, P]) - 1) < TOL and torch.allclose(norm[0, :P], torch.zeros(P), atol=TOL)
    expected = (hf_patched(hf, "resid_pre", 1, (T - 1,)) - corrupted) / (clean - corrupted)
    assert abs(float(norm[1, T - 1]) - expected) < TOL


@pytest.mark.parametrize("site", SITES)
def test_batched_equals_one_at_a_time(pair, grids, site):
    one = activation_patching(pair[1], CLEAN, torch.tensor(CORRUPTED), logit_diff(ANSWER, OTHER), site, batch_size=1)
    assert tuple(one.shape) == SHAPES[site]
    torch.testing.assert_close(grids[site], one, atol=1e-5, rtol=0)


def test_metric_may_return_a_tensor_or_a_float(pair, grids):
    model = pair[1]
    as_tensor = activation_patching(model, CLEAN, CORRUPTED, lambda lg: lg[-1, ANSWER] - lg[-1, OTHER], "head")
    torch.testing.assert_close(as_tensor, grids["head"], atol=1e-6, rtol=0)


def bad(ours, **changes):
    args = dict(model=ours, clean=CLEAN, corrupted=CORRUPTED, metric=logit_diff(ANSWER, OTHER), site="head")
    return activation_patching(**{**args, **changes})


@pytest.mark.parametrize(
    "changes, error, param, message",
    [
        (
            {"site": "resid_post"},
            InvalidArgumentError,
            "site",
            "unknown site 'resid_post': the sites are resid_pre, attn_out, mlp_out, head, head_pos",
        ),
        (
            {"corrupted": CORRUPTED[:-1]},
            InvalidArgumentError,
            "corrupted",
            "clean and corrupted must have the same length: clean has 7 tokens, corrupted 6",
        ),
        ({"metric": lambda logits: "high"}, InputTypeError, "metric", "metric must return a number .*got str"),
        ({"metric": lambda logits: logits[-1, :2]}, InputTypeError, "metric", r"got a tensor of shape \[2\]"),
        ({"metric": lambda logits: None}, InputTypeError, "metric", "got NoneType"),
        ({"metric": 3.0}, InputTypeError, "metric", "metric must be a function"),
        ({"clean": list(range(CTX + 1))}, ContextLengthError, "clean", "clean: sequence of 17 tokens is longer than"),
        ({"corrupted": [1] * (CTX + 1)}, ContextLengthError, "corrupted", "corrupted: sequence of 17 tokens is longer"),
        ({"corrupted": "no tokenizer"}, InvalidArgumentError, "corrupted", "corrupted: this model has no tokenizer"),
        ({"batch_size": 0}, InvalidArgumentError, "batch_size", "batch_size must be a positive integer"),
        ({"model": "gpt2"}, InputTypeError, "model", "takes a GPT2 model"),
    ],
)
def test_bad_input(pair, changes, error, param, message):
    with pytest.raises(error, match=message) as caught:
        bad(pair[1], **changes)
    assert caught.value.param == param


def test_bad_metric_arguments(pair):
    model = pair[1]
    with pytest.raises(InvalidArgumentError, match="answer must be a token id") as caught:
        logit_diff(-1, 3)
    assert caught.value.param == "answer"
    with pytest.raises(InvalidArgumentError, match="other must be a token id below the model's 97, got 97"):
        bad(model, metric=logit_diff(1, VOCAB))
    with pytest.raises(InvalidArgumentError, match="clean and corrupted give the same logit difference") as caught:
        normalised_logit_diff(model, CLEAN, CLEAN, ANSWER, OTHER)
    assert caught.value.param == "corrupted"


def test_a_metric_of_one_token_against_itself_is_refused_naming_both(pair):
    """logits[-1, a] - logits[-1, a] is 0 for every patch: a grid of zeros, said nowhere, before."""
    for make in (
        lambda: logit_diff(ANSWER, ANSWER),
        lambda: normalised_logit_diff(pair[1], CLEAN, CORRUPTED, OTHER, OTHER),
    ):
        with pytest.raises(InvalidArgumentError, match="^answer and other are the same token") as caught:
            make()
        assert (caught.value.param, caught.value.also) == ("other", ("answer",))  # as gpt2 serve names them


def test_texts_go_through_the_models_tokenizer(pair, grids, monkeypatch):
    model = pair[1]
    monkeypatch.setattr(model, "tokenizer", CharTokenizer([chr(32 + i) for i in range(VOCAB)]))  # id i is chr(32 + i)
    clean, corrupted = ("".join(chr(32 + i) for i in ids) for ids in (CLEAN, CORRUPTED))
    from_text = activation_patching(model, clean, corrupted, logit_diff(ANSWER, OTHER), "head")
    torch.testing.assert_close(from_text, grids["head"], atol=1e-6, rtol=0)


# ------------------------------------------------------------------ attribution patching


def hf_attribution(hf, site: str) -> torch.Tensor:
    """The first-order estimate written out on transformers: metric(corrupted) + (clean - corrupted)
    . d metric / d activation, the activations read with hooks, the gradient by torch.autograd."""
    module, kind, get, _ = HF_SITES["head" if site.startswith("head") else site]
    modules = dict(hf.named_modules())
    estimates = []
    for l in range(N_LAYER):
        seen, run = {}, ["clean"]  # run[0]: the run the hook reads, set below

        def read(module_, args, out=None, seen=seen, run=run):
            seen[run[0]] = get(args, out)

        target = modules[module.format(l=l)]
        handle = target.register_forward_pre_hook(read) if kind == "pre" else target.register_forward_hook(read)
        try:
            with torch.no_grad():
                hf(torch.tensor([CLEAN]))
            run[0] = "corrupted"
            logits = hf(torch.tensor([CORRUPTED])).logits[0]
        finally:
            handle.remove()
        metric = logits[-1, ANSWER] - logits[-1, OTHER]
        (grad,) = torch.autograd.grad(metric, seen["corrupted"])
        product = ((seen["clean"] - seen["corrupted"].detach()) * grad)[0]  # (T, C)
        if site.startswith("head"):  # (T, C) -> (H, T): each head's channels h*D..(h+1)*D
            product = product.view(T, N_HEAD, D).sum(-1).T
            estimates.append(product.sum(-1) if site == "head" else product)
        else:
            estimates.append(product.sum(-1))
        corrupted = float(metric.detach())
    return corrupted + torch.stack(estimates)


@pytest.mark.parametrize("site", SITES)
def test_attribution_equals_the_estimate_on_transformers(pair, grids, site):
    hf, model = pair
    ours = attribution_patching(model, CLEAN, CORRUPTED, logit_diff(ANSWER, OTHER), site)
    assert tuple(ours.shape) == SHAPES[site] and ours.dtype == torch.float32
    expected = hf_attribution(hf, site)
    torch.testing.assert_close(ours, expected, atol=TOL, rtol=0)
    # not the corrupted metric everywhere, and an estimate: not activation patching's values themselves
    assert float((ours - hf_logit_diff(hf, CORRUPTED)).abs().max()) > 1e-2
    assert float((ours - grids[site]).abs().max()) > 1e-2


def test_attribution_ranks_the_sites_as_patching_does_on_the_trained_model():
    """On the shipped model (4 layers of 128, trained here on tinyshakespeare), "York" against
    "Norf(olk)" after one character changed: attribution patching orders the entries of each grid
    as activation patching does. Ranked over the positions from the changed one on: before it the
    two runs are the same, and both grids give the corrupted metric there up to rounding, an order
    of noise. Measured (torch 2.x, CPU): Spearman 0.958 (resid_pre), 0.951 (attn_out), 0.979
    (mlp_out) over 12 entries each (0.57 to 0.59 over the whole grids, the noise's order ranked).
    Asserted: > 0.8, room for rounding on other machines to swap near-equal entries, while wrong
    estimates fall far below (measured: sign flipped -0.95 or less; layers reversed 0.24, -0.60,
    0.64; positions reversed 0.31 at most)."""
    model = GPT2.from_pretrained("shakespeare_char", device="cpu")
    clean, corrupted = "KING RICHARD:\nMy lord of Yor", "KING RICHARD:\nMy lord of Nor"
    P = clean.index("Yor")  # the one character that differs
    k, f = (model.tokenizer.encode_ordinary(c)[0] for c in "kf")
    metric = logit_diff(k, f)
    york, norfolk = (float(metric(trace(model, text, names=()).logits)) for text in (clean, corrupted))
    assert york > 5 and norfolk < 0
    for site, measured in (("resid_pre", 0.958), ("attn_out", 0.951), ("mlp_out", 0.979)):
        real = activation_patching(model, clean, corrupted, metric, site, batch_size=64)
        estimate = attribution_patching(model, clean, corrupted, metric, site)
        assert spearmanr(real[:, P:].flatten(), estimate[:, P:].flatten()).statistic > 0.8, (site, measured)


@pytest.mark.parametrize(
    "changes, error, message",
    [
        ({"metric": logit_diff(ANSWER, OTHER)}, None, None),  # the ready metrics differentiate
        (
            {"metric": lambda logits: logits[-1, ANSWER].item()},
            InputTypeError,
            "metric must return a tensor computed from the logits, to differentiate .*got a float",
        ),
        ({"metric": lambda logits: logits[-1, ANSWER].detach()}, InputTypeError, "got a tensor with no gradient"),
        ({"metric": lambda logits: "high"}, InputTypeError, "metric must return a number .*got str"),
        ({"metric": lambda logits: logits[-1, :2]}, InputTypeError, r"got a tensor of shape \[2\]"),
        (
            {"corrupted": CORRUPTED[:-1]},
            InvalidArgumentError,
            "clean and corrupted must have the same length: clean has 7 tokens, corrupted 6",
        ),
        ({"site": "resid_post"}, InvalidArgumentError, "unknown site 'resid_post': the sites are resid_pre, attn_out"),
        ({"model": "gpt2"}, InputTypeError, "attribution_patching takes a GPT2 model"),
    ],
)
def test_attribution_bad_input(pair, changes, error, message):
    args = {
        "model": pair[1],
        "clean": CLEAN,
        "corrupted": CORRUPTED,
        "metric": lambda lg: lg[-1, ANSWER],
        "site": "head",
        **changes,
    }
    if error is None:
        attribution_patching(**args)
        return
    with pytest.raises(error, match=message) as caught:
        attribution_patching(**args)
    assert caught.value.param == next(iter(changes))


# ------------------------------------------------------------------ TransformerLens's sites, batches (issue 53)

# A batch of three prompts of T tokens, each corrupted at its own position, and each prompt's answer.
BATCH_CLEAN = [CLEAN, [9, 3, 42, 70, 1, 2, 60], [33, 17, 4, 8, 63, 90, 11]]
BATCH_CORRUPTED = [CORRUPTED, [9, 3, 5, 70, 1, 2, 60], [33, 17, 4, 8, 2, 90, 11]]
ANSWERS, OTHERS = [ANSWER, 7, OTHER], [OTHER, 33, ANSWER]
# TransformerLens's patching functions (get_act_patch_{name}) and the site of each in gpt2.
TL_FUNCTIONS = {
    "resid_pre": "resid_pre",
    "resid_mid": "resid_mid",
    "attn_out": "attn_out",
    "mlp_out": "mlp_out",
    "attn_head_out_all_pos": "head",
    "attn_head_out_by_pos": "head_pos",
    "attn_head_q_all_pos": "head_q",
    "attn_head_k_all_pos": "head_k",
    "attn_head_v_all_pos": "head_v",
    "attn_head_pattern_all_pos": "head_pattern",
    "attn_head_q_by_pos": "head_q_pos",
    "attn_head_k_by_pos": "head_k_pos",
    "attn_head_v_by_pos": "head_v_pos",
    "attn_head_pattern_by_pos": "head_pattern_pos",
    "block_every": "block_every",
    "attn_head_all_pos_every": "head_every",
    "attn_head_by_pos_every": "head_pos_every",
}
NEW_SITES = [site for site in TL_FUNCTIONS.values() if site not in SHAPES]
# TransformerLens's axes, as gpt2 orders them: its by-position head grids are (layer, position, head)
TL_POSITION_BEFORE_HEAD = {"attn_head_out_by_pos", "attn_head_q_by_pos", "attn_head_k_by_pos", "attn_head_v_by_pos"}


@pytest.fixture(scope="module")
def tl(pair):
    """TransformerLens's HookedTransformer on the same weights (no folding: the same activations)."""
    return transformer_lens_from_hf(pair[0])


def tl_metric(answers, others, per_prompt: bool = False):
    """logits[:, -1, answer] - logits[:, -1, other] on TransformerLens's (B, T, V), written out: each
    prompt's own tokens; their mean unless per_prompt."""

    def metric(logits):
        rows = torch.arange(logits.size(0))
        diff = logits[rows, -1, torch.tensor(answers)] - logits[rows, -1, torch.tensor(others)]
        return diff if per_prompt else diff.mean()

    return metric


def tl_grid(tl, name: str, clean: list, corrupted: list, metric) -> torch.Tensor:
    """TransformerLens's get_act_patch_{name} of a batch (lists of rows), in gpt2's axis order."""
    with torch.no_grad():
        _, cache = tl.run_with_cache(torch.tensor(clean))
        grid = getattr(tl_patching, f"get_act_patch_{name}")(tl, torch.tensor(corrupted), cache, metric).cpu()
    if name in TL_POSITION_BEFORE_HEAD or name == "attn_head_by_pos_every":
        grid = grid.transpose(-1, -2)  # (..., position, head) -> (..., head, position)
    return grid


ALONE: dict[tuple, torch.Tensor] = {}  # tl_alone's grids, each computed once (several tests read each)


def tl_alone(tl, name: str, b: int, clean=BATCH_CLEAN, corrupted=BATCH_CORRUPTED) -> torch.Tensor:
    """TransformerLens's grid of prompt b alone, on its own answer."""
    key = (id(tl), name, tuple(clean[b]), tuple(corrupted[b]), ANSWERS[b], OTHERS[b])
    if key not in ALONE:
        ALONE[key] = tl_grid(tl, name, [clean[b]], [corrupted[b]], tl_metric([ANSWERS[b]], [OTHERS[b]]))
    return ALONE[key]


@pytest.mark.parametrize("name", TL_FUNCTIONS)
def test_each_site_equals_transformer_lens_on_one_sequence(pair, tl, name):
    site, model = TL_FUNCTIONS[name], pair[1]
    expected = tl_alone(tl, name, 0)  # CLEAN and CORRUPTED, on ANSWER and OTHER
    ours = activation_patching(model, CLEAN, CORRUPTED, logit_diff(ANSWER, OTHER), site, batch_size=5)
    assert ours.shape == expected.shape and ours.dtype == torch.float32
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)
    assert float((expected - expected.flatten()[0]).abs().max()) > 1e-2  # the entries differ: a grid worth comparing
    # TransformerLens's function's name is the site's alias, with or without get_act_patch_
    for alias in (name, f"get_act_patch_{name}"):
        torch.testing.assert_close(activation_patching(model, CLEAN, CORRUPTED, logit_diff(ANSWER, OTHER), alias), ours)


@pytest.mark.parametrize("name", TL_FUNCTIONS)
def test_each_site_on_a_batch_equals_transformer_lens_and_each_prompt_alone(pair, tl, name):
    """A batch of 3: the mean over the prompts as TransformerLens patches the batch as is, and per
    prompt each prompt's grid as TransformerLens's of that prompt alone."""
    site, model = TL_FUNCTIONS[name], pair[1]
    batch, corrupted = torch.tensor(BATCH_CLEAN), torch.tensor(BATCH_CORRUPTED)
    expected = tl_grid(tl, name, BATCH_CLEAN, BATCH_CORRUPTED, tl_metric(ANSWERS, OTHERS))
    mean = activation_patching(model, batch, corrupted, logit_diff(ANSWERS, OTHERS), site, batch_size=7)
    torch.testing.assert_close(mean, expected, atol=1e-5, rtol=0)
    per_prompt = activation_patching(model, batch, corrupted, logit_diff(ANSWERS, OTHERS, per_prompt=True), site)
    assert per_prompt.shape == (3, *expected.shape)
    for b in range(3):
        torch.testing.assert_close(per_prompt[b], tl_alone(tl, name, b), atol=1e-5, rtol=0)


# Texts of different lengths for the character tokenizer (id i is chr(32 + i)), each corrupted at one character.
PADDED_CLEAN = [[5, 17, 42, 8, 63, 29, 11], [9, 3, 42, 70, 1], [33, 17, 4, 8]]
PADDED_CORRUPTED = [CORRUPTED, [9, 3, 5, 70, 1], [33, 17, 60, 8]]


@pytest.mark.parametrize("name", TL_FUNCTIONS)
def test_a_padded_batch_of_texts_gives_each_prompt_its_own_grid(pair, tl, name, monkeypatch):
    """Texts of 7, 5 and 4 tokens padded on the left: each prompt's grid is TransformerLens's of it
    alone at its tokens' positions, and the corrupted run's own metric at its pads (a pad changes nothing)."""
    site, model = TL_FUNCTIONS[name], pair[1]
    monkeypatch.setattr(model, "tokenizer", CharTokenizer([chr(32 + i) for i in range(VOCAB)]))
    texts = [["".join(chr(32 + i) for i in ids) for ids in rows] for rows in (PADDED_CLEAN, PADDED_CORRUPTED)]
    grid = activation_patching(model, *texts, logit_diff(ANSWERS, OTHERS, per_prompt=True), site, batch_size=6)
    for b, ids in enumerate(PADDED_CLEAN):
        alone = tl_alone(tl, name, b, PADDED_CLEAN, PADDED_CORRUPTED)
        pads = T - len(ids)
        by_position = AXES[site][-1] == "position"
        torch.testing.assert_close(grid[b][..., pads:] if by_position else grid[b], alone, atol=1e-5, rtol=0)
        if by_position and pads:
            with torch.no_grad():
                unpatched = tl_metric([ANSWERS[b]], [OTHERS[b]])(tl(torch.tensor([PADDED_CORRUPTED[b]])))
            torch.testing.assert_close(grid[b][..., :pads], torch.full_like(grid[b][..., :pads], float(unpatched)))


def test_padding_on_the_right_is_taken_as_asked(pair, monkeypatch):
    """padding_side="right": position -1 is a pad for the shorter prompts, whose logit difference
    there is not their last token's (a pad sees itself alone), so their grids differ from the left's."""
    model = pair[1]
    metric = logit_diff(ANSWERS, OTHERS, per_prompt=True)
    left = activation_patching(model, PADDED_CLEAN, PADDED_CORRUPTED, metric, "head")
    right = activation_patching(model, PADDED_CLEAN, PADDED_CORRUPTED, metric, "head", padding_side="right")
    torch.testing.assert_close(right[0], left[0], atol=1e-5, rtol=0)  # the longest prompt has no pad
    assert float((right[1] - left[1]).abs().max()) > 1e-2


def test_logit_diff_and_its_normalised_form_on_a_batch(pair, tl):
    """logit_diff on (B, T, V): the mean, or each prompt's; normalised_logit_diff: by the means (as
    TransformerLens's demos), or per prompt by each prompt's own runs, against TransformerLens's grids."""
    model = pair[1]
    logits = torch.randn(3, 5, VOCAB)
    rows = torch.arange(3)
    written = logits[rows, -1, torch.tensor(ANSWERS)] - logits[rows, -1, torch.tensor(OTHERS)]
    torch.testing.assert_close(logit_diff(ANSWERS, OTHERS, per_prompt=True)(logits), written)
    torch.testing.assert_close(logit_diff(ANSWERS, OTHERS)(logits), written.mean())
    torch.testing.assert_close(logit_diff(ANSWER, OTHER)(logits), (logits[:, -1, ANSWER] - logits[:, -1, OTHER]).mean())
    with torch.no_grad():
        low, high = (tl_metric(ANSWERS, OTHERS, True)(tl(torch.tensor(x))) for x in (BATCH_CORRUPTED, BATCH_CLEAN))
    batch = (BATCH_CLEAN, BATCH_CORRUPTED)
    for per_prompt in (False, True):
        metric = normalised_logit_diff(model, *batch, ANSWERS, OTHERS, per_prompt)
        grid = activation_patching(model, *batch, metric, "resid_mid")
        if per_prompt:
            for b in range(3):
                expected = (tl_alone(tl, "resid_mid", b) - low[b]) / (high[b] - low[b])
                torch.testing.assert_close(grid[b], expected, atol=1e-5, rtol=0)
        else:
            tl_mean = tl_grid(tl, "resid_mid", *batch, tl_metric(ANSWERS, OTHERS))
            torch.testing.assert_close(grid, (tl_mean - low.mean()) / (high.mean() - low.mean()), atol=1e-5, rtol=0)


# TransformerLens's hook of each step a site patches, and whether its layout is (B, T, H, ...).
TL_HOOKS = {
    "resid_pre": ("hook_resid_pre", False),
    "resid_mid": ("hook_resid_mid", False),
    "attn.c_proj": ("hook_attn_out", False),
    "mlp.c_proj": ("hook_mlp_out", False),
    "attn.z": ("attn.hook_z", True),
    "attn.q": ("attn.hook_q", True),
    "attn.k": ("attn.hook_k", True),
    "attn.v": ("attn.hook_v", True),
    "attn.pattern": ("attn.hook_pattern", False),  # (B, H, T, S): heads first already
}
SITE_STEPS = {
    "resid_pre": ["resid_pre"],
    "resid_mid": ["resid_mid"],
    "attn_out": ["attn.c_proj"],
    "mlp_out": ["mlp.c_proj"],
    **{f"head{k}": ["attn.z"] for k in ("", "_pos")},
    **{f"head_{s}{k}": [f"attn.{s}"] for s in ("q", "k", "v", "pattern") for k in ("", "_pos")},
    "block_every": ["resid_pre", "attn.c_proj", "mlp.c_proj"],
    **{f"head{k}_every": ["attn.z", "attn.q", "attn.k", "attn.v", "attn.pattern"] for k in ("", "_pos")},
}


def tl_attribution(tl, site: str, clean, corrupted, answers, others, per_prompt: bool) -> torch.Tensor:
    """The first-order estimate written out on TransformerLens, as its attribution patching demo
    computes it: the clean run's activations from its cache, the corrupted run's and their
    gradients through its hooks and autograd; metric(corrupted) + (clean - corrupted) . gradient,
    summed over each activation's features (and the positions, for sites at every position)."""
    names = [f"blocks.{l}.{TL_HOOKS[step][0]}" for step in SITE_STEPS[site] for l in range(N_LAYER)]
    with torch.no_grad():
        _, cache = tl.run_with_cache(torch.tensor(clean))
    seen = {}

    def keep(x, hook):
        x.retain_grad()
        seen[hook.name] = x

    logits = tl.run_with_hooks(torch.tensor(corrupted), fwd_hooks=[(name, keep) for name in names])
    values = tl_metric(answers, others, per_prompt=True)(logits)  # (B,)
    (values if per_prompt else values.mean()).sum().backward()
    tl.zero_grad(set_to_none=True)
    by_position = site.endswith("_pos") or site.endswith("_pos_every") or not site.startswith("head")
    estimates = []
    for name, step in zip(names, [s for s in SITE_STEPS[site] for _ in range(N_LAYER)]):
        product = (cache[name] - seen[name].detach()) * seen[name].grad
        if TL_HOOKS[step][1]:
            product = product.transpose(1, 2)  # (B, T, H, d) -> (B, H, T, d)
        product = product.sum(-1) if by_position else product.sum((-2, -1))
        estimates.append(product if per_prompt else product.sum(0))
    value = values.detach() if per_prompt else values.mean().detach()
    stacked = torch.stack(estimates, dim=1 if per_prompt else 0)
    return (value.view(-1, *[1] * (stacked.dim() - 1)) + stacked if per_prompt else value + stacked).detach()


ATTRIBUTION_TOL = {"atol": 1e-5, "rtol": 1e-5}  # sums of products of order 1: float32's rounding of values up to ~4


@pytest.mark.parametrize("site", NEW_SITES)
def test_attribution_on_the_new_sites_equals_the_estimate_on_transformer_lens(pair, tl, site):
    model = pair[1]
    shape = SHAPES.get(site) or activation_patching(model, CLEAN, CORRUPTED, logit_diff(ANSWER, OTHER), site).shape
    one = attribution_patching(model, CLEAN, CORRUPTED, logit_diff(ANSWER, OTHER), site)
    expected = tl_attribution(tl, site, [CLEAN], [CORRUPTED], [ANSWER], [OTHER], False).view(shape)
    torch.testing.assert_close(one, expected, **ATTRIBUTION_TOL)
    assert float((one - one.flatten()[0]).abs().max()) > 1e-2
    for per_prompt in (False, True):
        ours = attribution_patching(
            model, BATCH_CLEAN, BATCH_CORRUPTED, logit_diff(ANSWERS, OTHERS, per_prompt=per_prompt), site
        )
        expected = tl_attribution(tl, site, BATCH_CLEAN, BATCH_CORRUPTED, ANSWERS, OTHERS, per_prompt)
        torch.testing.assert_close(ours, expected.view(ours.shape), **ATTRIBUTION_TOL)
        assert ours.shape == ((3, *shape) if per_prompt else tuple(shape))


def test_attribution_per_prompt_on_a_padded_batch_is_each_prompts_own(pair, tl):
    model = pair[1]
    ours = attribution_patching(
        model, PADDED_CLEAN, PADDED_CORRUPTED, logit_diff(ANSWERS, OTHERS, per_prompt=True), "head_pos_every"
    )
    for b, ids in enumerate(PADDED_CLEAN):
        alone = tl_attribution(
            tl, "head_pos_every", [ids], [PADDED_CORRUPTED[b]], [ANSWERS[b]], [OTHERS[b]], False
        ).view(5, N_LAYER, N_HEAD, len(ids))
        torch.testing.assert_close(ours[b][..., T - len(ids) :], alone, **ATTRIBUTION_TOL)


class Alternating:
    """A metric that returns a number, then one per prompt, then a number..."""

    def __init__(self):
        self.calls = 0

    def __call__(self, logits):
        self.calls += 1
        diff = logits[:, -1, ANSWER] - logits[:, -1, OTHER]
        return diff if self.calls % 2 else diff.mean()


@pytest.mark.parametrize(
    "changes, error, param, message",
    [
        (
            {"corrupted": CORRUPTED},
            InvalidArgumentError,
            "corrupted",
            "clean is a batch of prompts and corrupted one sequence: give both as batches of the same shape",
        ),
        (
            {"corrupted": BATCH_CORRUPTED[:2]},
            InvalidArgumentError,
            "corrupted",
            "clean and corrupted must be batches of as many prompts: clean has 3, corrupted 2",
        ),
        (
            {"corrupted": [BATCH_CORRUPTED[0], BATCH_CORRUPTED[1][:5], BATCH_CORRUPTED[2]]},
            InvalidArgumentError,
            "corrupted",
            "clean and corrupted must have the same length, prompt by prompt: prompt 1 has 7 tokens in clean, 5 in",
        ),
        (
            {"metric": lambda logits: logits[:, -1, :4]},
            InputTypeError,
            "metric",
            r"metric must return a number \(a float, or a tensor of one element\) or one per prompt \(a tensor "
            r"of shape \[3\]\), got a tensor of shape \[3, 4\]",
        ),
        ({"metric": lambda logits: logits[:, :, 0]}, InputTypeError, "metric", r"got a tensor of shape \[3, 7\]"),
        ({"metric": lambda logits: logits[:2, -1, 0]}, InputTypeError, "metric", r"got a tensor of shape \[2\]"),
        ({"metric": Alternating()}, InputTypeError, "metric", "a number for some patches and one per prompt for"),
        (
            {"metric": lambda logits: logit_diff([ANSWER, OTHER], [OTHER, ANSWER])(logits)},
            InvalidArgumentError,
            "answer",
            "answer gives 2 token ids, one per prompt, but the logits are of 3 prompts",
        ),
        (
            {"site": "attn_head_z_by_pos"},
            InvalidArgumentError,
            "site",
            "unknown site 'attn_head_z_by_pos': the sites are resid_pre, attn_out, mlp_out, head, head_pos, "
            "resid_mid, head_q, head_k, head_v, head_pattern, head_q_pos, head_k_pos, head_v_pos, "
            r"head_pattern_pos, block_every, head_every, head_pos_every \(or TransformerLens's function names",
        ),
        ({"padding_side": "middle"}, InvalidArgumentError, "padding_side", "padding_side must be right or left"),
        (
            {"clean": [CLEAN, [1] * (CTX + 1), CLEAN]},
            ContextLengthError,
            "clean",
            "clean: ids\\[1\\]: sequence of 17 tokens is longer",
        ),
    ],
)
def test_bad_batches(pair, changes, error, param, message):
    args = {
        "model": pair[1],
        "clean": BATCH_CLEAN,
        "corrupted": BATCH_CORRUPTED,
        "metric": logit_diff(ANSWERS, OTHERS),
        "site": "head_q_pos",
        **changes,
    }
    for patching in (activation_patching, attribution_patching):
        if patching is attribution_patching and isinstance(args["metric"], Alternating):
            continue  # one value only: nothing to alternate
        with pytest.raises(error, match=message) as caught:
            patching(**args)
        assert caught.value.param == param


def test_bad_answers_for_a_batch(pair):
    with pytest.raises(InvalidArgumentError, match="answer and other must give as many token ids") as caught:
        logit_diff([1, 2], [3, 4, 5])
    assert (caught.value.param, caught.value.also) == ("other", ("answer",))
    with pytest.raises(InvalidArgumentError, match="^prompt 1: answer and other are the same token") as caught:
        logit_diff([1, 2, 3], [4, 2, 5])
    assert caught.value.param == "other"
    with pytest.raises(InvalidArgumentError, match="answer must be a token id .*or a list of one per prompt"):
        logit_diff([1, -2], 3)
    with pytest.raises(InvalidArgumentError, match="per_prompt must be True or False"):
        logit_diff(1, 2, per_prompt=1)
    same = [BATCH_CLEAN[0], BATCH_CLEAN[1], BATCH_CORRUPTED[2]]  # prompt 0 and 1: clean is corrupted
    normalised_logit_diff(pair[1], BATCH_CLEAN, same, ANSWERS, OTHERS)  # the means differ: fine
    with pytest.raises(InvalidArgumentError, match="^prompt 0: clean and corrupted give the same logit") as caught:
        normalised_logit_diff(pair[1], BATCH_CLEAN, same, ANSWERS, OTHERS, per_prompt=True)
    assert caught.value.param == "corrupted"


def test_a_metric_per_prompt_on_one_sequence_is_a_number(pair, grids):
    """One sequence stays as it was: a metric of (T, V), a grid of the site's shape, even with per_prompt."""
    model = pair[1]
    seen = []
    grid = activation_patching(
        model, CLEAN, CORRUPTED, lambda lg: seen.append(lg.shape) or lg[-1, ANSWER] - lg[-1, OTHER], "head"
    )
    assert seen[0] == (T, VOCAB) and grid.shape == SHAPES["head"]
    per_prompt = activation_patching(model, CLEAN, CORRUPTED, logit_diff(ANSWER, OTHER, per_prompt=True), "head")
    torch.testing.assert_close(per_prompt, grids["head"], atol=1e-6, rtol=0)
    torch.testing.assert_close(grid, grids["head"], atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["resid_pre", "attn_head_k_by_pos", "attn_head_pattern_by_pos", "block_every"])
def test_a_metric_of_every_position_is_given_the_whole_logits(pair, tl, name):
    """A metric that does not say it reads the last position only gets the batch's whole logits
    (B, T, V): the positions before a patch from the corrupted run, the rest from the patched one."""
    seen = set()

    def every_position(logits):  # each position's logit difference, averaged
        seen.add(tuple(logits.shape))
        return (logits[:, :, ANSWER] - logits[:, :, OTHER]).mean()

    expected = tl_grid(tl, name, BATCH_CLEAN, BATCH_CORRUPTED, every_position)
    seen.clear()
    ours = activation_patching(pair[1], BATCH_CLEAN, BATCH_CORRUPTED, every_position, TL_FUNCTIONS[name])
    assert seen == {(3, T, VOCAB)}
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)


def test_prepend_bos_patches_the_text_after_endoftext(tmp_path):
    hf, model = hf_and_ours(tmp_path, 0, vocab_size=50257, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    model.tokenizer = Tokenizer.gpt2()
    clean, corrupted = "When Mary and John went out, John gave it to", "When Mary and John went out, Mary gave it to"
    metric = logit_diff(5118, 1757)
    eot = [50256]
    as_ids = [eot + model.tokenizer.encode_ordinary(t) for t in (clean, corrupted)]
    for patching in (activation_patching, attribution_patching):
        with_bos = patching(model, clean, corrupted, metric, "resid_pre", prepend_bos=True)
        assert with_bos.shape == (2, len(as_ids[0]))
        assert torch.equal(with_bos, patching(model, *as_ids, metric, "resid_pre"))
        assert with_bos.shape != patching(model, clean, corrupted, metric, "resid_pre").shape  # the default: none
