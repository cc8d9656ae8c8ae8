"""The playground (`gpt2 serve`'s page at /) in a real browser: Chromium, headless, driven by
Playwright's Python API, against a server in this process. What the page shows is checked
against the API it is made from: /v1/completions (through the `openai` client), /v1/inspect and
/v1/circuits.

The browser is the system's Chromium (Debian's `chromium`; `make test` installs it where it can)
or Playwright's own (`python -m playwright install chromium`). Without either the tests fail,
saying so: they are never skipped. Screenshots of the page and of its views are saved in
test-artifacts/ ($GPT2_TEST_ARTIFACTS), to be looked at; $GPT2_PLAYGROUND_MODEL serves a model
directory of your own instead of the tests' random one (README's picture is playground.png).
One browser and one server serve the module, and most tests look at one generated page, for speed;
the Graph view's tests have a second server of the same model, with transcoders and feature data.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
from pathlib import Path

import httpx
import pytest
from browser_fixtures import ARTIFACTS, Watched, screenshot
from helpers import Running, circuit_tracer_layer, corpus, hf_and_ours, make_ending_model, serving, write_circuit_tracer
from playwright.sync_api import expect

from gpt2 import Tokenizer
from gpt2.data import prepare
from gpt2.model.model import GPT2
from gpt2.serve import Limits

pytestmark = pytest.mark.browser

PROMPT = "ROMEO:\nBut soft, what light"
MAX_TOKENS = 24


def served_model(tmp_path_factory) -> tuple[GPT2, Tokenizer, str]:
    directory = os.environ.get("GPT2_PLAYGROUND_MODEL")
    if directory:
        model = GPT2.from_pretrained(directory, device="cpu")
        return model, model.tokenizer, Path(directory).name
    directory = tmp_path_factory.mktemp("playground")
    _, model = hf_and_ours(directory, seed=7, vocab_size=50257, n_positions=128, n_embd=48, n_layer=2, n_head=3)
    return model, Tokenizer.gpt2(), "tiny"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    yield from serving(*served_model(tmp_path_factory))


@pytest.fixture(scope="module")
def generated(browser, served):
    """One greedy generation typed and clicked on the page; the views drawn after it."""
    watched = Watched(browser, served.url)
    watched.wait_for_model()
    watched.generate(PROMPT, MAX_TOKENS, 0)
    watched.page.wait_for_selector("#attribution rect")  # the last view drawn after a generation
    yield watched
    watched.close()


def api_completion(served) -> dict:
    client = served.client()
    done = client.completions.create(
        model=client.models.list().data[0].id,
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        temperature=0,
        logprobs=5,
        extra_body={"return_token_ids": True},
    )
    return done.choices[0].model_dump()


def test_a_greedy_generation_on_the_page_equals_the_api_token_for_token(generated, served):
    expected = api_completion(served)
    shown = generated.tokens()
    assert len(shown) >= 5 and [t["id"] for t in shown] == expected["token_ids"]  # <|endoftext|> too, its text empty
    for token, logprob in zip(shown, expected["logprobs"]["token_logprobs"], strict=True):
        assert abs(token["logprob"] - logprob) < 1e-4
    assert "".join(t["text"] for t in shown) == expected["text"]
    assert generated.page.get_by_label("Completion").inner_text().startswith(PROMPT)
    screenshot(generated.page, "playground.png")  # README's picture, on a trained model: docs/serve.md says how


def test_the_served_model_is_named_with_its_context_and_parameters(generated, served):
    model = served.app.state.server.model
    info = generated.page.text_content("#model-info")
    millions = model.num_parameters() / 1e6
    assert served.app.state.server.model_id in info and f"context {model.config.n_ctx} tokens" in info
    assert (f"{millions:.1f}M parameters" if millions < 1000 else f"{millions / 1e3:.2f}B parameters") in info


def test_a_token_focused_or_hovered_shows_its_alternatives_with_their_probabilities(generated, served):
    expected = api_completion(served)["logprobs"]
    page = generated.page
    token = page.locator("#completion .token").nth(1)
    token.hover()
    tip = page.get_by_role("tooltip")
    assert tip.is_visible()
    rows = tip.locator("tr").all_inner_texts()
    top = sorted(expected["top_logprobs"][1].items(), key=lambda e: -e[1])
    assert len(rows) == len(top)
    for row, (text, logprob) in zip(rows, top):
        shown, percent = row.rsplit("\t", 1)
        assert shown.strip() == json.dumps(text) and abs(float(percent.rstrip("%")) - 100 * math.exp(logprob)) < 0.051
    page.keyboard.press("Escape")
    assert not tip.is_visible()
    page.locator("#completion .token").first.focus()  # the keyboard: one tab stop, then the arrow keys
    page.keyboard.press("ArrowRight")
    assert page.evaluate("document.activeElement.dataset.tokenId") == str(generated.tokens()[1]["id"])
    assert tip.is_visible()


def inspection(served, generated) -> dict:
    ids = served.app.state.server.tokenizer.encode(PROMPT) + [t["id"] for t in generated.tokens()]
    return httpx.post(served.url + "/v1/inspect", json={"prompt": ids}).json()


def attention_pixels(page) -> list[list[float]]:
    """The attention canvas read back: each cell's probability from its centre's red (255 - 247 p)."""
    return page.evaluate("""() => {
        const canvas = document.getElementById('attention');
        const d = canvas.dataset, cell = Number(d.cell), T = Number(d.tokens);
        const ctx = canvas.getContext('2d');
        const rows = [];
        for (let q = 0; q < T; q++) {
            const row = [];
            for (let k = 0; k < T; k++) {
                const x = Number(d.left) + (k + 0.5) * cell, y = Number(d.top) + (q + 0.5) * cell;
                row.push((255 - ctx.getImageData(Math.floor(x), Math.floor(y), 1, 1).data[0]) / 247);
            }
            rows.push(row);
        }
        return rows;
    }""")


def test_the_attention_view_shows_the_pattern_of_the_chosen_layer_and_head(generated, served):
    answer = inspection(served, generated)
    page = generated.page
    n_layer, n_head, T = len(answer["attention"]), len(answer["attention"][0]), len(answer["ids"])
    for layer, head in [(n_layer - 1, n_head - 1), (0, 0)]:
        page.locator("#layer").select_option(str(layer))
        page.locator("#head").select_option(str(head))
        shown = attention_pixels(page)
        assert len(shown) == T
        for q in range(T):
            for k in range(T):
                assert abs(shown[q][k] - answer["attention"][layer][head][q][k]) < 3 / 247, (layer, head, q, k)
    canvas = page.get_by_label("Attention", exact=True)
    canvas.focus()  # the keyboard moves the row that the readout puts into words
    page.keyboard.press("ArrowUp")
    readout = page.text_content("#attention-readout")
    assert f"(position {T - 2}) attends to" in readout
    page.locator("#head").select_option("all")
    assert canvas.get_attribute("data-view") == "all"
    box = canvas.bounding_box()
    panel, gap, title = (int(canvas.get_attribute(f"data-{key}")) for key in ("panel", "gap", "title"))
    canvas.click(position={"x": panel + gap + panel / 2, "y": title + panel / 2})  # the second head's panel
    assert page.locator("#head").input_value() == "1" and box["width"] > 0


def thumbnail_pixels(page, n_head: int) -> list[list[list[float]]]:
    """The "all heads" canvas read back: per head, each cell's colour from its centre's red, as 0..1."""
    return page.evaluate(
        """(n_head) => {
        const canvas = document.getElementById('attention');
        const d = canvas.dataset, T = Number(d.tokens), panel = Number(d.panel), gap = Number(d.gap);
        const title = Number(d.title), columns = Number(d.columns), scale = Number(d.scale), cell = panel / T;
        const ctx = canvas.getContext('2d');
        const out = [];
        for (let h = 0; h < n_head; h++) {
            const x = (h % columns) * (panel + gap), y = Math.floor(h / columns) * (panel + title + gap) + title;
            const rows = [];
            for (let q = 0; q < T; q++) {
                const row = [];
                for (let k = 0; k < T; k++) {
                    const px = Math.floor((x + (k + 0.5) * cell) * scale);
                    const py = Math.floor((y + (q + 0.5) * cell) * scale);
                    row.push((255 - ctx.getImageData(px, py, 1, 1).data[0]) / 247);
                }
                rows.push(row);
            }
            out.push(rows);
        }
        return out;
    }""",
        n_head,
    )


def swatch_reds(legend) -> list[int]:
    """The red of each colour in the legend's key (255 - 247 x the colour's 0..1)."""
    colours = legend.locator(".swatch").evaluate_all("els => els.map(e => getComputedStyle(e).backgroundColor)")
    return [int(re.match(r"rgb\((\d+),", colour).group(1)) for colour in colours]


def all_heads_of_the_last_layer(generated, served):
    """The page showing every head of the last layer: /v1/inspect's answer, the page, the layer."""
    answer = inspection(served, generated)
    page = generated.page
    layer = len(answer["attention"]) - 1
    page.locator("#layer").select_option(str(layer))
    page.locator("#head").select_option("all")
    return answer, page, layer


