"""The playground's Training view (`gpt2 serve --runs DIR`) in a real browser: a run directory's
log.jsonl and probes.jsonl, written by the test as `gpt2 train` writes them (a whole line at a time,
rewritten cut back on a resume), followed live by the page. What the page shows is checked against
the records in the files: each heat map cell against the probe record's head_scores, the attention
grid against its attention, the loss chart's points against the log's evaluations.

A server of runs alone serves no model: the page opens on its Training view. The screenshot
test-artifacts/training.png is the view on the test's records, to look at (docs/train.md's picture is
scripts/training_view.py's, of a real run).
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from browser_fixtures import Watched, screenshot
from helpers import Running

from gpt2.data.synthetic import prepare_synthetic
from gpt2.training.train import train

pytestmark = pytest.mark.browser

N_LAYER, N_HEAD = 2, 4
EVAL_INTERVAL, LOG_INTERVAL = 50, 10
REPEAT = 12  # the probe: 12 random characters written twice, as gpt2 train's induction probe
INDUCTION_HEAD, PREVIOUS_HEAD = (1, 2), (0, 1)  # the heads that specialise, and when (their scores' midpoints)
ALPHABET = "abcdefghijklmnopqrstuvwxyz"


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


class FakeRun:
    """A run's log.jsonl and probes.jsonl as a 2-layer, 4-head character model's training writes them: its
    loss falling, a previous-token head forming by iteration ~300 and an induction head at ~550, the loss's
    drop with it (the records are made up, their format gpt2 train's: docs/train.md)."""

    def __init__(self, directory: Path, seed: int = 0):
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(seed)
        half = self.rng.sample(ALPHABET, REPEAT)
        self.tokens = half + half
        self.done = -1  # the last iteration written
        self.settings = {"max_iters": 1000, "eval_interval": EVAL_INTERVAL, "sample_prompt": "abcabc"}

    def write(self, until: int) -> None:
        """The records of the iterations after the last written up to `until`, each appended as a whole line."""
        if self.done < 0:
            self._append("log.jsonl", {"iter": 0, "settings": self.settings})
        for it in range(self.done + 1, until + 1):
            if it % EVAL_INTERVAL == 0:
                self._append("log.jsonl", self.evaluation(it))
                self._append("probes.jsonl", self.probe(it))
            if it % LOG_INTERVAL == 0:
                self._append("log.jsonl", self.step(it))
        self.done = until

    def _append(self, name: str, record: dict) -> None:
        with open(self.directory / name, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def loss(self, it: int) -> float:
        return 1.1 + 3.05 * math.exp(-it / 140) + 0.9 * (1 - _sigmoid((it - 560) / 25))

    def step(self, it: int) -> dict:
        return {"iter": it, "loss": round(self.loss(it) + self.rng.gauss(0, 0.05), 4), "lr": 1e-3, "ms": 41.0}

    def evaluation(self, it: int) -> dict:
        train = self.loss(it) + self.rng.gauss(0, 0.01)
        record = {"iter": it, "train_loss": round(train, 4), "val_loss": round(train + 0.03, 4), "best": True}
        learned = _sigmoid((it - 560) / 25)
        record["sample"] = "".join(
            "abc"[i % 3] if self.rng.random() < 0.3 + 0.7 * learned else self.rng.choice(ALPHABET) for i in range(24)
        )
        return record

    def scores(self, it: int) -> dict[str, list[list[float]]]:
        def grid(special: dict[tuple[int, int], float]) -> list[list[float]]:
            return [
                [round(special.get((l, h), 0.02 + 0.08 * self.rng.random()), 4) for h in range(N_HEAD)]
                for l in range(N_LAYER)
            ]

        previous = 0.05 + 0.9 * _sigmoid((it - 300) / 60)
        induction = 0.03 + 0.92 * _sigmoid((it - 560) / 25)
        return {
            "previous_token": grid({PREVIOUS_HEAD: round(previous, 4)}),
            "duplicate_token": grid({(0, 3): round(0.1 + 0.5 * _sigmoid((it - 400) / 80), 4)}),
            "induction": grid({INDUCTION_HEAD: round(induction, 4)}),
        }

    def probe(self, it: int) -> dict:
        scores = self.scores(it)
        attention = [
            [self.pattern(scores["previous_token"][l][h], scores["induction"][l][h]) for h in range(N_HEAD)]
            for l in range(N_LAYER)
        ]
        lens = [[{"token": t, "id": ALPHABET.index(t), "prob": 0.5} for t in self.tokens] for _ in range(N_LAYER + 1)]
        sample = self.tokens[:16] if it >= 600 else self.rng.sample(ALPHABET, 16)
        return {
            "iter": it,
            "ids": [ALPHABET.index(t) for t in self.tokens],
            "tokens": list(self.tokens),
            "head_scores": scores,
            "attention": attention,
            "logit_lens": lens,
            "sample": "".join(sample),
            "sample_ids": [ALPHABET.index(t) for t in sample],
        }

    def pattern(self, previous: float, induction: float) -> list[list[float]]:
        """A head's T x T attention: a share to the token before, a share to the token after an earlier copy,
        the rest spread over the earlier tokens; 0 above the diagonal; 4 decimals."""
        T = len(self.tokens)
        rows = []
        for q in range(T):
            row = [0.0] * T
            targets = {}
            if q >= 1:
                targets[q - 1] = previous
            if q >= REPEAT:
                targets[q - REPEAT + 1] = targets.get(q - REPEAT + 1, 0) + induction
            rest = max(0.0, 1 - sum(targets.values()))
            for k in range(q + 1):
                row[k] = rest / (q + 1) + targets.get(k, 0)
            total = sum(row)
            rows.append([round(w / total, 4) for w in row])
        return rows


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def shown_heads(page) -> dict[tuple[int, int], float]:
    cells = page.eval_on_selector_all(
        "#training-heads button", "els => els.map(e => [e.dataset.layer, e.dataset.head, e.dataset.score])"
    )
    return {(int(layer), int(head)): float(score) for layer, head, score in cells}


def expected_heads(record: dict, kind: str) -> dict[tuple[int, int], float]:
    return {(l, h): s for l, row in enumerate(record["head_scores"][kind]) for h, s in enumerate(row)}


def shown_attention(page) -> list[list[float]]:
    cells = page.eval_on_selector_all(
        "#training-attention rect", "els => els.map(e => [e.dataset.query, e.dataset.key, e.dataset.weight])"
    )
    T = int(math.isqrt(len(cells)))
    grid = [[None] * T for _ in range(T)]
    for q, k, w in cells:
        grid[int(q)][int(k)] = float(w)
    return grid


def wait_for_evaluations(watched: Watched, n: int) -> None:
    watched.wait_until(f"document.getElementById('training').dataset.evaluations === '{n}'", timeout=60)


@pytest.fixture
def runs_server(tmp_path):
    running = Running(None, None, runs=tmp_path)
    yield running, tmp_path
    running.stop()


def test_a_server_of_runs_alone_opens_on_training_and_follows_a_run_as_it_is_written(browser, runs_server):
    server, directory = runs_server
    run = FakeRun(directory / "induction-2l")
    run.write(EVAL_INTERVAL)  # evaluations 0 and 50
    watched = Watched(browser, server.url)
    page = watched.page
    try:
        wait_for_evaluations(watched, 2)
        assert page.locator("#training").is_visible() and not page.locator("#playground").is_visible()
        assert page.get_by_role("button", name="Playground").is_disabled()
        assert "no model" in page.text_content("#model-info") and page.locator("#error").is_hidden()
        assert page.get_by_label("Run", exact=True).input_value() == "induction-2l"
        assert page.get_by_label("Evaluation").input_value() == "1"

        run.write(3 * EVAL_INTERVAL)  # the run goes on: the page follows
        wait_for_evaluations(watched, 4)
        run.write(1000)
        wait_for_evaluations(watched, 21)
        watched.wait_until("document.getElementById('training').dataset.lastIter === '1000'")
        probes = records(directory / "induction-2l" / "probes.jsonl")
        log = records(directory / "induction-2l" / "log.jsonl")
        assert [p["iter"] for p in probes] == list(range(0, 1001, EVAL_INTERVAL))

        # the heat map is the slider's evaluation's head scores (the newest, followed): induction first
        assert page.get_by_label("Score", exact=True).input_value() == "induction"
        assert page.text_content("#training-evaluation-iter").startswith("iteration 1,000")
        assert shown_heads(page) == expected_heads(probes[-1], "induction")
        evaluation = page.get_by_label("Evaluation")
        evaluation.focus()
        page.keyboard.press("Home")  # the first evaluation
        assert page.text_content("#training-evaluation-iter").startswith("iteration 0")
        assert shown_heads(page) == expected_heads(probes[0], "induction")
        for _ in range(12):
            page.keyboard.press("ArrowRight")  # iteration 600: the induction head has formed
        assert page.text_content("#training-evaluation-iter").startswith("iteration 600")
        page.get_by_label("Score", exact=True).select_option("previous_token")
        assert shown_heads(page) == expected_heads(probes[12], "previous_token")
        page.get_by_label("Score", exact=True).select_option("induction")
        assert shown_heads(page) == expected_heads(probes[12], "induction")

        # a head clicked: its attention at that evaluation, square for square
        page.locator(
            f'#training-heads button[data-layer="{INDUCTION_HEAD[0]}"][data-head="{INDUCTION_HEAD[1]}"]'
        ).click()
        assert shown_attention(page) == probes[12]["attention"][INDUCTION_HEAD[0]][INDUCTION_HEAD[1]]
        assert "Layer 1, head 2 at iteration 600" in page.text_content("#training-attention-caption")
        tokens = page.eval_on_selector_all("#training-attention text.token", "els => els.map(e => e.textContent)")
        assert tokens[::2] == probes[12]["tokens"]  # each token labels its row and its column

        # the loss chart: a point per evaluation, each at its loss; the score chart: a line per head
        evals = [r for r in log if "val_loss" in r]
        val = page.eval_on_selector_all(
            "#training-loss circle.val", "els => els.map(e => [Number(e.dataset.iter), Number(e.dataset.loss)])"
        )
        assert val == [[r["iter"], r["val_loss"]] for r in evals]
        assert page.locator("#training-loss circle.train").count() == len(evals)
        assert page.locator("#training-scores path.head").count() == N_LAYER * N_HEAD
        assert page.locator("#training-scores path.head.chosen").get_attribute("data-layer") == "1"

        # the samples, newest first, each with its iteration
        first = page.locator("#training-samples li").first
        assert first.get_attribute("data-iter") == "1000"
        assert evals[-1]["sample"] in first.text_content() and probes[-1]["sample"] in first.text_content()

        origin = urlsplit(server.url).netloc
        assert all(urlsplit(url).netloc == origin for url in watched.requests if not url.startswith("data:"))
        assert watched.errors == []
        page.mouse.move(0, 0)
        screenshot(page, "training.png")  # the view as a person sees it
    finally:
        watched.close()


def test_a_run_cut_back_by_a_resume_is_read_again_from_its_start(browser, runs_server):
    server, directory = runs_server
    run = FakeRun(directory)  # the server's directory is the run itself
    run.write(4 * EVAL_INTERVAL)
    watched = Watched(browser, server.url + "/#training")
    try:
        wait_for_evaluations(watched, 5)
        assert watched.page.get_by_label("Run", exact=True).input_value() == directory.name
        for name in ("log.jsonl", "probes.jsonl"):  # a resume from iteration 100's checkpoint, as gpt2 train's
            path = directory / name
            kept = [r for r in records(path) if r["iter"] < 2 * EVAL_INTERVAL + 1]
            scratch = path.with_suffix(".tmp")
            scratch.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
            os.replace(scratch, path)
        wait_for_evaluations(watched, 3)
        watched.wait_until("document.getElementById('training').dataset.lastIter === '100'")
        run.done = 2 * EVAL_INTERVAL
        run.write(3 * EVAL_INTERVAL)
        wait_for_evaluations(watched, 4)
        shown = watched.page.eval_on_selector_all("#training-loss circle.val", "els => els.map(e => e.dataset.iter)")
        assert shown == ["0", "50", "100", "150"]
        assert watched.errors == []
    finally:
        watched.close()


def test_the_training_view_of_a_server_with_no_runs_says_how_to_follow_one(browser, server):
    watched = Watched(browser, server.url + "/#training")
    try:
        watched.wait_until("document.getElementById('training-waiting').textContent.includes('--runs')")
        assert re.search(r"gpt2 serve --runs DIR", watched.page.text_content("#training-waiting"))
        assert watched.page.locator("#training-error").is_hidden() and watched.errors == []
    finally:
        watched.close()


# a real run of gpt2 train, tiny: the induction data's 2-layer model, narrow, a probe (16 random ids written twice)
# at each evaluation
REAL = dict(
    n_layer=2,
    n_head=2,
    n_embd=16,
    block_size=64,
    batch_size=2,
    eval_interval=5,
    eval_iters=1,
    lr=3e-3,
    warmup_iters=0,
    device="cpu",
)


def test_the_page_follows_a_real_run_of_gpt2_train_as_it_goes_on(browser, tmp_path, forks):
    prepare_synthetic(tmp_path / "data", "induction", rows=400, progress=False)
    out = tmp_path / "runs" / "induction"
    train(out, data=tmp_path / "data", max_iters=10, progress=False, **REAL)  # evaluations 0, 5 and 10
    server = Running(None, None, runs=tmp_path / "runs")
    watched = Watched(browser, server.url)
    page = watched.page
    try:
        wait_for_evaluations(watched, 3)
        argv = [str(forks.command), "train", "--out", str(out), "--resume", "--max-iters", "20", "--threads", "1"]
        resumed = subprocess.Popen([*argv, "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for_evaluations(watched, 5)  # 15 and 20, as the run writes them
        _, err = resumed.communicate(timeout=120)
        assert resumed.returncode == 0, err
        watched.wait_until("document.getElementById('training').dataset.lastIter === '20'")
        probes = records(out / "probes.jsonl")
        assert [p["iter"] for p in probes] == [0, 5, 10, 15, 20]
        assert page.text_content("#training-evaluation-iter").startswith("iteration 20")
        assert shown_heads(page) == expected_heads(probes[-1], "induction")
        page.locator('#training-heads button[data-layer="1"][data-head="0"]').click()
        assert shown_attention(page) == probes[-1]["attention"][1][0]
        tokens = page.eval_on_selector_all("#training-attention text.token", "els => els.map(e => e.textContent)")
        assert tokens[::2] == [str(i) for i in probes[-1]["ids"]]  # no tokenizer: the ids
        evals = [r for r in records(out / "log.jsonl") if "val_loss" in r]
        assert [r["iter"] for r in evals] == [0, 5, 10, 15, 20]
        shown = page.eval_on_selector_all("#training-loss circle.val", "els => els.map(e => Number(e.dataset.loss))")
        assert shown == [r["val_loss"] for r in evals]
        assert "no samples" in page.text_content("#training-samples-waiting")
        assert watched.errors == []
    finally:
        watched.close()
        server.stop()
