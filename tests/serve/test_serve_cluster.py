"""`gpt2 serve --replicas 2` (gpt2.serve.cluster): two Ray Serve replicas behind Ray's HTTP proxy, on a
Ray cluster of this machine started by the command and kept on the loopback. One server for the module:
its answers are transformers' and a single server's, both replicas answer under concurrent clients, Ray's
own `serve status` counts them, and a replica killed is restarted with no client given a wrong answer."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
from helpers import REPO, Watched, transformers_greedy
from serve_fixtures import ENC, HANG, N_CTX, free_port

from gpt2.cli import main
from gpt2.serve.cluster import REPLICA_HEADER, replica_threads

PROMPTS = ["Hello", "The quick brown fox", "Alan Turing theorized that", "1, 2, 3,", "Once upon a time"]
CLIENTS = 16
RESTART = 120  # seconds: a bound for Ray restarting a replica on a busy machine


@pytest.fixture(scope="module")
def ray_env(tmp_path_factory) -> dict[str, str]:
    """The environment of a cluster of the test's own: no RAY_ADDRESS, and the token of Ray's token
    authentication (on by default for a cluster ray.init starts) kept with the test, not in ~/.ray."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO / "src")}
    env.pop("RAY_ADDRESS", None)
    token = tmp_path_factory.mktemp("ray") / "auth_token"
    token.write_text(secrets.token_hex(32))
    env["RAY_AUTH_TOKEN_PATH"] = str(token)
    return env


@dataclass
class Replicas:
    url: str
    dashboard: str
    served: Watched
    env: dict[str, str]
    address: str  # the cluster's, for RAY_ADDRESS


@pytest.fixture(scope="module")
def replicas(models, ray_env):
    """`gpt2 serve --replicas 2` of the tiny model: its URL, dashboard and process, until the module ends."""
    env = ray_env
    port = free_port()
    command = [sys.executable, "-m", "gpt2", "serve", "--model", models[2], "--replicas", "2", "--port", str(port)]
    served = Watched([*command, "--device", "cpu", "--max-batch-size", "4"], env, subprocess.DEVNULL)
    try:
        served.wait_for(r"as 2 Ray Serve replicas on \S+; the playground .*serve status -a (\S+)\)", 240)
        address, dashboard = re.search(r"this machine at (\S+), its dashboard on (\S+) ", served.err).groups()
        yield Replicas(f"http://127.0.0.1:{port}", dashboard, served, env, address)
    finally:
        if served.process.poll() is None:
            served.stop(signal.SIGINT, timeout=90)


def complete(url: str, prompt: str, **fields) -> httpx.Response:
    body = {"model": "m", "prompt": prompt, "max_tokens": 8, "temperature": 0, **fields}
    return httpx.post(url + "/v1/completions", json=body, timeout=HANG)


def expected(models, prompt: str) -> str:
    """transformers' greedy continuation, as text."""
    return ENC.decode(transformers_greedy(models[0], ENC.encode(prompt), 8))


def test_two_replicas_answer_as_transformers_and_as_one_server_under_concurrent_clients(models, replicas, server):
    url = replicas.url
    want = {prompt: expected(models, prompt) for prompt in PROMPTS}
    asks = [PROMPTS[i % len(PROMPTS)] for i in range(CLIENTS * 3)]
    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = list(pool.map(lambda p: complete(url, p, model=models[2]), asks))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200][:3]
    assert [a.json()["choices"][0]["text"] for a in answers] == [want[p] for p in asks]
    assert len({a.headers[REPLICA_HEADER] for a in answers}) == 2  # both replicas answered
    one = {p: complete(server.url, p, model="tiny").json()["choices"][0]["text"] for p in PROMPTS}
    assert one == want  # the single server's answers, the same