def test_every_heads_thumbnail_is_drawn_on_a_square_root_scale_that_the_legend_states(generated, served):
    answer, page, layer = all_heads_of_the_last_layer(generated, served)
    heads = answer["attention"][layer]
    shown = thumbnail_pixels(page, len(heads))
    for h, (pixels, pattern) in enumerate(zip(shown, heads, strict=True)):
        assert max(map(max, pixels)) > 1 - 1.5 / 247, h  # each head's brightest cell at full colour
        for q, (row, expected) in enumerate(zip(pixels, pattern, strict=True)):
            for k, (ink, p) in enumerate(zip(row, expected, strict=True)):
                assert abs(ink - math.sqrt(p)) < 3 / 247, (
                    h,
                    q,
                    k,
                    p,
                )  # a weight of 0.04 is a fifth of the colour, not 4%
    legend = page.locator("#attention-legend")
    keys = [0, 0.01, 0.04, 0.25, 1]
    assert legend.inner_text().split("(")[0].split() == ["Colour:", *map(str, keys)]
    assert "square-root scale" in legend.inner_text() and "√weight" in legend.inner_text()
    assert all(abs(red - (255 - 247 * math.sqrt(p))) <= 1 for red, p in zip(swatch_reds(legend), keys, strict=True))
    screenshot(
        page.locator("section", has=page.get_by_label("Attention", exact=True)), "playground-attention-all-heads.png"
    )
    page.locator("#head").select_option("0")  # one head: the weights as they are, and the legend says so
    assert "linear" in legend.inner_text()
    assert all(abs(red - (255 - 247 * p)) <= 1 for red, p in zip(swatch_reds(legend), keys, strict=True))


def title_differs(page, h: int, text: str) -> int:
    """How many pixels of head h's title strip, in the "all heads" canvas, differ from `text` drawn
    on white in the page's title font and ink (12px system-ui, #1b1f24) at the strip's left."""
    return page.evaluate(
        """([h, text]) => {
        const canvas = document.getElementById('attention');
        const d = canvas.dataset, scale = Number(d.scale), panel = Number(d.panel), gap = Number(d.gap);
        const title = Number(d.title), columns = Number(d.columns);
        const x = (h % columns) * (panel + gap), y = Math.floor(h / columns) * (panel + title + gap);
        const width = Math.round(panel * scale), height = Math.round(title * scale);
        const shown = canvas.getContext('2d')
            .getImageData(Math.round(x * scale), Math.round(y * scale), width, height).data;
        const probe = Object.assign(document.createElement('canvas'), {width, height}).getContext('2d');
        probe.scale(scale, scale);
        probe.fillStyle = '#fff';
        probe.fillRect(0, 0, panel, title);
        probe.font = '12px system-ui, sans-serif';
        probe.fillStyle = '#1b1f24';
        probe.fillText(text, 0, 12);
        const drawn = probe.getImageData(0, 0, width, height).data;
        let differ = 0;
        for (let i = 0; i < shown.length; i += 4) differ += Math.abs(shown[i] - drawn[i]) > 8;
        return differ;
    }""",
        [h, text],
    )


