"""`gpt2 serve` the command (gpt2.serve.launch): flags reach the server, signals end it cleanly,
while loading too, and its refusals are one line."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import httpx
import openai
import pytest
from helpers import REPO, Watched, make_hf_model, transformers_greedy
from serve_fixtures import HANG, N_CTX, SPECIAL_PROMPT, free_port, gpt2_generate, gpt2_serve, metric, ours

from gpt2.cli import main
from gpt2.tokenizer import CharTokenizer


def test_gpt2_serve_with_a_draft_model_and_its_refusals_in_one_line(models, draft_dir, capsys, tmp_path, forks):
    process, url = gpt2_serve(forks, "--model", models[2], "--draft-model", draft_dir, "--draft-tokens", "2")
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        served = (
            client.completions.create(model=models[2], prompt="Hello", max_tokens=12, temperature=0).choices[0].text
        )
        assert served == ours(models, "Hello", max_new_tokens=12, temperature=0)[0]
        assert metric(url, "gpt2_draft_tokens_total") > 0
    finally:
        process.kill()
    make_hf_model(vocab_size=65, n_positions=32, n_embd=32, n_layer=1, n_head=2).save_pretrained(tmp_path)
    CharTokenizer([chr(c) for c in range(32, 97)]).save(tmp_path)
    capsys.readouterr()
    for flags, message in [
        (
            ["--draft-model", str(tmp_path)],
            "--draft-model has a vocabulary of 65 tokens, the model 50,257: "
            "a draft model must share the model's tokenizer",
        ),
        (
            ["--draft-tokens", "3"],
            "--draft-tokens is the number of tokens a draft proposes: give --draft-model or --speculative ngram too",
        ),
        (
            ["--draft-model", draft_dir, "--speculative", "ngram"],
            "--draft-model and --speculative ngram contradict: speculate with a "
            "draft model or by prompt lookup, not both",
        ),
        (
            ["--prompt-lookup-max", "6"],
            "--prompt-lookup-max and --prompt-lookup-min set --speculative ngram: give it too",
        ),
        (
            ["--speculative", "ngram", "--prompt-lookup-min", "5"],
            "--prompt-lookup-min (5) must not exceed --prompt-lookup-max (4)",
        ),
        (["--draft-model", draft_dir, "--draft-tokens", "0"], "--draft-tokens must be a positive integer, got 0"),
    ]:  # refused before the port is taken: no "serving ... on" first
        assert main(["serve", "--model", models[2], "--port", str(free_port()), *flags]) == 2
        assert capsys.readouterr().err == f"gpt2: error: {message}\n"


# `gpt2 serve` whose decoding, once a token has come, makes no more until the server is told to stop:
# a request still in flight when the signal comes, however fast the rest of it would have been made
HELD = """
import sys, threading
import gpt2.generation.decoding as decoding
import gpt2.serve.launch as launch
from gpt2.cli import main

told_to_stop = threading.Event()
step, handle_exit = decoding.Decoder.step, launch._Uvicorn.handle_exit

def held_step(self):
    if getattr(self, "held", False):
        told_to_stop.wait(120)
        return []  # still no token: the rows in flight are ended by the stop
    events = step(self)
    self.held = any(token is not None for _, token in events)
    return events

def exiting(self, sig, frame):
    told_to_stop.set()
    handle_exit(self, sig, frame)

