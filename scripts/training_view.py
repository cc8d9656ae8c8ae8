"""The picture of the playground's Training view in docs/train.md ("Watching a run"): a finished run served
by `gpt2 serve --runs` (no model), the induction score chosen at the last evaluation, and one head's
attention, taken in Chromium.

    gpt2 prepare --out data/induction_2l --synthetic induction
    gpt2 train --recipe induction_2l --threads 1
    python scripts/training_view.py out-induction-2l docs/images/training.png [--head 1.0]

It needs the serve extra and Playwright (the dev extra) with a Chromium (Debian's `chromium`, or
`python -m playwright install chromium`).
"""

from __future__ import annotations

import argparse
import shutil
import threading
from pathlib import Path

import uvicorn
from playwright import sync_api as playwright

from gpt2.serve import create_app, listen
from gpt2.training.loggers import read_log
from gpt2.training.probes import PROBES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a run's directory (gpt2 train's --out), with probes.jsonl")
    parser.add_argument("png", type=Path, help="the picture to write")
    parser.add_argument("--head", default="1.0", help="LAYER.HEAD whose attention is shown (default: 1.0)")
    args = parser.parse_args()
    evaluations = len(read_log(args.run / PROBES))
    layer, head = args.head.split(".")
    server = uvicorn.Server(uvicorn.Config(create_app(None, None, runs=args.run), log_level="warning"))
    sock = listen("127.0.0.1", 0)
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/"
    with playwright.sync_playwright() as p:
        path = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
        browser = p.chromium.launch(executable_path=path) if path else p.chromium.launch()
        page = browser.new_context(viewport={"width": 1280, "height": 900}, device_scale_factor=1).new_page()
        page.goto(url)
        page.wait_for_function(
            f"() => Number(document.getElementById('training').dataset.evaluations) === {evaluations}", timeout=60_000
        )
        page.locator("#training-score").select_option("induction")
        page.locator("#training-evaluation").focus()
        page.keyboard.press("End")  # the last evaluation
        page.locator(f'#training-heads [data-layer="{layer}"][data-head="{head}"]').click()
        page.mouse.move(0, 0)
        page.screenshot(path=str(args.png), full_page=True)
        browser.close()
    server.should_exit = True
    print(f"wrote {args.png}: {args.run}'s {evaluations} evaluations, head {args.head}'s attention at the last")


if __name__ == "__main__":
    main()