def test_each_heads_thumbnail_is_titled_with_its_layer_and_head(generated, served):
    answer, page, layer = all_heads_of_the_last_layer(generated, served)
    for h in range(len(answer["attention"][layer])):
        assert title_differs(page, h, f"layer {layer}, head {h}") == 0, h
    assert title_differs(page, 0, "head 0") > 0  # the comparison tells titles apart


def test_the_heads_are_a_heat_map_layers_by_heads_coloured_by_the_chosen_score(generated, served):
    ids = inspection(served, generated)["ids"]
    scores = httpx.post(served.url + "/v1/circuits/scores", json={"prompt": ids}).json()["scores"]
    page = generated.page
    n_layer, n_head = len(scores["previous_token"]), len(scores["previous_token"][0])
    buttons = page.get_by_role("group", name="Scores and ablation").get_by_role("button")
    expect(buttons).to_have_count(n_layer * n_head)
    boxes = {
        (int(b.get_attribute("data-layer")), int(b.get_attribute("data-head"))): b.bounding_box() for b in buttons.all()
    }
    for (layer, head), box in boxes.items():  # a row per layer, a column per head, in order
        assert box["y"] == boxes[layer, 0]["y"] and box["x"] == boxes[0, head]["x"], (layer, head)
        assert box["y"] > boxes[layer - 1, head]["y"] if layer else box["x"] > boxes[0, head - 1]["x"] if head else True
    legend = page.locator("#heads-legend")
    for kind, words in (
        ("induction", "induction"),
        ("duplicate_token", "duplicate-token"),
        ("previous_token", "previous-token"),
    ):
        page.get_by_label("Colour by").select_option(kind)
        expect(legend).to_contain_text(f"{words} score")
        reds = buttons.evaluate_all(
            "els => els.map(e => [Number(e.dataset.layer), Number(e.dataset.head), "
            "getComputedStyle(e).backgroundColor])"
        )
        for layer, head, colour in reds:
            red = int(re.match(r"rgb\((\d+),", colour).group(1))
            if scores[kind] is None:  # no token repeats: grey, and the key says why
                assert colour == "rgb(208, 215, 222)" and "no token of the text repeats" in legend.inner_text()
            else:  # white 0 to dark blue 1, the attention's scale
                assert abs(red - (255 - 247 * scores[kind][layer][head])) <= 1, (kind, layer, head)
    assert scores["previous_token"] is not None


def test_the_logit_lens_shows_the_top_token_of_every_layer_at_every_position(generated, served):
    answer = inspection(served, generated)
    cells = generated.page.eval_on_selector_all(
        "#lens td",
        "els => els.map(e => [Number(e.dataset.layer), Number(e.dataset.position), Number(e.dataset.tokenId), "
        "e.textContent])",
    )
    lens = answer["logit_lens"]
    assert len(cells) == len(lens) * len(answer["ids"])
    for layer, position, token_id, text in cells:
        expected = lens[layer][position]
        assert (
            token_id == expected["id"]
            and abs(float(text.rsplit("\n", 1)[1].rstrip("%")) - 100 * expected["prob"]) < 0.051
        )
    assert generated.page.get_by_label("Logit lens").is_visible()


def test_the_logit_lens_says_that_each_column_predicts_the_token_after_its_header(generated, served):
    answer = inspection(served, generated)
    page = generated.page
    axis, header = page.locator("#lens thead tr").all()
    assert axis.inner_text().strip() == "predicting the token after ↓"
    names = header.locator("th").all_inner_texts()
    assert names[0] == "layer" and len(names) == 1 + len(answer["tokens"])
    for name, token in zip(names[1:], answer["tokens"]):
        full = json.dumps(token, ensure_ascii=False)
        assert name == (full if len(full) <= 14 else full[:13] + "…")
    cells = page.locator("#lens tbody tr").first.locator("td")  # the output row, the model's own prediction
    for position in (0, len(answer["ids"]) - 2):
        assert (
            cells.nth(position)
            .get_attribute("title")
            .startswith(
                f"output, predicting the token after {json.dumps(answer['tokens'][position], ensure_ascii=False)}: "
            )
        )
    # and so it is: greedy, the generated text is the output row's top token one column to the left
    first = len(served.app.state.server.tokenizer.encode(PROMPT)) - 1
    ids = [int(i) for i in cells.evaluate_all("els => els.map(e => e.dataset.tokenId)")]
    assert ids[first:-1] == answer["ids"][first + 1 :]


def lens_box(page) -> dict:
    return page.evaluate("""() => {
        const box = document.getElementById('lens-scroll'), frame = document.getElementById('lens-frame');
        return {scrollWidth: box.scrollWidth, clientWidth: box.clientWidth, left: box.getBoundingClientRect().left,
                fade: getComputedStyle(frame, '::after').opacity};
    }""")