decoding.Decoder.step, launch._Uvicorn.handle_exit = held_step, exiting
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_gpt2_serve_stops_cleanly_on_a_signal_ending_requests_in_flight(models, sig, forks):
    process, url = gpt2_serve(forks, "--model", models[2], code=HELD)
    port = int(url.rsplit(":", 1)[1])
    try:
        body = {"model": models[2], "prompt": "A very long answer:", "max_tokens": N_CTX - 10, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=HANG) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: {")
            process.send_signal(sig)
            rest = [line for line in lines if line]
        assert any('"error"' in line and "shutting down" in line for line in rest) and rest[-1] == "data: [DONE]"
        # uvicorn shuts down, then dies of SIGTERM as the signal's default would (or exits 0, in older
        # uvicorns); SIGINT comes back as KeyboardInterrupt, which gpt2 reports with the usual 130
        assert process.wait(timeout=60) in ((0, -signal.SIGTERM) if sig == signal.SIGTERM else (0, 130))
        err = process.stderr.read() + process.stdout.read()  # uvicorn logs requests to stdout
        assert f"serving {models[2]} on http://127.0.0.1:{port}/v1; the playground on http://127.0.0.1:{port}/ (" in err
        assert '"POST /v1/completions HTTP/1.1" 200' in err
        assert "Application shutdown complete" in err
    finally:
        process.kill()


def test_gpt2_serve_special_as_text_no_ui_and_a_directory_with_a_trailing_slash(models, capsys, forks):
    """The flags reach the server: its greedy answer equals gpt2 generate --special-as-text's, the
    page is off, the answer bound is the one given; the id loses the slash."""
    process, url = gpt2_serve(
        forks, "--model", models[2] + "/", "--special-as-text", "--no-ui", "--max-inspect-cells", "600"
    )
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        assert [m.id for m in client.models.list().data] == [models[2]]
        served = (
            client.completions.create(model=models[2], prompt=SPECIAL_PROMPT, max_tokens=12, temperature=0)
            .choices[0]
            .text
        )
        as_text, special = (
            gpt2_generate(capsys, models, SPECIAL_PROMPT, *flags) for flags in (["--special-as-text"], [])
        )
        assert served == as_text != special
        assert httpx.get(url + "/").status_code == 404
        assert (
            httpx.post(url + "/v1/inspect", json={"prompt": [1] * 10}, timeout=HANG).status_code == 200
        )  # 2 x 3 x 10 x 10 = 600
        assert (
            "limit of 600"
            in httpx.post(url + "/v1/inspect", json={"prompt": [1] * 11}, timeout=HANG).json()["error"]["message"]
        )
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 130
        assert f"gpt2: serving {models[2]}/ on {url}/v1 (" in process.stderr.read()
    finally:
        process.kill()


SLOW_LOAD = """
import sys, time, torch
import gpt2.model.model
from gpt2.cli import main

def load_for_two_minutes(*args, **kwargs):  # a long load, inside torch as a real one is
    a, deadline = torch.tanh(torch.rand(256, 256) @ torch.rand(256, 256)), time.monotonic() + 120
    print("test: loading", file=sys.stderr, flush=True)  # under way: the test signals now
    while time.monotonic() < deadline:
        a = torch.tanh(a @ a)
    raise AssertionError("the load was not interrupted")

gpt2.model.model.GPT2.from_pretrained = load_for_two_minutes
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_while_the_model_loads_ends_cleanly(models, sig):
    """Not SIGABRT ("terminate called without an active exception"): no thread is inside torch when the process ends."""
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO / "src")}
    argv = [sys.executable, "-c", SLOW_LOAD, "serve", "--model", models[2], "--port", str(port), "--device", "cpu"]
    run = Watched(argv, env, subprocess.DEVNULL)
    try:
        run.wait_for("test: loading")  # the load is under way, in torch
        response = httpx.get(f"http://127.0.0.1:{port}/health", timeout=HANG)  # (the port listens before the load)
        assert response.status_code == 503 and "still loading" in response.text
        took = run.stop(sig)
        code, err = run.process.returncode, run.err
        assert "terminate called" not in err and "Traceback" not in err and "Fatal Python error" not in err, err
        if sig == signal.SIGINT:  # "gpt2: interrupted" and 130, as every command
            assert (code, err.splitlines()[-1]) == (130, "gpt2: interrupted")
        else:  # SIGTERM takes its default course, as once the model has loaded
            assert code == -signal.SIGTERM
        assert took < 30  # not the load's two minutes
    finally:
        run.process.kill()


def test_gpt2_serve_refuses_a_busy_port_and_a_missing_model_in_one_line(models, capsys, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--model", models[2], "--port", str(port)]) == 2
        err = capsys.readouterr().err  # one line: no "serving ... on" before it
        assert err.startswith(f"gpt2: error: cannot listen on 127.0.0.1:{port}: ") and err.count("\n") == 1
    # an address of no interface here (TEST-NET-1, documentation's own), so that no name is looked up
    assert main(["serve", "--model", models[2], "--host", "192.0.2.1", "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpt2: error: cannot listen on 192.0.2.1:") and err.count("\n") == 1
    assert main(["serve", "--model", str(tmp_path / "nowhere"), "--port", str(free_port())]) == 2
    err = capsys.readouterr().err  # found before the port is taken: no "serving ... on" either
    assert err.startswith(f"gpt2: error: unknown model '{tmp_path / 'nowhere'}'") and err.count("\n") == 1
    assert main(["serve", "--max-batch-size", "0"]) == 2
    assert capsys.readouterr().err == "gpt2: error: --max-batch-size must be a positive integer, got 0\n"
    assert main(["serve", "--max-num-batched-tokens", "4"]) == 2
    assert capsys.readouterr().err == (
        "gpt2: error: --max-num-batched-tokens must be at least "
        "--max-batch-size (8), as each step decodes a token of every row; got 4\n"
    )
    assert main(["serve", "--prefix-cache-mb", "-1"]) == 2
    assert (
        capsys.readouterr().err == "gpt2: error: --prefix-cache-mb must be a whole number of MB, 0 for none, got -1\n"
    )
    assert main(["serve", "--port", "99999"]) == 2  # refused before the server says it serves
    assert capsys.readouterr().err == "gpt2: error: --port must be an integer from 0 to 65535, got 99999\n"
    assert main(["serve", "--cuda-graphs", "--device", "cpu"]) == 2
    assert capsys.readouterr().err == "gpt2: error: --cuda-graphs replays decoding on a CUDA GPU; --device cpu is cpu\n"


MEMORY_LEFT = """
import sys
import gpt2.devices
LEFT = int(sys.argv.pop(1))  # what the machine has left, in bytes
gpt2.devices.available_memory = lambda device: LEFT
from gpt2.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_batch_whose_kv_cache_cannot_fit_is_refused_before_the_port_is_taken(models, forks):
    """Each row of --max-batch-size holds a KV cache of the whole context (and its step's logits).
    The command is forked (tests/forks.py), its available memory patched in its own process."""
    needed = 64 * (2 * 2 * N_CTX * 48 * 4 + 3 * 50257 * 4)  # 64 rows: float32 keys and values of 2 layers, 48 wide
    port = free_port()
    argv = [
        str(forks.python),
        "-c",
        MEMORY_LEFT,
        "10000000",
        "serve",
        "--model",
        models[2],
        "--port",
        str(port),
        "--max-batch-size",
        "64",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO / "src")}
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr == (
        f"gpt2: error: a KV cache of 64 rows of {N_CTX} positions needs about {needed / 1e6:.1f} MB of "
        f"memory, but the CPU has 10.0 MB available: a smaller --max-batch-size\n"
    )


def test_gpt2_serve_serves_a_model_with_no_tokenizer_on_token_ids(forks):
    """A model trained here on a vocabulary of its own (no tokenizer) starts, answers a prompt of ids with
    transformers' ids, and refuses a text prompt with a 400 saying it needs a tokenizer."""
    from transformers import GPT2LMHeadModel

    model, prompt = str(REPO / "tests" / "fixtures" / "induction_2l"), [3, 14, 15, 9, 26, 3, 14]
    process, url = gpt2_serve(forks, "--model", model)
    try:
        body = {"prompt": prompt, "max_tokens": 6, "temperature": 0}
        choice = httpx.post(url + "/v1/completions", json=body, timeout=HANG).json()["choices"][0]
        refused = httpx.post(url + "/v1/completions", json={**body, "prompt": "3 14 15"}, timeout=HANG)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 130
    finally:
        process.kill()
    expected = transformers_greedy(GPT2LMHeadModel.from_pretrained(model).eval(), prompt, 6)
    assert (choice["text"], choice["prompt_token_ids"], choice["token_ids"]) == ("", prompt, expected)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "tokenizer_required"
