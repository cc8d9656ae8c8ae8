"""Training that restarts by itself under torchrun's elastic launch: two torchrun agents on this
machine, each a "node" of one process, one of them killed mid-run; the other's agent restarts its
worker, which continues the run from its checkpoint alone, without --resume, on the loss curve of
one process. And the job's id in the checkpoint: another job's run is refused, as ever."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import Watched
from training_helpers import FORKED_ENV, SETTINGS, TOLERANCE, curve, flags, free_port

from gpt2 import InvalidArgumentError
from gpt2.cli import main
from gpt2.training.checkpoint import CHECKPOINT, load_checkpoint
from gpt2.training.distributed import job_id
from gpt2.training.loggers import read_log
from gpt2.training.train import train

JOB = "elastic-test"
# The rendezvous. The survivor's new round starts once the lost node's keep-alive has lapsed: 1 s x 3
# after its last heartbeat (default 5 s x 3), by when the survivor's worker has given up on it
# (--timeout 3 below: it waits that long to hear from it). A round closes 2 s after it has MIN nodes
# (default 30 s), or at once with MAX: the first, when the second agent joins (within 2 s: they
# start together); the restart's, 2 s after the survivor joins. A hang ends after 60 s, not 600.
RDZV_CONF = "join_timeout=60,last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3"


def agent(port: int, host: bool, forks, *args: str) -> list[str]:
    """A node's torchrun agent, a process of its own (the test kills it), whose one worker is
    `gpt2 train ARGS`, forked (tests/forks.py: its pid is written to $FORKED_PID_FILE). The node that
    hosts the rendezvous's store says so (`is_host`): the other connects to it, whenever it comes.
    The nodes' addresses, the same place by two names, rank them (the rendezvous sorts the nodes by
    address, then by the agent's pid): the host's workers are ranks 0, which host the workers' store
    and write the files."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1:2",
        "--nproc-per-node=1",
        "--max-restarts=3",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id={JOB}",
        f"--rdzv-conf={RDZV_CONF},is_host={int(host)}",
        f"--local-addr={'127.0.0.1' if host else 'localhost'}",
        "--no-python",
        str(forks.command),
        "train",
        *args,
    ]