def test_the_logit_lens_shows_that_it_scrolls_sideways_while_it_is_wider_than_its_box(generated):
    page = generated.page
    cue, scroller = page.locator("#lens-cue"), page.locator("#lens-scroll")
    box = lens_box(page)
    assert box["scrollWidth"] > box["clientWidth"]  # 37 columns at 1280 pixels
    assert cue.is_visible() and cue.inner_text().endswith("scroll sideways →") and box["fade"] == "1"
    screenshot(page.locator("section", has=page.get_by_label("Logit lens")), "playground-logit-lens.png")
    row_name = page.locator("#lens tbody th").first
    try:
        scroller.evaluate("e => { e.scrollLeft = e.scrollWidth; }")  # at the right end: no fade there
        generated.wait_until("getComputedStyle(document.getElementById('lens-frame'), '::after').opacity === '0'")
        assert (
            row_name.is_visible() and abs(row_name.bounding_box()["x"] - box["left"]) < 1
        )  # the row names stay in sight
        assert page.locator("#lens tbody td").last.is_visible()
        screenshot(page.locator("section", has=page.get_by_label("Logit lens")), "playground-logit-lens-scrolled.png")
        scroller.evaluate("e => { e.scrollLeft = 0; }")
        page.set_viewport_size({"width": 4000, "height": 900})  # wide enough for every column: no cue
        generated.wait_until("document.getElementById('lens-cue').hidden")
        box = lens_box(page)
        assert box["scrollWidth"] <= box["clientWidth"] and box["fade"] == "0" and not cue.is_visible()
    finally:
        page.set_viewport_size({"width": 1280, "height": 900})
        scroller.evaluate("e => { e.scrollLeft = 0; }")
    generated.wait_until("!document.getElementById('lens-cue').hidden")


def test_the_page_asks_nothing_of_another_origin_and_logs_no_error(generated, served):
    assert generated.requests and all(url.startswith(served.url + "/") for url in generated.requests)
    assert generated.errors == []


def test_a_clicked_head_shows_its_scores_and_ablation_and_the_attribution_bars_are_the_apis(generated, served):
    ids = inspection(served, generated)["ids"]
    page = generated.page
    buttons = page.get_by_role("group", name="Scores and ablation").get_by_role("button")
    layer, head = (
        int(buttons.last.get_attribute(f"data-{key}")) for key in ("layer", "head")
    )  # the last layer's last head
    page.get_by_role("button", name=f"L{layer} H{head}").click()
    generated.wait_until(
        f"document.querySelectorAll('#ablation tbody tr').length > 0 && "
        f"document.getElementById('head-scores').dataset.head === '{head}'"
    )
    api = httpx.post(
        served.url + "/v1/circuits/head", json={"prompt": ids, "layer": layer, "head": head, "top_k": 5}
    ).json()
    rows = page.eval_on_selector_all(
        "#ablation tbody tr",
        "els => els.map(e => [Number(e.dataset.tokenId), Number(e.dataset.before), "
        "Number(e.dataset.after), e.innerText])",
    )
    assert [(i, b, a) for i, b, a, _ in rows] == [(e["id"], e["before"], e["after"]) for e in api["next"]]
    for (*_, text), e in zip(rows, api["next"]):
        before, after = (float(cell.rstrip("%")) for cell in text.split("\t")[1:3])
        assert before == pytest.approx(100 * e["before"], rel=6e-3) and after == pytest.approx(
            100 * e["after"], rel=6e-3
        )
    words = page.text_content("#head-scores")
    for kind, score in api["scores"].items():
        shown = re.search(kind.replace("_", "-") + r" (\S+)", words).group(1)
        assert shown == "—" if score is None else abs(float(shown) - score) < 6e-4, (kind, words)
    assert (
        buttons.last.get_attribute("aria-pressed") == "true" and buttons.first.get_attribute("aria-pressed") == "false"
    )
    parts = httpx.post(
        served.url + "/v1/circuits/attribution", json={"prompt": ids}
    ).json()  # the chart drawn after the inspection
    bars = page.eval_on_selector_all(
        "#attribution rect",
        "els => els.map(e => [e.dataset.name, Number(e.dataset.value), Number(e.getAttribute('width'))])",
    )
    expected = [v for row in parts["heads"] for v in row] + parts["mlps"] + [parts["embed"]] + parts["biases"]
    assert [v for _, v, _ in bars] == expected  # all of a small model's parts, in the model's order
    assert [n for n, _, _ in bars][:2] == ["head 0.0", "head 0.1"] and bars[-1][0] == "ln_f bias"
    most = max(map(abs, expected))
    assert all(abs(width - 160 * abs(v) / most) < 0.01 for _, v, width in bars)  # a bar's length is its value's
    assert sum(expected) == pytest.approx(parts["total"], abs=1e-4)
    last = len(parts["tokens"]) - 1  # it says which position and which token it attributes
    assert page.text_content("#attribution-summary").startswith(
        f"logit({json.dumps(parts['answer']['token'], ensure_ascii=False)}) for the next token, after position {last} "
        f"({json.dumps(parts['tokens'][last], ensure_ascii=False)}, the last of the text) = "
    )
    screenshot(page.locator("section", has=page.locator("#head-grid")), "playground-heads.png")
    screenshot(page.locator("section", has=page.get_by_label("Logit attribution")), "playground-attribution.png")


def test_the_patching_heat_map_of_two_prompts_is_the_apis(generated, served):
    page = generated.page
    page.get_by_role("button", name="Patch").click()
    page.wait_for_selector("#patching td")
    body = {field: page.locator(f"#{field}").input_value() for field in ("clean", "corrupted", "answer", "other")}
    api = httpx.post(served.url + "/v1/circuits/patching", json={**body, "site": "resid_pre"}).json()
    cells = page.eval_on_selector_all(
        "#patching td",
        "els => els.map(e => [Number(e.dataset.layer), Number(e.dataset.index), Number(e.dataset.value)])",
    )
    assert len(cells) == len(api["grid"]) * len(api["clean"]["ids"])
    assert all(value == api["grid"][layer][i] for layer, i, value in cells)
    assert len(page.locator("#patching thead th").all()) == 1 + len(api["clean"]["ids"])
    assert f"clean {api['clean']['logit_diff']:.3f}".replace("-", "−") in page.text_content("#patching-summary")
    screenshot(page.locator("section", has=page.get_by_label("Patching")), "playground-patching.png")


