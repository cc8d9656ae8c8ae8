"""gpt2.inspect.figures: what each picture shows is what transformers computes for the same weights
(its attention probabilities, its hidden states read out, its own temperature, top-k and top-p
warpers), and the pictures are written as PNG files."""

from __future__ import annotations

import matplotlib.image
import pytest
import torch
from helpers import hf_and_ours

from gpt2 import InvalidArgumentError
from gpt2.generation.sampling import Sampling
from gpt2.inspect.figures import attention, head_grids, logit_lens, next_token, save
from gpt2.inspect.tracing import trace

TOL = 1e-4


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """transformers' model (eager attention) and gpt2's, GPT-2's vocabulary, the same random weights."""
    return hf_and_ours(
        tmp_path_factory.mktemp("model"), n_positions=32, n_embd=48, n_layer=2, n_head=3, attn_implementation="eager"
    )


TEXT = "The dog chased the cat up the tree"


def test_attention_panels_are_transformers_probabilities(models, tmp_path):
    hf, model = models
    t = trace(model, TEXT)
    with torch.no_grad():
        expected = hf(torch.tensor([t.ids]), output_attentions=True).attentions[1][0]  # (H, T, T)
    fig = attention(t, 1)
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == 3
    for head, ax in enumerate(panels):
        assert (torch.tensor(ax.images[0].get_array()) - expected[head]).abs().max() < TOL
        assert [label.get_text() for label in ax.get_yticklabels()] == [
            "The",
            "␣dog",
            "␣chased",
            "␣the",
            "␣cat",
            "␣up",
            "␣the",
            "␣tree",
        ]
    save(fig, tmp_path / "a.png")
    image = matplotlib.image.imread(tmp_path / "a.png")
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 300


def test_logit_lens_cells_are_transformers_hidden_states_read_out(models):
    hf, model = models
    t = trace(model, TEXT)
    with torch.no_grad():
        out = hf(torch.tensor([t.ids]), output_hidden_states=True)
        probs = [torch.softmax(hf.lm_head(hf.transformer.ln_f(h))[0], -1) for h in out.hidden_states[:-1]]
        probs.append(torch.softmax(out.logits[0], -1))  # the last hidden state has ln_f applied
    fig = logit_lens(t)
    ax = fig.axes[0]
    shown = torch.tensor(ax.images[0].get_array())  # (layers + 1, T): the top token's probability
    expected = torch.stack([p.max(-1).values for p in probs])
    assert (shown - expected).abs().max() < TOL
    cells = {(round(x.get_position()[1]), round(x.get_position()[0])): x.get_text() for x in ax.texts}
    tokenizer = model.tokenizer
    for layer, p in enumerate(probs):
        for position in range(len(t.ids)):
            top = int(p[position].argmax())
            text = repr(tokenizer.decode([top]))[1:-1].replace(" ", "␣")[:8]
            assert cells[layer, position] == f"{text}\n{float(p[position, top]):.0%}"


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 5, None), (1.3, None, 0.9), (0.5, 20, 0.8)])
def test_next_token_bars_are_what_transformers_samples_from(models, temperature, top_k, top_p):
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    hf, model = models
    t = trace(model, TEXT)
    position = 3
    with torch.no_grad():
        logits = hf(torch.tensor([t.ids])).logits[0, position][None]
    warpers = LogitsProcessorList(
        [TemperatureLogitsWarper(temperature)]
        + ([TopKLogitsWarper(top_k)] if top_k else [])
        + ([TopPLogitsWarper(top_p)] if top_p else [])
    )
    after = torch.softmax(warpers(torch.tensor([t.ids[: position + 1]]), logits.clone())[0], -1)
    before = torch.softmax(logits[0], -1)
    fig = next_token(t, position, Sampling(temperature, top_k, top_p), bars=15)
    left, right = (ax for ax in fig.axes)
    top = before.topk(15).indices
    assert torch.tensor([bar.get_height() for bar in left.patches]).sub(before[top]).abs().max() < TOL
    assert torch.tensor([bar.get_height() for bar in right.patches]).sub(after[top]).abs().max() < TOL
    assert fig._suptitle.get_text() == "the next token after position 3 (␣the)"


def test_head_grids_draws_a_heat_map_per_kind_with_each_value(tmp_path):
    scores = {
        "previous_token": torch.rand(3, 5, generator=torch.Generator().manual_seed(0)),
        "duplicate_token": torch.rand(3, 5, generator=torch.Generator().manual_seed(1)),
        "induction": None,
    }
    fig = head_grids(scores, "head scores on a text")
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["previous_token", "duplicate_token", "induction"]
    for ax, values in zip(panels[:2], scores.values()):
        assert torch.equal(torch.tensor(ax.images[0].get_array()), values)  # rows: layers, columns: heads
        assert ax.images[0].get_clim() == (0, 1) and (ax.get_xlabel(), ax.get_ylabel()) == ("head", "layer")
        cells = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in ax.texts}
        assert cells == {(l, h): f"{float(values[l, h]):.2f}" for l in range(3) for h in range(5)}
    assert not panels[2].images and panels[2].texts[0].get_text() == "no token repeats:\nnothing to score"
    assert fig._suptitle.get_text() == "head scores on a text" and len(fig.axes) == 4  # the three and a colour bar
    save(fig, tmp_path / "h.png")
    height, width, _ = matplotlib.image.imread(tmp_path / "h.png").shape
    assert height > 150 and width > 2.5 * height  # three panels side by side


def test_head_grids_signed_is_one_scale_symmetric_about_zero(tmp_path):
    """An experiment's per-head effects (a logit difference): red and blue about 0, the largest effect the bound."""
    grids = {"effect": torch.tensor([[0.5, -2.0], [1.0, 0.25]]), "other": torch.tensor([[0.1, 0.0], [0.0, 1.5]])}
    fig = head_grids(grids, "an experiment", signed=True, label="")
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["effect", "other"]
    for ax in panels:
        assert ax.images[0].get_clim() == (-2.0, 2.0) and ax.images[0].get_cmap().name == "RdBu"
    cells = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in panels[0].texts}
    assert cells == {(0, 0): "0.50", (0, 1): "-2.00", (1, 0): "1.00", (1, 1): "0.25"}
    save(fig, tmp_path / "e.png")


def test_pictures_refuse_what_they_cannot_draw(models):
    _, model = models
    t = trace(model, TEXT, names=["ln_f"])
    with pytest.raises(InvalidArgumentError, match=r"did not record h\.0\.attn\.pattern"):
        attention(t, 0)
    with pytest.raises(
        InvalidArgumentError, match=r"position must be a whole number in 0\.\.7 \(or -8\.\.-1 from the end\), got 8"
    ):
        next_token(trace(model, TEXT), 8, Sampling())
    with pytest.raises(InvalidArgumentError, match="temperature must be a finite number >= 0"):
        next_token(trace(model, TEXT), 0, Sampling(-1.0))
    with pytest.raises(InvalidArgumentError, match="no kind has scores to draw"):
        head_grids({"induction": None}, "nothing")
