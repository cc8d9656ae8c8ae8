"""/v1/runs (gpt2.serve.runs, `gpt2 serve --runs DIR`): a training run's log.jsonl and probes.jsonl
read as they are written, against the records the test writes itself: whole lines only, from a line
on, in pages, again from the start where a resume cut a file back; the runs of a directory, listed
anew at each request; names that are no run's refused; a server of runs alone, with no model."""

from __future__ import annotations

import json
import os
import time

import httpx
import pytest
from fastapi.testclient import TestClient
from serve_fixtures import ENC, HANG, gpt2_serve

from gpt2.cli import main
from gpt2.serve import Limits, create_app
from gpt2.serve import runs as runs_module


def append(path, *records) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))


def strict(response: httpx.Response) -> dict:
    """The answer's JSON, as a browser reads it: NaN and Infinity are no JSON."""
    assert response.status_code == 200, response.text

    def refuse(constant):
        raise AssertionError(f"{constant} in the answer")

    return json.loads(response.text, parse_constant=refuse)


def client_of(directory, **options) -> TestClient:
    return TestClient(create_app(None, None, runs=directory, **options))


def steps(first: int, last: int) -> list[dict]:
    return [{"iter": it, "loss": 4.0 - it / 100, "lr": 1e-3, "ms": 12.5} for it in range(first, last)]


def test_a_run_is_read_from_a_line_on_and_a_last_line_only_once_it_is_whole(tmp_path):
    client = client_of(tmp_path)  # the directory is the run itself, named by its name
    name = tmp_path.name
    log = tmp_path / "log.jsonl"
    assert strict(client.get(f"/v1/runs/{name}/log")) == {"records": [], "next": 0, "reset": False}  # to come
    written = steps(0, 3)
    append(log, *written)
    with open(log, "a", encoding="utf-8") as f:
        f.write('{"iter": 3, "loss": 3.97')  # the last line still being written
    assert strict(client.get(f"/v1/runs/{name}/log")) == {"records": written, "next": 3, "reset": False}
    assert strict(client.get(f"/v1/runs/{name}/log?since=3")) == {"records": [], "next": 3, "reset": False}
    assert strict(client.get("/v1/runs")) == {"runs": [{"name": name, "iter": 2, "evaluations": 0}]}
    with open(log, "a", encoding="utf-8") as f:
        f.write(', "lr": 0.001}\n')  # the line finished
    evaluation = {"iter": 4, "train_loss": 3.9, "val_loss": float("nan"), "best": False, "sample": "the\ncat"}
    append(log, evaluation)
    answer = strict(client.get(f"/v1/runs/{name}/log?since=3"))
    assert answer == {
        "records": [{"iter": 3, "loss": 3.97, "lr": 0.001}, {**evaluation, "val_loss": None}],
        "next": 5,
        "reset": False,
    }
    assert strict(client.get(f"/v1/runs/{name}/log?since=1"))["records"][:2] == written[1:]
    assert strict(client.get("/v1/runs")) == {"runs": [{"name": name, "iter": 4, "evaluations": 0}]}