def finished(watched: Watched) -> tuple[str, str]:
    """Once the views are drawn (a click on Generate clears them at once): the completion's text and the status line."""
    watched.page.wait_for_selector("#lens td")
    return "".join(t["text"] for t in watched.tokens()), watched.page.text_content("#status")


def click_and_read(watched: Watched) -> tuple[str, str]:
    watched.page.get_by_role("button", name="Generate").click()
    return finished(watched)


def test_the_defaults_are_greedy_and_a_sampled_run_shows_the_seed_that_repeats_it(browser, served):
    watched = Watched(browser, served.url)
    page = watched.page
    try:
        watched.wait_for_model()
        watched.generate("Hello there", 12, None)  # the temperature left as the page has it
        assert page.get_by_label("Temperature", exact=True).input_value() == "0"
        first, status = finished(watched)
        assert click_and_read(watched)[0] == first and "seed" not in status  # twice the same text
        page.get_by_label("Temperature", exact=True).fill("1")
        sampled, status = click_and_read(watched)
        seed = int(re.search(r"; seed (\d+) \(type it in Seed to repeat this run\)$", status).group(1))
        assert page.get_by_label("Seed").input_value() == ""
        again, status = click_and_read(watched)  # a fresh seed for each run while the field is empty
        assert int(re.search(r"; seed (\d+) ", status).group(1)) != seed
        screenshot(page.locator(".controls"), "playground-seed.png")
        page.get_by_label("Seed").fill(str(seed))
        repeated, status = click_and_read(watched)
        assert repeated == sampled and f"; seed {seed} " in status
        client = served.client()  # the seed shown is the one the request carried: the API gives the same text
        done = client.completions.create(
            model=client.models.list().data[0].id, prompt="Hello there", max_tokens=12, temperature=1, seed=seed
        )
        assert done.choices[0].text == sampled
    finally:
        watched.close()


def test_stop_stops_the_generation_and_frees_its_row(browser, served):
    """The decoding loop is held once it has made 3 tokens, so that Stop comes mid-generation by
    construction, not by the speed of the machine; let go after it, the loop finds the row ended
    by the client's leaving (not at its length) and lets it go."""
    from gpt2.serve.scheduler import CANCELLED

    scheduler = served.app.state.server.scheduler
    step, gate, freed, held, made = scheduler.decoder.step, threading.Event(), threading.Event(), [], [0]

    def held_step():
        if made[0] >= 3:
            held[:] = held or list(scheduler.decoder.active)
            gate.wait(60)  # until the test lets it go (the timeout only bounds a hang)
        events = step()
        made[0] += sum(token is not None for _, token in events)
        if held and not scheduler.decoder.busy:
            freed.set()
        return events

    scheduler.decoder.step = held_step
    watched = Watched(browser, served.url)
    try:
        watched.wait_for_model()
        most = min(100, served.app.state.server.model.config.n_ctx - 10)
        watched.generate("A long story:", most, 0)
        tokens = watched.page.locator("#completion .token")
        expect(tokens).to_have_count(3)  # what the loop made before it was held
        watched.page.get_by_role("button", name="Stop").click()
        expect(watched.page.locator("#status")).to_have_text(re.compile(r"^stopped after 3 tokens"))
        gate.set()
        assert freed.wait(30), "the loop still holds the row"
        assert [row.finish_reason for row in held] == [CANCELLED] and len(held[0].tokens) < most
        assert tokens.count() == 3  # and nothing came after the stop
        assert watched.page.get_by_role("button", name="Generate").is_enabled()
        assert not watched.page.get_by_role("button", name="Stop").is_enabled()
    finally:
        gate.set()
        scheduler.decoder.step = step
        watched.close()


def test_the_end_of_the_text_is_drawn_as_a_mark_the_api_lists(browser, tmp_path_factory):
    """On a model that ends its texts after a "." (helpers.make_ending_model), the page draws the
    <|endoftext|> that the API lists as a token as an "end of text" mark, not as an empty span."""
    directory = tmp_path_factory.mktemp("ending")
    make_ending_model(directory)
    model = GPT2.from_pretrained(directory, device="cpu")
    running = Running(lambda: (model, Tokenizer.gpt2()), "ending")
    watched = Watched(browser, running.url)
    try:
        watched.wait_for_model()
        watched.generate("It rained.", 8, 0)
        watched.wait_until("document.getElementById('status').textContent.includes('token')")
        api = running.client().completions.create(
            model="ending",
            prompt="It rained.",
            max_tokens=8,
            temperature=0,
            logprobs=1,
            extra_body={"return_token_ids": True},
        )
        assert api.choices[0].finish_reason == "stop" and api.choices[0].logprobs.tokens[-1] == "<|endoftext|>"
        tokens = watched.tokens()
        assert [t["id"] for t in tokens] == api.choices[0].token_ids
        assert tokens[-1]["text"] == "" and tokens[-1]["logprob"] == pytest.approx(
            api.choices[0].logprobs.token_logprobs[-1]
        )
        mark = watched.page.locator("#completion .token.end")
        assert mark.count() == 1 and mark.get_attribute("title") == "the model ended the text here (<|endoftext|>)"
        assert (
            watched.page.evaluate(
                "getComputedStyle(document.querySelector('#completion .token.end'), '::after').content"
            )
            == '"end of text"'
        )
        assert mark.bounding_box()["width"] > 20  # to be seen, and pointed at
        mark.focus()
        assert watched.page.locator("#tip tr.chosen").inner_text().startswith('"<|endoftext|>"')
        assert watched.page.locator("#tip").inner_text().startswith('"<|endoftext|>" (id 50256)')
        assert watched.page.text_content("#status").startswith("1 token; the model ended the text")
        watched.page.screenshot(path=str(ARTIFACTS / "playground-end-of-text.png"))
    finally:
        watched.close()
        running.stop()


