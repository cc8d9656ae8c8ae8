"""What the tests of `gpt2 serve` share (tests/serve/test_serve_*.py): a tiny model with GPT-2's
vocabulary, servers of it started once per test run, and the ways the tests talk to them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

import httpx
import pytest
from forks import Forks
from helpers import REPO, heed_ctrl_c, hf_and_ours, make_hf_model, perturbed, serving

from gpt2 import Tokenizer
from gpt2.cli import main
from gpt2.generation.generate import generate_text
from gpt2.model.model import GPT2
from gpt2.tokenizer import CharTokenizer

ENC = Tokenizer.gpt2()
N_CTX = 128
HANG = 60  # seconds: a request's timeout, only a bound for a hang (httpx's default, 5 s, a busy machine can exceed)


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    directory = tmp_path_factory.mktemp("served")
    hf, ours = hf_and_ours(directory, seed=5, vocab_size=50257, n_positions=N_CTX, n_embd=48, n_layer=2, n_head=3)
    return hf, ours, str(directory)


@pytest.fixture(scope="session")
def server(models):
    yield from serving(models[1], ENC)


@pytest.fixture(scope="session")
def client(server):
    return server.client()


def ours(models, prompt, **options):
    return generate_text(models[1], ENC, prompt, **options)


def complete(client, **request):
    if "top_k" in request:  # our field, not OpenAI's: the client sends it as extra_body
        request["extra_body"] = {"top_k": request.pop("top_k")}
    return client.completions.create(model="tiny", **request)


SPECIAL_PROMPT = "The end.<|endoftext|>A new story"


def gpt2_generate(capsys, models, prompt, *flags):
    capsys.readouterr()
    argv = ["generate", prompt, "--model", models[2], "--max-new-tokens", "12", "--temperature", "0", "--no-stream"]
    assert main([*argv, *flags]) == 0
    return capsys.readouterr().out.removesuffix("\n")


def metric(url: str, name: str) -> float:
    """One value of the server's /metrics."""
    line = next(
        line for line in httpx.get(url + "/metrics", timeout=HANG).text.splitlines() if line.startswith(name + " ")
    )
    return float(line.split()[1])


def post(server, body, path="/v1/completions", **options):
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    options.setdefault("timeout", HANG)  # httpx's 5 s is short for a request that computes, on a busy machine
    return httpx.post(server.url + path, content=content, headers={"content-type": "application/json"}, **options)


@pytest.fixture(scope="session")
def char_server(tmp_path_factory):
    """A character model ("out-char/", as tab completion writes its directory) whose vocabulary is " " to "`"."""
    directory = tmp_path_factory.mktemp("out-char")
    make_hf_model(vocab_size=65, n_positions=32, n_embd=32, n_layer=1, n_head=2).save_pretrained(directory)
    CharTokenizer([chr(c) for c in range(32, 97)]).save(directory)
    model = GPT2.from_pretrained(directory, device="cpu")
    yield from serving(model, model.tokenizer, "out-char/")


def api_token(i: int) -> str:
    """A token as OpenAI's API writes it in logprobs: its text, or "bytes:\\xNN" for part of a character."""
    raw = ENC.decode_bytes([i])
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


@pytest.fixture(scope="session")
def draft_dir(models, tmp_path_factory):
    """A draft of the served model's vocabulary, which agrees with it often, not always."""
    directory = tmp_path_factory.mktemp("draft")
    perturbed(models[0], 0.5).save_pretrained(directory)
    return str(directory)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpt2_serve(forks: Forks, *flags: str, code: str | None = None) -> tuple[subprocess.Popen, str]:
    """`gpt2 serve` in a process of its own, forked (tests/forks.py: signals reach it through the
    process returned), once its model has loaded; and its URL. `code`: a `python -c` program that
    runs the command (`gpt2.cli.main(sys.argv[1:])`), after patching what the test needs patched.
    The port is one free when chosen: where another process takes it first (a Ray cluster, another
    suite's server), the command cannot listen, or the server answering is not this one (its
    /v1/models serves another model), and it starts again on another port."""
    for attempt in range(3):
        process, url = _start_serve(forks, free_port(), flags, code)
        if _serves(process, url, _served_ids(flags)):
            return process, url
        process.kill()  # (still running: another server answers on its port)
        out, err = process.communicate()
        taken = process.returncode == -signal.SIGKILL or "cannot listen" in err
        if attempt == 2 or not taken:
            raise AssertionError(f"gpt2 serve did not start: {(out, err)}")
    raise AssertionError("unreachable")


def _start_serve(forks: Forks, port: int, flags: tuple[str, ...], code: str | None) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO / "src")}
    program = [str(forks.command)] if code is None else [str(forks.python), "-c", code]
    argv = [*program, "serve", "--port", str(port), "--device", "cpu", *flags]
    process = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=heed_ctrl_c
    )
    return process, f"http://127.0.0.1:{port}"


def _served_ids(flags: tuple[str, ...]) -> list[str]:
    """The model ids /v1/models lists for these flags: --model's (less a trailing slash), none with --runs
    alone, else gpt2's."""
    if "--model" in flags:
        return [flags[flags.index("--model") + 1].rstrip("/")]
    return [] if "--runs" in flags else ["gpt2"]


def _serves(process: subprocess.Popen, url: str, ids: list[str]) -> bool:
    """Whether `process` came to serve `ids` at `url` (False: it ended first, or another server answers there)."""
    deadline = time.monotonic() + 120  # a bound for a hang: the start is what is waited for
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(url + "/health", timeout=HANG).status_code == 200:
                models = httpx.get(url + "/v1/models", timeout=HANG).json()["data"]
                return [m["id"] for m in models] == ids
        except httpx.ConnectError:
            pass
        time.sleep(0.1)
    return False