def test_streaming_the_page_and_the_errors_are_the_single_servers(models, replicas, server):
    url = replicas.url
    with httpx.stream(
        "POST",
        url + "/v1/completions",
        json={"model": models[2], "prompt": PROMPTS[2], "max_tokens": 8, "temperature": 0, "stream": True},
        timeout=HANG,
    ) as streamed:
        chunks = [line.removeprefix("data: ") for line in streamed.iter_lines() if line.startswith("data: ")]
    assert chunks[-1] == "[DONE]"
    assert "".join(json.loads(c)["choices"][0]["text"] for c in chunks[:-1]) == expected(models, PROMPTS[2])
    assert httpx.get(url + "/", timeout=HANG).text == httpx.get(server.url + "/", timeout=HANG).text
    for fields in ({"max_tokens": N_CTX + 1}, {"temperature": -1}, {"n": 99}):
        ours, one = complete(url, "Hi", model=models[2], **fields), complete(server.url, "Hi", model="tiny", **fields)
        assert (ours.status_code, ours.json()) == (one.status_code, one.json()), fields
        assert ours.status_code == 400
    wrong = complete(url, "Hi", model="no-such-model")
    assert wrong.status_code == 404 and "no-such-model" in wrong.json()["error"]["message"]


def ray_cli(*args: str, replicas: Replicas) -> str:
    """Ray's own CLI, as the command's line says: `RAY_AUTH_MODE=token serve ARGS -a DASHBOARD`."""
    serve = os.path.join(os.path.dirname(sys.executable), "serve")
    env = {**replicas.env, "RAY_AUTH_MODE": "token"}
    command = [serve, *args, "-a", replicas.dashboard]
    return subprocess.run(command, capture_output=True, text=True, timeout=HANG, check=True, env=env).stdout


def serve_status(replicas: Replicas) -> str:
    return ray_cli("status", replicas=replicas)


def running_replicas(status: str) -> int:
    """The replicas `serve status` counts as running."""
    match = re.search(r"replica_states:\s*\n\s*RUNNING: (\d+)\s*\n\s*message", status)
    return int(match[1]) if match else 0


def cluster_processes(served: Watched) -> list[psutil.Process]:
    """The processes of the cluster the command started: its descendants."""
    return psutil.Process(served.process.pid).children(recursive=True)


def test_the_cluster_talks_over_the_loopback_alone(replicas):
    """Every connection between the cluster's processes is on 127.0.0.1; every listening socket but Ray
    Serve's own replica-to-replica gRPC server (which Ray binds to every address, unconfigurably) is too."""
    loopback = ("127.0.0.1", "::ffff:127.0.0.1", "::1")
    processes = [psutil.Process(replicas.served.process.pid), *cluster_processes(replicas.served)]
    wide = []
    for process in processes:
        try:
            connections = process.net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        for c in connections:
            if c.status == psutil.CONN_ESTABLISHED:
                assert c.laddr.ip in loopback and c.raddr.ip in loopback, (process.name(), c)
            elif c.status == psutil.CONN_LISTEN and c.laddr.ip not in loopback:
                wide.append(" ".join(process.cmdline())[:60])
    assert all("ServeReplica" in name for name in wide), wide
    assert any(c.status == psutil.CONN_LISTEN for p in processes[:1] for c in p.net_connections())  # it did look


def replica_processes(served: Watched) -> list[psutil.Process]:
    return [p for p in cluster_processes(served) if "ServeReplica:gpt2" in " ".join(p.cmdline())]