def test_a_server_error_appears_on_the_page(browser, served):
    watched = Watched(browser, served.url)
    try:
        watched.wait_for_model()
        n_ctx = served.app.state.server.model.config.n_ctx
        watched.generate("word " * (n_ctx + 5), 8, 0)
        alert = watched.page.get_by_role("alert")
        alert.wait_for()
        assert f"400: This model's maximum context length is {n_ctx} tokens" in alert.inner_text()
        watched.generate("Hello", 2, 0, top_p="0")  # a setting the server refuses, in its words
        watched.wait_until("document.getElementById('error').textContent.includes('top_p')")
        assert "400: top_p must be in (0, 1], got 0" in alert.inner_text()
        watched.generate("Hello", 2, 0, top_p="1")
        watched.page.wait_for_selector("#lens td")
        assert not alert.is_visible()  # a good request clears it
        watched.page.get_by_label("Corrupted").fill("When Mary")  # the clean text is 14 tokens
        watched.page.get_by_role("button", name="Patch").click()
        expect(watched.page.locator("#patching-error")).to_have_text(
            "400: clean and corrupted must have the same length: clean has 14 tokens, corrupted 2"
        )
    finally:
        watched.close()


def test_a_server_with_an_api_key_takes_it_from_the_page(browser, served):
    model, tokenizer = served.app.state.server.model, served.app.state.server.tokenizer
    locked = Running(lambda: (model, tokenizer), "locked", limits=Limits(api_key="s3cret"))
    watched = Watched(browser, locked.url)
    try:
        alert = watched.page.get_by_role("alert")
        alert.wait_for()
        assert "401: Incorrect or missing API key" in alert.inner_text()
        watched.page.get_by_label("API key").fill("s3cret")
        watched.page.get_by_label("API key").press("Tab")
        watched.wait_for_model()
        watched.generate("Hello", 3, 0)
        watched.page.wait_for_selector("#lens td")
        assert len(watched.tokens()) >= 1 and not alert.is_visible()
    finally:
        watched.close()
        locked.stop()


def test_the_page_reads_on_a_phone_sized_screen(browser, served):
    watched = Watched(browser, served.url, is_mobile=True, has_touch=True)
    try:
        watched.page.set_viewport_size({"width": 390, "height": 844})
        watched.wait_for_model()
        watched.generate("Hello there", 8, 0)
        watched.page.wait_for_selector("#lens td")
        assert watched.page.evaluate("document.documentElement.scrollWidth") <= 390  # no sideways scrolling of the page
        for name in ("Prompt", "Completion", "Attention", "Logit lens"):
            box = watched.page.get_by_label(name, exact=True).bounding_box()
            assert box is not None and box["x"] >= 0 and box["width"] > 0
        screenshot(watched.page, "playground-phone.png")
    finally:
        watched.close()


# ------------------------------------------------------------------ on the model gpt2 ships


@pytest.fixture
def char_page(browser, char_served):
    """A fresh page on shakespeare_char, nothing generated yet."""
    watched = Watched(browser, char_served.url)
    watched.wait_for_model()
    yield watched
    watched.close()


def test_max_tokens_names_the_room_the_prompt_leaves_on_the_page_and_in_the_servers_refusal(char_page, char_served):
    page, n_ctx = char_page.page, char_served.app.state.server.model.config.n_ctx
    prompt = page.get_by_label("Prompt", exact=True).input_value()
    room = n_ctx - len(prompt)  # a character model: a token per character (64 - 18 = 46 for the page's prompt)
    expect(page.locator("#room")).to_have_text(
        f"Max tokens: at most {room} for this prompt (the context's {n_ctx} tokens less the prompt's {len(prompt)})."
    )
    expect(page.get_by_label("Max tokens")).to_have_attribute("max", str(room))
    char_page.generate("To be", n_ctx - 4, 0)  # 5 tokens of prompt: 59 left, not 64
    expect(page.locator("#room")).to_contain_text(f"at most {n_ctx - 5} for this prompt")
    expect(page.locator("#error")).to_contain_text(
        f"400: This model's maximum context length is {n_ctx} tokens, however you requested "
        f"{n_ctx + 1} tokens (5 in your prompt; {n_ctx - 4} for the completion), 1 more than "
        f"it holds: your prompt leaves room for {n_ctx - 5} tokens of completion."
    )


def test_before_a_generation_each_view_that_waits_for_one_says_so(char_page):
    page = char_page.page
    notes = [
        page.locator("section", has=page.locator(view)).locator(".waiting")
        for view in ("#attention", "#lens", "#head-grid")
    ]
    for note in notes:
        expect(note).to_be_visible()
        expect(note).to_contain_text("Nothing here yet: click Generate")
    expect(page.locator("#layer")).to_be_disabled()
    char_page.generate("To be", 4, 0)
    page.wait_for_selector("#lens td")
    for note in notes:
        expect(note).to_be_hidden()
    expect(page.locator("#layer")).to_be_enabled()


def test_attribute_before_a_generation_takes_the_prompt_and_names_the_position_and_token(char_page, char_served):
    page = char_page.page
    prompt = page.get_by_label("Prompt", exact=True).input_value()
    page.get_by_role("button", name="Attribute").click()
    summary = page.locator("#attribution-summary")
    expect(summary).to_contain_text("the last of the prompt as it stands")
    parts = httpx.post(char_served.url + "/v1/circuits/attribution", json={"prompt": prompt}).json()
    bars = page.eval_on_selector_all("#attribution rect", "els => els.map(e => Number(e.dataset.value))")
    assert bars == [v for row in parts["heads"] for v in row] + parts["mlps"] + [parts["embed"]] + parts["biases"]
    assert summary.inner_text().startswith(
        f"logit({json.dumps(parts['answer']['token'])}) for the next token, after position "
        f"{len(prompt) - 1} ({json.dumps(prompt[-1])}, the last of the prompt as it stands) = "
    )
    char_page.generate(prompt, 4, 0)
    expect(summary).to_contain_text("the last of the text")  # drawn again, for the prompt and its completion