def test_a_long_probes_file_is_answered_in_pages(tmp_path, monkeypatch):
    client = client_of(tmp_path)
    name = tmp_path.name
    written = [{"iter": 10 * i, "attention": [[[[1.0]]]], "sample": "x" * 200} for i in range(120)]
    append(tmp_path / "probes.jsonl", *written)
    read, since, pages = [], 0, 0
    while since < len(written):  # at most 50 records an answer
        answer = strict(client.get(f"/v1/runs/{name}/probes?since={since}"))
        assert 0 < len(answer["records"]) <= 50 and answer["next"] == since + len(answer["records"])
        read += answer["records"]
        since, pages = answer["next"], pages + 1
    assert read == written and pages == 3
    assert strict(client.get("/v1/runs"))["runs"] == [{"name": name, "iter": None, "evaluations": 120}]
    monkeypatch.setattr(runs_module, "MAX_BYTES", 1000)  # and their bytes bounded: a big model's records are MBs
    line = len(json.dumps(written[0])) + 1
    answer = strict(client.get(f"/v1/runs/{name}/probes?since=7"))
    assert answer["records"] == written[7 : 7 + 1000 // line] and answer["next"] == 7 + 1000 // line
    monkeypatch.setattr(runs_module, "MAX_BYTES", 10)  # one record at least, however big
    assert strict(client.get(f"/v1/runs/{name}/probes?since=7")) == {"records": [written[7]], "next": 8, "reset": False}


def test_a_file_cut_back_by_a_resume_is_answered_whole_with_reset(tmp_path):
    client = client_of(tmp_path)
    name = tmp_path.name
    log = tmp_path / "log.jsonl"
    append(log, *steps(0, 10))
    assert strict(client.get(f"/v1/runs/{name}/log"))["next"] == 10
    kept = steps(0, 4)  # a resume from iteration 4's checkpoint rewrites it atomically, as gpt2 train does
    scratch = tmp_path / "log.jsonl.tmp"
    scratch.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
    os.replace(scratch, log)
    assert strict(client.get(f"/v1/runs/{name}/log?since=10")) == {"records": kept, "next": 4, "reset": True}
    append(log, *steps(4, 6))
    assert strict(client.get(f"/v1/runs/{name}/log?since=4")) == {"records": steps(4, 6), "next": 6, "reset": False}
    with open(log, "r+", encoding="utf-8") as f:  # cut in place too (the same file, shorter)
        f.truncate(len(json.dumps(kept[0])) + 1)
    assert strict(client.get(f"/v1/runs/{name}/log?since=6")) == {"records": kept[:1], "next": 1, "reset": True}


def test_names_that_are_no_runs_and_a_bad_since_are_refused_in_the_servers_words(tmp_path):
    (tmp_path / "a").mkdir()
    append(tmp_path / "a" / "log.jsonl", *steps(0, 2))
    (tmp_path / "secret").mkdir()  # a directory that is no run: not served
    (tmp_path / "secret" / "notes.jsonl").write_text("{}\n")
    client = client_of(tmp_path)
    for name in ("nope", "secret"):
        response = client.get(f"/v1/runs/{name}/log")
        assert response.status_code == 404
        error = response.json()["error"]
        assert error["message"] == f"there is no run '{name}' in {tmp_path}: the runs are 'a'"
        assert (error["param"], error["code"]) == ("name", "run_not_found")
    for name in ("%2E%2E", "a%5C..", "%2E"):  # names that would leave the directory
        response = client.get(f"/v1/runs/{name}/probes")
        assert response.status_code == 400, name
        assert "is not a run's name" in response.json()["error"]["message"]
    assert client.get("/v1/runs/..%2F..%2Fetc/log").status_code == 404  # a slash is no name: no such route
    for since in ("-1", "x", "1.5"):
        response = client.get(f"/v1/runs/a/log?since={since}")
        assert response.status_code == 400
        assert response.json()["error"]["message"] == f"since must be a whole number of lines, got '{since}'"
        assert response.json()["error"]["param"] == "since"


def test_a_directory_of_runs_lists_them_anew_at_each_request(tmp_path):
    for name, last in (("small", 7), ("large", 3)):
        (tmp_path / name).mkdir()
        append(tmp_path / name / "log.jsonl", *steps(0, last + 1))
    append(tmp_path / "small" / "probes.jsonl", {"iter": 0}, {"iter": 5})
    (tmp_path / "empty").mkdir()  # no run (yet)
    (tmp_path / "notes.txt").write_text("not a run")
    now = time.time()
    os.utime(tmp_path / "small" / "log.jsonl", (now - 100, now - 100))
    os.utime(tmp_path / "small" / "probes.jsonl", (now - 50, now - 50))
    os.utime(tmp_path / "large" / "log.jsonl", (now - 10, now - 10))
    client = client_of(tmp_path)
    assert strict(client.get("/v1/runs")) == {
        "runs": [{"name": "large", "iter": 3, "evaluations": 0}, {"name": "small", "iter": 7, "evaluations": 2}]
    }  # most recently written first
    append(tmp_path / "empty" / "probes.jsonl", {"iter": 0})  # a run started after the server
    assert strict(client.get("/v1/runs"))["runs"][0] == {"name": "empty", "iter": None, "evaluations": 1}
    assert strict(client.get("/v1/runs/empty/probes")) == {"records": [{"iter": 0}], "next": 1, "reset": False}
    assert strict(client.get("/v1/runs/small/log?since=6"))["records"] == steps(6, 8)


def test_a_server_of_runs_alone_serves_no_model_and_asks_for_its_key(tmp_path):
    client = client_of(tmp_path, limits=Limits(api_key="k"))
    assert strict(client.get("/health")) == {"status": "ok"}
    assert client.get("/").status_code == 200  # the page, which opens on its Training view
    for path in ("/v1/models", "/v1/runs", f"/v1/runs/{tmp_path.name}/log"):
        assert client.get(path).status_code == 401
    key = {"Authorization": "Bearer k"}
    assert strict(client.get("/v1/models", headers=key)) == {"object": "list", "data": []}
    assert strict(client.get("/v1/runs", headers=key)) == {
        "runs": [{"name": tmp_path.name, "iter": None, "evaluations": 0}]
    }
    response = client.post("/v1/completions", json={"prompt": "Hi"}, headers=key)
    assert response.status_code == 404 and "error" in response.json()
    with pytest.raises(ValueError, match="runs '.*nowhere' is not a directory"):
        create_app(None, None, runs=tmp_path / "nowhere")


def test_a_server_of_a_model_and_runs_serves_both_and_one_without_runs_lists_none(models, tmp_path):
    append(tmp_path / "log.jsonl", *steps(0, 2))
    for runs, listed in ((tmp_path, [{"name": tmp_path.name, "iter": 1, "evaluations": 0}]), (None, [])):
        with TestClient(create_app(lambda: (models[1], ENC), "tiny", runs=runs)) as client:
            deadline = time.monotonic() + HANG  # a bound for a hang: the model loads in a thread
            while client.get("/health").status_code != 200:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert strict(client.get("/v1/models"))["data"][0]["id"] == "tiny"
            assert strict(client.get("/v1/runs")) == {"runs": listed}
            if runs is None:
                response = client.get(f"/v1/runs/{tmp_path.name}/log")
                assert response.status_code == 404
                assert response.json()["error"]["message"] == (
                    f"there is no run '{tmp_path.name}': this server follows no training runs"
                )


def test_gpt2_serve_runs_serves_them_with_no_model_and_refuses_in_one_line(tmp_path, capsys, forks):
    assert main(["serve", "--runs", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err == (
        f"gpt2: error: --runs '{tmp_path / 'nowhere'}' is not a directory: give a training run's directory "
        "(gpt2 train's out) or a directory of them\n"
    )
    assert main(["serve", "--runs", str(tmp_path), "--transcoders", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        "gpt2: error: --transcoders serves with a model: give --model too (--runs without --model serves none)\n"
    )
    (tmp_path / "run").mkdir()
    append(tmp_path / "run" / "log.jsonl", *steps(0, 3))
    process, url = gpt2_serve(forks, "--runs", str(tmp_path))
    try:
        assert strict(httpx.get(url + "/v1/runs", timeout=HANG)) == {
            "runs": [{"name": "run", "iter": 2, "evaluations": 0}]
        }
        assert strict(httpx.get(url + "/v1/runs/run/log", timeout=HANG))["records"] == steps(0, 3)
        assert strict(httpx.get(url + "/v1/models", timeout=HANG))["data"] == []
    finally:
        process.kill()
    err = process.communicate()[1]
    assert f"gpt2: serving the training runs in {tmp_path} on {url}/v1/runs; the playground's Training view" in err
