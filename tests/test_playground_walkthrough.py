"""The playground's Walkthrough view (ui/walkthrough.js) in Chromium, driven by Playwright: a prompt
walked through the model's forward pass by POST /v1/walk, each step drawn. What the page shows is
read back (its elements, its canvases' pixels, its pictures' coordinates) and checked against the
route's answer, and where there is one against an independent reference: transformers' logits for
the next token's probabilities at a temperature and its GELU for the MLP's, tiktoken for the BPE's
tokens, tinyshakespeare's characters for the character model's, NumPy for LayerNorm's statistics.

One walked page a model, for speed: a tiny random GPT-2 with the BPE tokenizer, shakespeare_char
(the model gpt2 ships: characters), and tests/fixtures/induction_2l (no tokenizer: ids). The
screenshots test-artifacts/walkthrough.png (README's) and walkthrough-char.png are to be looked at.
"""

from __future__ import annotations

import json
import math

import httpx
import numpy as np
import pytest
import torch
from browser_fixtures import Watched, screenshot
from helpers import VOCAB, Running, corpus, hf_and_ours, positions_written_out
from playwright.sync_api import expect

from gpt2 import GPT2Config, Tokenizer
from gpt2.model.model import GPT2

pytestmark = pytest.mark.browser

PROMPT = "Hello, world of walks"
CHAR_PROMPT = "ROMEO:\nBut soft, what light"
IDS_PROMPT = "1 2 3 4, 5 1 2 3"


def walk_on_the_page(browser, url: str, prompt: str, by_address: bool = False) -> Watched:
    """A page opened at / with its Walkthrough view chosen (or opened at /#walkthrough), `prompt` typed and walked."""
    watched = Watched(browser, url + "/#walkthrough" if by_address else url)
    page = watched.page
    if not by_address:
        page.get_by_role("button", name="Walkthrough", exact=True).click()
    expect(page.get_by_label("Walkthrough prompt")).not_to_have_value("")  # the view's default, once it is shown
    page.get_by_label("Walkthrough prompt").fill(prompt)
    page.get_by_role("button", name="Walk", exact=True).click()
    page.wait_for_selector('[data-step="logits"]')
    return watched