def patch_with_the_defaults(watched: Watched) -> dict:
    """Once the page has chosen its patching pair for the model: click Patch, wait for the grid; the form's fields."""
    page = watched.page
    expect(page.locator("#answer")).not_to_have_value(" Mary")  # " Mary" is 5 characters: not this model's pair
    page.get_by_role("button", name="Patch").click()
    page.wait_for_selector("#patching td")
    return {field: page.locator(f"#{field}").input_value() for field in ("clean", "corrupted", "answer", "other")}


def test_the_patching_defaults_fit_a_character_model(char_page, char_served):
    fields = patch_with_the_defaults(char_page)
    count = lambda text: httpx.post(char_served.url + "/tokenize", json={"content": text}).json()["count"]  # noqa: E731
    assert count(fields["answer"]) == count(fields["other"]) == 1 and count(fields["clean"]) == count(
        fields["corrupted"]
    )
    api = httpx.post(char_served.url + "/v1/circuits/patching", json={**fields, "site": "resid_pre"}).json()
    cells = char_page.page.eval_on_selector_all("#patching td", "els => els.map(e => Number(e.dataset.value))")
    assert cells == [value for row in api["grid"] for value in row]
    assert api["clean"]["logit_diff"] > 0 > api["corrupted"]["logit_diff"]  # a pair the model tells apart
    assert (
        not char_page.page.locator("#error").is_visible() and not char_page.page.locator("#patching-error").is_visible()
    )


def test_a_refused_patch_says_why_beside_its_button_and_clears_the_grid(char_page):
    page = char_page.page
    fields = patch_with_the_defaults(char_page)
    error, button = page.locator("#patching-error"), page.get_by_role("button", name="Patch")
    page.locator("#other").fill(fields["answer"])  # the same token twice: a grid of zeros, refused
    button.click()
    expect(error).to_contain_text(f"400: answer and other are the same token, {fields['answer']!r}")
    expect(page.locator("#patching td")).to_have_count(0)  # the grid before was not of these answers
    expect(page.locator("#patching-summary")).to_have_text("")
    below = error.bounding_box()["y"] - (button.bounding_box()["y"] + button.bounding_box()["height"])
    assert 0 <= below < 40 and not page.locator("#error").is_visible()  # beside the button, not at the top of the page
    for field in ("answer", "other"):
        page.locator(f"#{field}").fill("")  # each run's top token; one text twice: the same token
    page.locator("#corrupted").fill(fields["clean"])
    button.click()
    expect(error).to_contain_text("; answer: the clean run's top token; other: the corrupted run's top token)")
    page.locator("#corrupted").fill(fields["corrupted"])
    button.click()
    page.wait_for_selector("#patching td")
    expect(error).to_be_hidden()


def test_the_patching_grid_shows_that_it_scrolls_sideways_while_it_is_wider_than_its_box(char_page):
    page = char_page.page
    fields = patch_with_the_defaults(char_page)
    cue = page.locator("#patching-cue")
    expect(cue).to_have_text(
        f"{len(fields['clean'])} columns, wider than this box: scroll sideways →"
    )  # a column per character
    box = page.locator("#patching-scroll").evaluate("e => [e.scrollWidth, e.clientWidth]")
    assert (
        box[0] > box[1]
        and page.locator("#patching-frame").evaluate("e => getComputedStyle(e, '::after').opacity") == "1"
    )
    screenshot(page.locator("section", has=page.get_by_label("Patching")), "playground-patching-char.png")
    page.set_viewport_size({"width": 4000, "height": 900})  # wide enough for every column: no cue
    expect(cue).to_be_hidden()


def test_a_model_with_no_tokenizer_is_named_and_the_page_says_it_needs_one(browser, served_without_tokenizer):
    watched = Watched(browser, served_without_tokenizer.url)
    try:
        watched.wait_until("!document.getElementById('error').hidden")
        message = watched.page.locator("#error").text_content()
        assert "this model comes with no tokenizer" in message
        assert "induction · context 64 tokens" in watched.page.locator("#model-info").text_content()
    finally:
        watched.close()


# ------------------------------------------------------------------ the Graph view (/v1/circuits/graph and /feature)

GRAPH_PROMPT = "The cat sat on the mat because the cat"


@pytest.fixture(scope="module")
def graph_served(served, tmp_path_factory):
    """The module's model served again with random transcoders of its shape (circuit-tracer's layout,
    a fifth of the features firing) and a few thousand characters of the corpus prepared as feature data."""
    model, tokenizer = served.app.state.server.model, served.app.state.server.tokenizer
    directory = tmp_path_factory.mktemp("graph")
    layers = {
        i: circuit_tracer_layer(40 + i, jumprelu=False, skip=False, d_model=model.config.n_embd, b_enc=-0.8)
        for i in range(model.config.n_layer)
    }
    write_circuit_tracer(directory / "transcoders", layers)
    (directory / "text.txt").write_text(corpus()[1][:6000])
    prepare([directory / "text.txt"], directory / "data", "gpt2", progress=False, num_workers=1)
    yield from serving(
        model, tokenizer, "tiny", transcoders=str(directory / "transcoders"), feature_data=str(directory / "data")
    )


def draw_graph(watched: Watched, prompt: str) -> None:
    page = watched.page
    page.get_by_label("Graph prompt").fill(prompt)
    page.get_by_role("button", name="Draw graph").click()