def kill_node(process: subprocess.Popen, worker_pid: Path) -> None:
    """SIGKILL a node: its agent first (which would restart its worker), then its worker."""
    process.kill()
    process.wait()
    if worker_pid.exists():
        try:
            os.kill(int(worker_pid.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def wait_for_evaluation(log: Path, after: int, process: subprocess.Popen, timeout: float = 120) -> int:
    """The iteration of the first evaluation logged past iteration `after` (rank 0 logs it)."""
    deadline = time.monotonic() + timeout
    while True:
        done = [r["iter"] for r in read_log(log) if "val_loss" in r and r["iter"] > after]
        if done:
            return done[0]
        assert time.monotonic() < deadline and process.poll() is None, "no evaluation logged"
        time.sleep(0.05)


def test_a_lost_node_is_survived_by_a_restart_that_resumes(char_data, one_process, tmp_path, forks):  # noqa: F811
    """Node A (the rendezvous's host) and node B train together, checkpointing every 2 iterations;
    B (agent and worker) is killed after an evaluation. A's worker stops, naming the lost rank, and
    A's agent restarts it in a new round of one node: with the same command (no --resume), it
    continues the run from the checkpoint (--overwrite notwithstanding) and ends it, on the curve of
    one process never stopped."""
    out, port = tmp_path / "out", free_port()
    args = [
        "--no-progress",
        "--data",
        str(char_data),
        "--out",
        str(out),
        *flags(max_iters=20, **dict(SETTINGS, eval_interval=2)),
        "--sample-prompt=The",
        "--timeout=3",  # how long the survivor waits to hear from the lost node (distributed.ANSWER_WAIT, at most)
        "--overwrite",  # as a job that starts over would say: its restart must not wipe the run it is doing
    ]
    pids = {node: tmp_path / f"{node}.pid" for node in "ab"}
    b = subprocess.Popen(
        agent(port, False, forks, *args),
        env={**FORKED_ENV, "FORKED_PID_FILE": str(pids["b"])},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    with open(tmp_path / "a.out", "w") as stdout:
        a = Watched(agent(port, True, forks, *args), {**FORKED_ENV, "FORKED_PID_FILE": str(pids["a"])}, stdout)
    try:
        wait_for_evaluation(out / "log.jsonl", 0, a.process)
        kill_node(b, pids["b"])
        a.wait_for(r"gpt2: resuming from iteration \d+")
        assert a.process.wait(120) == 0, a.err[-3000:]
    except BaseException:
        for process, node in ((a.process, "a"), (b, "b")):
            kill_node(process, pids[node])
        raise
    finally:
        a.reader.join()
    # A's first worker stopped naming B's, and its second continued the run: this job's, from a checkpoint
    assert re.search(r"gpt2: error: rank 1 of 2 stopped answering", a.err), a.err[-3000:]
    restarted = re.search(
        rf"gpt2: torchrun job '{JOB}' \(restart \d\): continuing its run in {re.escape(str(out))} from its checkpoint",
        a.err,
    )
    resumed = int(re.search(r"gpt2: resuming from iteration (\d+)", a.err)[1])
    assert restarted and 0 < resumed < 20 and resumed % 2 == 0, a.err[-3000:]
    starts = [r["iter"] for r in read_log(out / "log.jsonl") if "settings" in r]
    assert starts == [0, resumed]  # the log: the run's start, and the restart's, from the checkpoint
    # every iteration once, each loss that of one process; the evaluations the reference also did
    (steps, evals), (ref_steps, ref_evals) = curve(out), curve(one_process)
    assert sorted(steps) == list(range(20)) and sorted(evals) == list(range(0, 21, 2))
    assert max(abs(steps[i] - ref_steps[i]) for i in range(20)) < TOLERANCE
    assert max(abs(evals[i] - ref_evals[i]) for i in (0, 10, 20)) < TOLERANCE
    assert load_checkpoint(out)["job"] == JOB


# ------------------------------------------------------------------ which run a job continues

FINISHED = dict(SETTINGS, max_iters=2, warmup_iters=0)


def torchrun_worker(monkeypatch, job: str, restart: int = 0) -> None:
    """This process's environment as torchrun's worker of `job` has it, rank 0 of 1, at its `restart`."""
    env = dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    for name, value in dict(env, TORCHELASTIC_RUN_ID=job, TORCHELASTIC_RESTART_COUNT=str(restart)).items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="module")
def finished(char_data, tmp_path_factory) -> Path:
    """A run of 2 iterations, done, by torchrun's worker of job-a (this process, the only one)."""
    out = tmp_path_factory.mktemp("finished") / "out"
    with pytest.MonkeyPatch.context() as monkeypatch:
        torchrun_worker(monkeypatch, "job-a")
        train(out, data=str(char_data), progress=False, **FINISHED)
    return out


def files(out: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in out.iterdir()}


def test_a_jobs_run_records_the_job(finished):
    assert load_checkpoint(finished)["job"] == "job-a"
    assert [r.get("job") for r in read_log(finished / "log.jsonl") if "settings" in r] == ["job-a"]


@pytest.mark.parametrize(
    "worker, auto_resume, change",
    [
        ("job-b", None, None),  # another job's run
        ("job-b", True, None),
        ("job-b", None, "no checkpoint"),  # another job's run, lost before its first checkpoint
        ("job-a", None, "older"),  # a checkpoint from before jobs were recorded
        ("job-a", False, None),  # its own, with auto-resume off
    ],
)
def test_a_job_refuses_a_run_not_its_own(worker, auto_resume, change, finished, char_data, tmp_path, monkeypatch):
    """A restarted worker finds a run in OUT that is not its job's to continue: OUT holds a run, as
    ever (resume or overwrite), and nothing in it changes."""
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    if change == "older":
        state = torch.load(out / CHECKPOINT, weights_only=True)
        del state["job"]
        torch.save(state, out / CHECKPOINT)
    elif change == "no checkpoint":
        (out / CHECKPOINT).unlink()
    before = files(out)
    torchrun_worker(monkeypatch, worker, restart=1)
    with pytest.raises(InvalidArgumentError, match=r"already holds a run: pass resume=True to continue it, or"):
        train(out, auto_resume=auto_resume, progress=False, data=str(char_data), **FINISHED)
    assert files(out) == before


def test_a_restarted_job_keeps_its_run_whatever_overwrite_says(finished, char_data, tmp_path, monkeypatch, capsys):
    """The job's command had --overwrite: its restarted worker keeps the run the job made. Here the
    run is done (a node lost at its very end, at the last barrier): the worker ends at once, no group started."""
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    before = files(out)
    torchrun_worker(monkeypatch, "job-a", restart=2)
    result = train(out, overwrite=True, progress=False, data=str(char_data), **FINISHED)
    assert (result.iteration, result.interrupted, result.rank) == (2, False, 0)
    assert result.best_val_loss == load_checkpoint(finished)["best_val_loss"]
    assert files(out) == before
    assert f"gpt2: torchrun job 'job-a' (restart 2): continuing its run in {out} from its checkpoint" in (
        capsys.readouterr().err
    )
    assert not torch.distributed.is_initialized()


def test_a_job_lost_before_its_first_checkpoint_starts_its_run_over(finished, char_data, tmp_path, monkeypatch, capsys):
    """No checkpoint, but the log's start names the job: its restarted worker starts the run again,
    without --overwrite, and ends it as the first one did."""
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    (out / CHECKPOINT).unlink()
    torchrun_worker(monkeypatch, "job-a", restart=1)
    train(out, progress=False, data=str(char_data), **FINISHED)
    assert "continuing its run in " + f"{out} from the start: it saved no checkpoint" in capsys.readouterr().err
    assert [r["iter"] for r in read_log(out / "log.jsonl") if "settings" in r] == [0]  # one start: the log anew
    assert curve(out) == curve(finished) and load_checkpoint(out)["job"] == "job-a"


@pytest.mark.parametrize(
    "env, job",
    [
        ({}, None),
        (dict(TORCHELASTIC_RUN_ID="j1"), None),  # not launched: no RANK, WORLD_SIZE
        (dict(RANK="0", WORLD_SIZE="2", TORCHELASTIC_RUN_ID="none"), None),  # torchrun's default id: no job's
        (dict(RANK="0", WORLD_SIZE="2"), None),  # launched another way
        (dict(RANK="1", WORLD_SIZE="2", TORCHELASTIC_RUN_ID="j1"), "j1"),
    ],
)
def test_the_job_is_torchruns_rdzv_id_where_one_was_given(env, job, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert job_id() == job


def test_auto_resume_outside_a_torchrun_job_is_refused(char_data, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(InvalidArgumentError, match="auto_resume continues a run whose torchrun job restarted") as e:
        train(tmp_path / "out", auto_resume=True, data=char_data, progress=False, **SETTINGS)
    assert e.value.param == "auto_resume"
    args = ["train", "--data", str(char_data), "--out", str(tmp_path / "out"), "--auto-resume", "--device", "cpu"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpt2: error: --auto-resume continues a run whose torchrun job")
    assert "or continue a run with --resume" in err and not (tmp_path / "out").exists()
