"""What the page's browser tests share: Chromium driven by Playwright (the system's, else
Playwright's own; without either the tests fail, saying so, never skip), a page watched for what it
asks of the network and what its console says, and screenshots in test-artifacts/
($GPT2_TEST_ARTIFACTS), to be looked at. A plugin of tests/conftest.py (its `browser`
fixture, one Chromium a test module, and the shipped models served); tests/test_playground*.py import the
rest."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from helpers import REPO, serving
from playwright import sync_api as playwright

from gpt2.model.model import GPT2

ARTIFACTS = Path(os.environ.get("GPT2_TEST_ARTIFACTS", REPO / "test-artifacts"))


def screenshot(shot, name: str) -> None:
    """A page's or an element's picture in ARTIFACTS, to look at as a person would."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot.screenshot(path=str(ARTIFACTS / name), **({"full_page": True} if isinstance(shot, playwright.Page) else {}))


def system_chromium() -> str | None:
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as p:
        path = system_chromium()
        try:
            chromium = p.chromium.launch(executable_path=path) if path else p.chromium.launch()
        except playwright.Error as e:
            pytest.fail(
                f"no browser for the browser tests ({str(e).splitlines()[0]}): install Chromium "
                f"(apt-get install chromium, or python -m playwright install chromium)",
                pytrace=False,
            )
        yield chromium
        chromium.close()


class Watched:
    """A page with what it asked for and what its console said."""

    def __init__(self, browser, url: str, **context):
        self.context = browser.new_context(viewport={"width": 1280, "height": 900}, device_scale_factor=1, **context)
        self.page = self.context.new_page()
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda request: self.requests.append(request.url))
        self.page.on("console", lambda message: message.type == "error" and self.errors.append(message.text))
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.goto(url)

    def wait_until(self, condition: str, timeout: float = 30) -> None:
        """Wait for a JavaScript condition, checked by the browser at each frame (the timeout only
        bounds a hang: Playwright runs it in its own world, which the page's Content-Security-Policy
        does not cover)."""
        self.page.wait_for_function(f"() => {condition}", timeout=timeout * 1000)

    def wait_for_model(self) -> None:
        self.wait_until("document.getElementById('model-info').textContent.includes('context')")

    def generate(self, prompt: str, max_tokens: int | str, temperature: float | str | None, **fields: str) -> None:
        """Fill the form and click Generate; temperature None leaves the page's default."""
        page = self.page
        page.get_by_label("Prompt", exact=True).fill(prompt)
        page.get_by_label("Max tokens").fill(str(max_tokens))
        if temperature is not None:
            page.get_by_label("Temperature", exact=True).fill(str(temperature))
        for label, value in fields.items():
            page.get_by_label({"top_k": "Top-k", "top_p": "Top-p", "seed": "Seed"}[label]).fill(value)
        page.get_by_role("button", name="Generate").click()

    def tokens(self) -> list[dict]:
        return self.page.eval_on_selector_all(
            "#completion .token",
            "els => els.map(e => ({id: Number(e.dataset.tokenId), logprob: Number(e.dataset.logprob), "
            "text: e.textContent}))",
        )

    def close(self) -> None:
        self.context.close()


# The models the page's tests serve besides their own random ones, a server a test module.


@pytest.fixture(scope="module")
def char_served():
    """shakespeare_char, the model gpt2 ships: a character vocabulary (65), a context of 64."""
    model = GPT2.from_pretrained("shakespeare_char", device="cpu")
    yield from serving(model, model.tokenizer, "shakespeare_char")


@pytest.fixture(scope="module")
def served_without_tokenizer():
    """tests/fixtures/induction_2l: trained here on 64 ids, no tokenizer: served on token ids alone."""
    model = GPT2.from_pretrained(REPO / "tests" / "fixtures" / "induction_2l", device="cpu")
    assert model.tokenizer is None
    yield from serving(model, None, "induction")