def drawn_nodes(page) -> dict[str, dict]:
    """{node id: its mark's centre (x, y) and its <title>} of every node the graph's picture holds."""
    return page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('#graph [data-node-id]')].map(e => {
        const box = e.getBoundingClientRect();
        return [e.getAttribute('data-node-id'),
                {x: box.x + box.width / 2, y: box.y + box.height / 2, title: e.querySelector('title').textContent}];
    }))""")


def test_the_graph_view_draws_every_node_of_the_graph_by_layer_and_position(browser, graph_served):
    watched = Watched(browser, graph_served.url)
    page = watched.page
    try:
        watched.wait_for_model()
        draw_graph(watched, GRAPH_PROMPT)
        page.wait_for_selector("#graph [data-node-id]")
        api = httpx.post(graph_served.url + "/v1/circuits/graph", json={"prompt": GRAPH_PROMPT}, timeout=60).json()
        nodes = {node["node_id"]: node for node in api["nodes"]}
        drawn = drawn_nodes(page)
        assert sorted(drawn) == sorted(nodes) and page.locator("#graph line.edge").count() == len(api["links"])
        kinds = {node["feature_type"] for node in nodes.values()}
        assert {"cross layer transcoder", "mlp reconstruction error", "embedding", "logit"} <= kinds

        def row(node):  # circuit-tracer's layer: "E" the tokens, 0..n-1 the blocks, n + 1 the logits
            return -1 if node["layer"] == "E" else int(node["layer"])

        rows = sorted({row(node) for node in nodes.values()})
        heights = {r: {round(drawn[i]["y"], 1) for i, node in nodes.items() if row(node) == r} for r in rows}
        assert all(len(ys) == 1 for ys in heights.values())  # one height a row
        ys = [min(heights[r]) for r in rows]
        assert all(below > above for below, above in zip(ys, ys[1:]))  # the tokens at the bottom, the logits on top
        columns = {}  # the nodes below the logits: a column per position, left to right
        for i, node in nodes.items():
            if node["feature_type"] != "logit":
                columns.setdefault(node["ctx_idx"], []).append(drawn[i]["x"])
        spans = [(min(xs), max(xs)) for _, xs in sorted(columns.items())]
        assert all(right < left for (_, right), (left, _) in zip(spans, spans[1:]))
        assert len(columns) == len(api["metadata"]["prompt_tokens"])  # every position has its token at least
        labels = page.eval_on_selector_all("#graph text[data-position]", "els => els.map(e => e.textContent)")
        assert labels == [
            json.dumps(t, ensure_ascii=False)[:13] + "…"
            if len(json.dumps(t, ensure_ascii=False)) > 14
            else json.dumps(t, ensure_ascii=False)
            for t in api["metadata"]["prompt_tokens"]
        ]

        feature = max(
            (n for n in nodes.values() if n["feature_type"] == "cross layer transcoder"), key=lambda n: n["ctx_idx"]
        )
        layer, index, position = feature["node_id"].split("_")
        token = json.dumps(api["metadata"]["prompt_tokens"][int(position)], ensure_ascii=False)
        assert drawn[feature["node_id"]]["title"].replace("−", "-") == (
            f"feature {index} of layer {layer}'s transcoder, position {position} ({token}): activation "
            f"{feature['activation']:.3f}; cumulative influence {feature['influence']:.3f} (click for its contexts)"
        )
        logit = next(n for n in nodes.values() if n["feature_type"] == "logit")
        assert drawn[logit["node_id"]]["title"].endswith(": " + logit["clerp"]) and logit["clerp"].startswith("Output ")
        summary = page.text_content("#graph-summary")
        for name in ("replacement", "completeness"):
            assert f"{name} {api[name]:.3f}" in summary
        assert watched.errors == [] and all(url.startswith(graph_served.url + "/") for url in watched.requests)
    finally:
        watched.close()


def test_a_feature_clicked_in_the_graph_shows_its_top_contexts_shaded_by_its_activation(browser, graph_served):
    watched = Watched(browser, graph_served.url)
    page = watched.page
    try:
        watched.wait_for_model()
        draw_graph(watched, GRAPH_PROMPT)
        page.wait_for_selector("#graph [data-node-id]")
        feature = page.locator("#graph .node.feature").last
        node_id = feature.get_attribute("data-node-id")
        layer, index, _ = map(int, node_id.split("_"))
        feature.click()
        api = httpx.post(
            graph_served.url + "/v1/circuits/feature", json={"layer": layer, "feature": index, "top_k": 10}, timeout=60
        ).json()["contexts"]
        assert api  # the feature fires in the feature data
        contexts = page.get_by_label("Feature contexts").locator(".context")
        expect(contexts).to_have_count(len(api))
        most = max(c["activation"] for c in api)
        expect(page.locator("#feature-summary")).to_contain_text(
            f"Feature {index} of layer {layer}: the {len(api)} contexts"
        )
        assert f"max activation {most:.3f}".replace("-", "−") in page.text_content("#feature-summary")
        shown = contexts.evaluate_all(
            "els => els.map(e => [...e.querySelectorAll('span[data-activation]')].map(s => "
            "[s.textContent, Number(s.dataset.activation), getComputedStyle(s).backgroundColor]))"
        )
        for spans, context in zip(shown, api, strict=True):
            assert [text for text, _, _ in spans] == [t.replace("\n", "↵") for t in context["tokens"]]
            assert [a for _, a, _ in spans] == context["activations"]
            for _, a, colour in spans:  # white 0 to dark blue at the largest shown, the attention's scale
                red = int(re.match(r"rgb\((\d+),", colour).group(1))
                assert abs(red - (255 - 247 * max(0.0, a) / most)) <= 1
        assert feature.get_attribute("class") == "node feature chosen"
        screenshot(page.locator("section", has=page.get_by_label("Attribution graph")), "graph.png")
        assert watched.errors == [] and all(url.startswith(graph_served.url + "/") for url in watched.requests)
    finally:
        watched.close()


def test_the_graph_view_of_a_server_without_transcoders_says_how_to_start_one(browser, served):
    watched = Watched(browser, served.url)
    try:
        watched.wait_for_model()
        draw_graph(watched, "Hello")
        expect(watched.page.locator("#graph-error")).to_have_text(
            "400: the server has no transcoders: start it with gpt2 serve --transcoders DIR (a transcoder set, "
            "circuit-tracer's or SAELens's)"
        )
        expect(watched.page.locator("#graph [data-node-id]")).to_have_count(0)
    finally:
        watched.close()