def test_a_replica_killed_is_restarted_and_no_client_gets_a_wrong_answer(models, replicas):
    url, served = replicas.url, replicas.served
    want = {prompt: expected(models, prompt) for prompt in PROMPTS}
    victim = replica_processes(served)[0]
    names_before = {complete(url, p, model=models[2]).headers[REPLICA_HEADER] for p in PROMPTS * 2}

    def ask(i: int) -> tuple[str, int, str]:
        prompt = PROMPTS[i % len(PROMPTS)]
        if i == CLIENTS:  # half way through: the kill, while requests are in flight
            victim.kill()
        try:
            answer = complete(url, prompt, model=models[2])
        except httpx.TransportError as e:  # a connection cut is retryable too
            return prompt, 0, repr(e)
        return prompt, answer.status_code, answer.text

    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = list(pool.map(ask, range(CLIENTS * 2)))
    for prompt, status, text in answers:
        if status == 200:
            assert json.loads(text)["choices"][0]["text"] == want[prompt]
        else:  # at worst an error that a client retries (openai's client retries 5xx and cut connections)
            assert status == 0 or status >= 500, (status, text)
    deadline = time.monotonic() + RESTART
    names_after: set[str] = set()
    while len(names_after) != 2 or names_after == names_before:  # until the new replica answers beside the other
        assert time.monotonic() < deadline, serve_status(replicas)
        answered = [complete(url, p, model=models[2]) for p in PROMPTS * 2]
        assert all(
            a.status_code >= 500 or a.json()["choices"][0]["text"] == want[p] for a, p in zip(answered, PROMPTS * 2)
        )
        names_after = {a.headers[REPLICA_HEADER] for a in answered if a.status_code == 200}
    assert not victim.is_running() and len(replica_processes(served)) == 2
    status = serve_status(replicas)  # Ray's own CLI counts the replicas running: two again
    assert re.search(r"gpt2:\s*\n\s*status: RUNNING", status) and running_replicas(status) == 2, status


def test_on_the_cluster_at_ray_address_a_model_that_fails_to_load_is_one_line_naming_its_error(
    models, replicas, tmp_path
):
    """`RAY_ADDRESS=... gpt2 serve --replicas 1` joins the cluster running (the fixture's, its Serve shut down
    first with Ray's CLI: its CPUs are the replicas'); a model whose config reads but whose weights do not
    fails in the replicas, and the command says why, and deletes its application."""
    ray_cli("shutdown", "-y", replicas=replicas)
    (tmp_path / "config.json").write_bytes((Path(models[2]) / "config.json").read_bytes())
    (tmp_path / "model.safetensors").write_bytes((Path(models[2]) / "model.safetensors").read_bytes()[:1000])
    command = [sys.executable, "-m", "gpt2", "serve", "--model", str(tmp_path), "--replicas", "1", "--device", "cpu"]
    env = {**replicas.env, "RAY_ADDRESS": replicas.address, "RAY_AUTH_MODE": "token"}  # its token, sent
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("gpt2: ")]
    assert lines[-1].startswith("gpt2: error: the replicas failed to start: "), result.stderr[-3000:]
    assert "model.safetensors is truncated or corrupt" in lines[-1]
    assert "Deleting app ['gpt2']" in result.stderr  # its application, as it ended (Ray's own line)


def test_gpt2_serve_replicas_stops_its_cluster_on_ctrl_c(replicas):
    served = replicas.served
    processes = cluster_processes(served)
    served.stop(signal.SIGINT, timeout=90)
    gone, alive = psutil.wait_procs(processes, timeout=60)
    assert not alive, [" ".join(p.cmdline())[:60] for p in alive]


def test_each_replica_gets_its_share_of_the_cores():
    assert [replica_threads(n, cores=8) for n in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]


def test_gpt2_serve_replicas_refusals_are_one_line(models, tmp_path, capsys, monkeypatch):
    def refused(*flags: str) -> str:
        capsys.readouterr()
        assert main(["serve", "--device", "cpu", *flags]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("gpt2: error: "), err
        return err

    assert "--replicas must be a positive integer, got 0" in refused("--model", models[2], "--replicas", "0")
    assert "--replicas serves with a model" in refused("--runs", str(tmp_path), "--replicas", "2")
    monkeypatch.setitem(sys.modules, "ray", None)  # the cluster extra not installed
    assert "pip install 'gpt2[cluster]'" in refused("--model", models[2], "--replicas", "2")