def api_walk(url: str, prompt: str | list[int], top_k: int = 50) -> dict:
    response = httpx.post(url + "/v1/walk", json={"prompt": prompt, "top_k": top_k}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(transformers' model, a server of gpt2's on the same weights): a random GPT-2 with the BPE tokenizer."""
    hf, model = hf_and_ours(
        tmp_path_factory.mktemp("walk"), seed=7, vocab_size=50257, n_positions=128, n_embd=48, n_layer=2, n_head=3
    )
    running = Running(lambda: (model, Tokenizer.gpt2()), "tiny")
    yield hf, running
    running.stop()


@pytest.fixture(scope="module")
def tiny_page(browser, tiny):
    watched = walk_on_the_page(browser, tiny[1].url, PROMPT)
    yield watched
    watched.close()


@pytest.fixture(scope="module")
def tiny_walk(tiny) -> dict:
    return api_walk(tiny[1].url, PROMPT)


# ------------------------------------------------------------------ reading the pictures back


# The page's colours: white at 0, dark blue at +1 (red channel 255 - 247 t), red at -1 (green 255 - 200 t).
def unshade(red: int, green: int) -> float:
    return (255 - red) / 247 if red < 255 else -(255 - green) / 200


def strip_cells(page, name: str) -> dict:
    """A step's strip read back: each cell's (red, green) at its centre, with the strip's data."""
    return page.evaluate(
        """(name) => {
        const canvas = document.querySelector(`[data-step="${name}"] canvas.strip`);
        const cell = Number(canvas.dataset.cell), cells = canvas.width / cell;
        const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, 1).data;
        const colours = Array.from({length: cells}, (_, c) => {
            const x = Math.floor((c + 0.5) * cell);
            return [data[4 * x], data[4 * x + 1]];
        });
        return {per: Number(canvas.dataset.per), scale: Number(canvas.dataset.scale), colours};
    }""",
        name,
    )


def last_rows(page, name: str) -> list[list[float]]:
    """A pattern step's grids read back: per head, the last query's row, each weight from its cell's
    red (drawn as sqrt(p))."""
    return page.evaluate(
        """(name) => Array.from(document.querySelectorAll(`[data-step="${name}"] canvas[data-head]`), (canvas) => {
        const d = canvas.dataset, cw = Number(d.cw), T = canvas.width / cw;
        const y = Number(d.lastTop) + Math.floor(Number(d.lastHeight) / 2);
        const data = canvas.getContext('2d').getImageData(0, y, canvas.width, 1).data;
        return Array.from({length: T}, (_, k) => ((255 - data[4 * (k * cw + Math.floor((cw - 1) / 2))]) / 247) ** 2);
    })""",
        name,
    )


def strongest(values: list[float], per: int) -> list[float]:
    """Each run of `per` values's largest in size, as a strip of more values than cells draws it."""
    runs = [values[i : i + per] for i in range(0, len(values), per)]
    return [max(run, key=abs) for run in runs]


# ------------------------------------------------------------------ the BPE model


def test_every_step_is_drawn_once_with_its_shape_formula_and_values(tiny_page, tiny_walk):
    page, answer = tiny_page.page, tiny_walk
    n_head, T = answer["model"]["n_head"], len(answer["ids"])
    assert answer["steps"][0]["name"] == "wte" and answer["steps"][-1]["name"] == "logits"
    for step in answer["steps"]:
        element = page.locator(f'[data-step="{step["name"]}"]')
        expect(element).to_have_count(1)
        text = element.inner_text()
        assert "(" + ", ".join(map(str, step["shape"])) + ")" in text and step["math"] in text, step["name"]
        if step["name"].endswith(".attn.pattern"):
            shown = last_rows(page, step["name"])
            assert len(shown) == n_head and step["shape"] == [n_head, T, T]
            for head, row in zip(shown, step["values"], strict=True):
                assert max(abs(math.sqrt(a) - math.sqrt(b)) for a, b in zip(head, row, strict=True)) < 1.5 / 247
            continue
        drawn = strip_cells(page, step["name"])
        values = step["values"]
        assert drawn["scale"] == pytest.approx(max(map(abs, values)), abs=1e-12)
        expected = strongest(values, drawn["per"])  # the logits' 50257 values: a cell a run
        shown = [unshade(r, g) * drawn["scale"] for r, g in drawn["colours"]]
        assert len(shown) == len(expected) and len(values) == step["shape"][-1]
        assert max(abs(a - b) for a, b in zip(shown, expected)) <= drawn["scale"] / 150, step["name"]


def merge_lines(page) -> list[dict]:
    """The BPE view read back: per piece of the text, its lines, each its chips' text and whether it is marked."""
    return page.eval_on_selector_all(
        ".bpe-word",
        """words => words.map(w => ({word: w.dataset.word,
            lines: Array.from(w.querySelectorAll('.merge-step'), line => Array.from(line.querySelectorAll('.chip'),
                c => ({text: c.textContent, merged: c.classList.contains('merged')})))}))""",
    )


def test_the_bpe_merges_show_each_words_steps_and_end_in_tiktokens_tokens(tiny_page, tiny_walk, tiktoken_gpt2):
    page = tiny_page.page
    expect(page.locator("#walk-tokenizer")).to_contain_text("GPT-2's byte-level BPE")
    words = merge_lines(page)
    assert "".join(w["word"] for w in words) == PROMPT
    assert [w["word"] for w in words] == [w["word"] for w in tiny_walk["bpe"]]
    for word, walked in zip(words, tiny_walk["bpe"], strict=True):
        assert [[c["text"] for c in line] for line in word["lines"]] == walked["merges"]
        for before, after in zip(word["lines"], word["lines"][1:]):  # one pair merged a line, and it is marked
            marked = [i for i, c in enumerate(after) if c["merged"]]
            assert len(marked) == 1 and len(after) == len(before) - 1
            i = marked[0]
            assert after[i]["text"] == before[i]["text"] + before[i + 1]["text"]
    encoder = json.loads((VOCAB / "encoder.json").read_text(encoding="utf-8"))  # GPT-2's letters -> ids
    final = [encoder[c["text"]] for w in words for c in w["lines"][-1]]
    assert final == tiktoken_gpt2.encode_ordinary(PROMPT) == tiny_walk["ids"]
    chips = page.eval_on_selector_all(".chips.tokens .chip", "cs => cs.map(c => Number(c.dataset.tokenId))")
    assert chips == final


def test_the_temperature_slider_redraws_the_softmax_over_all_the_logits(tiny_page, tiny, tiny_walk):
    page, hf = tiny_page.page, tiny[0]
    with torch.no_grad():
        logits = hf(torch.tensor([tiny_walk["ids"]])).logits[0, -1].double()  # transformers' own, (V,)
    slider = page.get_by_label("Walkthrough temperature")
    for temperature in (1, 0.5, 2):
        slider.fill(str(temperature))
        expect(page.locator("#walk-temperature-value")).to_have_text(f"{temperature:.2f}")
        reference = torch.softmax(logits / temperature, dim=-1)
        shown = page.eval_on_selector_all(
            "[data-next-id]",
            "els => els.map(e => ({id: Number(e.dataset.nextId), p: Number(e.dataset.prob), text: e.innerText}))",
        )
        assert len(shown) == 10
        assert [s["p"] for s in shown] == sorted((s["p"] for s in shown), reverse=True)
        for s in shown:
            expected = float(reference[s["id"]])
            assert abs(s["p"] - expected) < 1e-3 and abs(s["p"] / expected - 1) < 1e-3, (temperature, s)
            percent = float(s["text"].split()[-1].rstrip("%"))  # three significant digits
            assert percent == pytest.approx(100 * s["p"], rel=5e-3)
        tenth = shown[-1]["p"]
        assert int((reference > tenth * (1 + 1e-3)).sum()) <= 9  # no token left out is more likely than these
    slider.fill("1")


def test_gelu_draws_the_last_blocks_pre_activations_on_transformers_curve(tiny_page, tiny_walk):
    from transformers.activations import NewGELUActivation

    page, answer = tiny_page.page, tiny_walk
    last = answer["model"]["n_layer"] - 1
    assert page.get_by_label("Block of the MLP").input_value() == str(last)
    steps = {s["name"]: s["values"] for s in answer["steps"]}
    pre, post = np.array(steps[f"h.{last}.mlp.c_fc"]), np.array(steps[f"h.{last}.mlp.gelu"])
    dots = page.evaluate("""() => {
        const box = document.getElementById('walk-gelu'), d = box.dataset;
        return Array.from(box.querySelectorAll('circle'), c => [
            Number(d.lo) + (Number(c.getAttribute('cx')) - Number(d.left)) / Number(d.sx),
            Number(d.yhi) - (Number(c.getAttribute('cy')) - Number(d.top)) / Number(d.sy)]);
    }""")
    assert len(dots) == 4 * answer["model"]["n_embd"]
    np.testing.assert_allclose(np.array(dots), np.stack([pre, post], axis=1), atol=1e-3)
    reference = NewGELUActivation()(torch.tensor(pre)).numpy()  # transformers' GELU: GPT-2's tanh approximation
    np.testing.assert_allclose(post, reference, atol=1e-4)


def test_layernorm_shows_each_norms_input_and_output_mean_and_deviation(tiny_page, tiny_walk):
    page, answer = tiny_page.page, tiny_walk
    v = {s["name"]: np.array(s["values"], dtype=np.float64) for s in answer["steps"]}
    stream, norms = v["wte"] + v["wpe"], []
    for i in range(answer["model"]["n_layer"]):
        norms.append((f"h.{i}.ln_1", stream, v[f"h.{i}.ln_1"]))
        norms.append((f"h.{i}.ln_2", stream + v[f"h.{i}.attn.c_proj"], v[f"h.{i}.ln_2"]))
        stream = v[f"h.{i}"]
    norms.append(("ln_f", stream, v["ln_f"]))
    shown = page.get_by_label("LayerNorm").locator("[data-ln]")
    expect(shown).to_have_count(len(norms))
    for row, (name, x, y) in zip(shown.all(), norms, strict=True):
        assert row.get_attribute("data-ln") == name
        for key, value in {"in-mean": x.mean(), "in-std": x.std(), "out-mean": y.mean(), "out-std": y.std()}.items():
            assert float(row.get_attribute(f"data-{key}")) == pytest.approx(value, abs=1e-9), (name, key)
        text = row.inner_text().replace("−", "-")
        assert f"σ {x.std():.3f}" in text and f"σ {y.std():.3f}" in text


def test_the_position_embedding_is_its_table_as_a_heat_map_and_its_curves(tiny_page, tiny_walk):
    page, positions = tiny_page.page, tiny_walk["positions"]
    heat = np.array(positions["heat"])
    colours = page.evaluate("""() => {
        const c = document.getElementById('walk-positions-heat'), d = c.dataset;
        const [left, top, cw, ch] = [d.left, d.top, d.cw, d.ch].map(Number);
        const data = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        const rows = [];
        for (let r = 0; top + r * ch < c.height - 4; r++) {
            const row = [];
            for (let k = 0; left + k * cw < c.width - 4; k++) {
                const i = 4 * ((top + r * ch + Math.floor(ch / 2)) * c.width + left + k * cw + Math.floor(cw / 2));
                row.push([data[i], data[i + 1]]);
            }
            rows.push(row);
        }
        return {rows, scale: Number(d.scale)};
    }""")
    shown = np.array([[unshade(r, g) for r, g in row] for row in colours["rows"]]) * colours["scale"]
    assert shown.shape == heat.shape and colours["scale"] == pytest.approx(np.abs(heat).max())
    assert np.abs(shown - heat).max() <= colours["scale"] / 150
    figure = page.get_by_label("Position embeddings")
    expect(figure.locator("polyline")).to_have_count(len(positions["curves"]["dims"]))
    expect(figure).to_contain_text("Learned positions")


def test_a_step_clicked_or_entered_says_what_it_computes_and_why(tiny_page, tiny_walk):
    page = tiny_page.page
    about = {s["name"]: s["about"] for s in tiny_walk["steps"]}
    step = page.locator('[data-step="h.0.attn.pattern"]')
    expect(step.locator(".about")).to_be_hidden()
    step.click()
    expect(step.locator(".about")).to_be_visible()
    expect(step.locator(".about")).to_have_text(about["h.0.attn.pattern"])
    logits = page.locator('[data-step="logits"]')
    logits.locator("summary").focus()
    page.keyboard.press("Enter")
    expect(logits.locator(".about")).to_have_text(about["logits"])
    page.keyboard.press("Enter")
    expect(logits.locator(".about")).to_be_hidden()
    page.evaluate("document.activeElement.blur()")  # no focus ring in the picture
    screenshot(page, "walkthrough.png")  # README's picture: the pattern step open


def test_the_bpe_page_asks_nothing_of_another_origin_and_logs_no_error(tiny_page, tiny):
    assert all(url.startswith(tiny[1].url) or url.startswith("data:") for url in tiny_page.requests)
    assert tiny_page.errors == []


# ------------------------------------------------------------------ shakespeare_char: characters


@pytest.fixture(scope="module")
def char_page(browser, char_served):
    watched = walk_on_the_page(browser, char_served.url, CHAR_PROMPT)
    yield watched
    watched.close()


def test_on_shakespeare_char_the_tokens_are_its_characters_and_every_step_is_drawn(char_page, char_served):
    page, answer = char_page.page, api_walk(char_served.url, CHAR_PROMPT)
    characters = sorted(set(corpus()[1]))  # the model's vocabulary: tinyshakespeare's characters, in order
    assert answer["ids"] == [characters.index(c) for c in CHAR_PROMPT] and answer["bpe"] is None
    expect(page.locator("#walk-tokenizer")).to_contain_text("by characters: each character is one token, no merges")
    bpe = page.get_by_label("BPE merges")
    assert bpe.locator(".chip").evaluate_all("cs => cs.map(c => Number(c.dataset.tokenId))") == answer["ids"]
    expect(bpe.locator(".merge-step")).to_have_count(0)
    for step in answer["steps"]:
        expect(page.locator(f'[data-step="{step["name"]}"]')).to_have_count(1)
    expect(page.locator('[data-step="h.0.attn.pattern"] canvas[data-head]')).to_have_count(answer["model"]["n_head"])
    screenshot(page, "walkthrough-char.png")
    page.set_viewport_size({"width": 390, "height": 844})  # a phone: no sideways scrolling of the page
    try:
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
    finally:
        page.set_viewport_size({"width": 1280, "height": 900})
    assert all(url.startswith(char_served.url) or url.startswith("data:") for url in char_page.requests)
    assert char_page.errors == []


def test_a_refused_walk_shows_the_servers_message_beside_the_button(char_page):
    page = char_page.page
    error, button = page.locator("#walk-error"), page.get_by_role("button", name="Walk", exact=True)
    page.get_by_label("Walkthrough prompt").fill("a" * 70)  # past the context of 64
    button.click()
    expect(error).to_have_text(
        "400: This model's maximum context length is 64 tokens, however your prompt has 70 tokens. "
        "Please reduce your prompt."
    )
    below = error.bounding_box()["y"] - (button.bounding_box()["y"] + button.bounding_box()["height"])
    assert 0 <= below < 40 and page.get_by_role("alert").count() == 1  # beside the button, the one alert shown
    expect(page.locator("#walk-body")).to_be_hidden()  # the steps drawn before were another prompt's
    page.get_by_label("Walkthrough prompt").fill("To be")
    button.click()
    expect(page.locator("#walk-summary")).to_contain_text("5 tokens through 4 blocks")
    expect(error).to_be_hidden()


# ------------------------------------------------------------------ no tokenizer: token ids


def test_a_model_with_no_tokenizer_walks_a_prompt_of_ids(browser, served_without_tokenizer):
    watched = walk_on_the_page(browser, served_without_tokenizer.url, IDS_PROMPT, by_address=True)
    try:
        page, ids = watched.page, [1, 2, 3, 4, 5, 1, 2, 3]
        expect(page.get_by_role("button", name="Walkthrough", exact=True)).to_have_attribute("aria-pressed", "true")
        answer = api_walk(served_without_tokenizer.url, ids)
        assert answer["tokenizer"] is None and answer["ids"] == ids
        expect(page.locator("#walk-tokenizer")).to_contain_text("no tokenizer: it reads token ids")
        assert (
            page.get_by_label("BPE merges")
            .locator(".chip")
            .evaluate_all("cs => cs.map(c => Number(c.dataset.tokenId))")
            == ids
        )
        for step in answer["steps"]:
            expect(page.locator(f'[data-step="{step["name"]}"]')).to_have_count(1)
        assert all(url.startswith(served_without_tokenizer.url) for url in watched.requests)
        # The console's only errors are /tokenizer_info's 400s: the playground's and this view's, which ask it
        # whether the model reads text.
        asked = [url for url in watched.requests if url.endswith("/tokenizer_info")]
        assert len(asked) == 2 and watched.errors == [
            "Failed to load resource: the server responded with a status of 400 (Bad Request)"
        ] * len(asked)
        page.get_by_label("Walkthrough prompt").fill("1 2 99")
        page.get_by_role("button", name="Walk", exact=True).click()
        expect(page.locator("#walk-error")).to_have_text("400: token id 99 in prompt is out of range: ids are 0..63")
    finally:
        watched.close()


@pytest.fixture(scope="module")
def sines_served():
    """A random model of the seeds' kind: sinusoidal positions, the exact GELU; no tokenizer."""
    torch.manual_seed(0)
    config = GPT2Config(n_vocab=20, n_ctx=32, n_embd=16, n_head=2, n_layer=1, positions="sinusoidal", activation="gelu")
    model = GPT2(config).eval()
    running = Running(lambda: (model, None), "sines")
    yield running
    running.stop()


def test_sinusoidal_positions_are_named_and_drawn_as_their_sines(browser, sines_served):
    watched = walk_on_the_page(browser, sines_served.url, "[3, 1, 4, 1, 5]")
    try:
        page = watched.page
        expect(page.locator("#walk-positions-caption")).to_contain_text("Sinusoidal positions: fixed sines and cosines")
        answer = api_walk(sines_served.url, [3, 1, 4, 1, 5], top_k=20)
        table = positions_written_out(32, 16)  # "Attention Is All You Need", 3.5, one value at a time
        curves = page.evaluate("""() => {
            const box = document.getElementById('walk-positions-curves'), d = box.dataset;
            const [pad, scale, H] = [Number(d.pad), Number(d.scale), Number(box.getAttribute('height'))];
            const value = (point) => (H / 2 - Number(point.split(',')[1])) / (H / 2 - pad) * scale;
            return Array.from(box.querySelectorAll('polyline'), line => ({dim: Number(line.dataset.dim),
                values: line.getAttribute('points').split(' ').map(value)}));
        }""")
        assert [c["dim"] for c in curves] == answer["positions"]["curves"]["dims"] and len(curves) >= 3
        for curve in curves:
            np.testing.assert_allclose(curve["values"], table[:, curve["dim"]], atol=0.01)
        expect(page.locator("#walk-gelu-caption")).to_contain_text("exact (erf)")
        steps = {s["name"]: s["values"] for s in answer["steps"]}
        reference = torch.nn.functional.gelu(torch.tensor(steps["h.0.mlp.c_fc"]))  # torch's exact GELU, in float64
        np.testing.assert_allclose(steps["h.0.mlp.gelu"], reference.numpy(), atol=1e-4)
        # A vocabulary of 20, under the 50 next tokens the page asks for: the server names its 20, in one walk. The
        # console's errors are /tokenizer_info's two 400s (the playground's and this view's: no tokenizer).
        walks = [url for url in watched.requests if url.endswith("/v1/walk")]
        assert len(walks) == 1 and page.locator("[data-next-id]").count() == 10
        assert (
            watched.errors == ["Failed to load resource: the server responded with a status of 400 (Bad Request)"] * 2
        )
    finally:
        watched.close()
