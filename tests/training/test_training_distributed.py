"""Training on several processes: 2 CPU processes (gloo, started by torchrun as users start
them) against 1, with DDP and FSDP2; resumption, Ctrl-C, a process that dies, bad launches."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from helpers import Watched, corpus_hellaswag, heed_ctrl_c, replies_are_even_ids, write_hellaswag
from training_helpers import FORKED_ENV, SETTINGS, TOLERANCE, curve, flags, free_port

from gpt2 import DistributedError, InvalidArgumentError
from gpt2.cli import main
from gpt2.data.files import open_data
from gpt2.model.model import GPT2
from gpt2.settings import TrainSettings
from gpt2.training.checkpoint import load_checkpoint
from gpt2.training.distributed import start
from gpt2.training.loggers import read_log
from gpt2.training.plan import TaskEvaluation
from gpt2.training.train import train


@pytest.fixture(scope="module")
def torchrun_command(forks):
    """`torchrun --standalone --nproc_per_node N gpt2 train ARGS`, the user's command, as a list:
    torchrun (its `main`, which the `torchrun` script runs) and its processes are forked
    (tests/forks.py), these as `--no-python` lets torchrun start any program. Signals reach them
    as they reach a process of their own: the client passes them on."""

    def command(*args: str, nproc: int = 2) -> list[str]:
        return [
            str(forks.python),
            "-c",
            "from torch.distributed.run import main; main()",
            "--standalone",
            f"--nproc_per_node={nproc}",
            "--no-python",
            str(forks.command),
            "train",
            *args,
        ]

    return command


@pytest.fixture(scope="module")
def torchrun(torchrun_command):
    """The command run to its end, without progress bars: run(*args, nproc=2, check=True)."""

    def run(*args: str, nproc: int = 2, check: bool = True, **popen) -> subprocess.CompletedProcess:
        result = subprocess.run(
            torchrun_command("--no-progress", *args, nproc=nproc),
            env=FORKED_ENV,
            capture_output=True,
            text=True,
            timeout=300,
            **popen,
        )
        if check:
            assert result.returncode == 0, result.stderr[-3000:]
        return result

    return run


def assert_same_curve(out: Path, reference: Path) -> None:
    (steps, evals), (ref_steps, ref_evals) = curve(out), curve(reference)
    assert sorted(steps) == sorted(ref_steps) == list(range(20)) and sorted(evals) == sorted(ref_evals) == [0, 10, 20]
    assert max(abs(steps[i] - ref_steps[i]) for i in steps) < TOLERANCE
    assert max(abs(evals[i] - ref_evals[i]) for i in evals) < TOLERANCE
    assert steps[19] < steps[0] - 0.3  # it learned: the curves compared are not flat


def assert_same_model(out: Path, reference: Path) -> None:
    """The best model, saved by rank 0 (gathered from the shards under FSDP), loads like any other."""
    ours, theirs = GPT2.from_pretrained(out, device="cpu"), GPT2.from_pretrained(reference, device="cpu")
    assert ours.tokenizer.decode(ours.tokenizer.encode("To be")) == "To be"
    for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
        assert torch.allclose(a, b, atol=TOLERANCE), name


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_processes_follow_the_loss_curve_of_one(mode, char_data, one_process, tmp_path, torchrun):
    fsdp = ["--fsdp"] if mode == "fsdp" else []
    result = torchrun(
        "--data",
        str(char_data),
        "--out",
        str(tmp_path / "out"),
        *flags(max_iters=20, **SETTINGS),
        *fsdp,
        "--sample-prompt",
        "The",
    )
    assert_same_curve(tmp_path / "out", one_process)
    assert_same_model(tmp_path / "out", one_process)
    # rank 0 alone prints: one line an evaluation, one sample, one summary
    output = result.stdout + result.stderr
    assert output.count("iter 10: train loss") == 1 and output.count("sample: The") == 3
    assert output.count("gpt2: 20 iterations; best validation loss") == 1
    # the samples (under FSDP every process takes part in each forward pass) are one process's
    samples = [r["sample"] for r in read_log(tmp_path / "out" / "log.jsonl") if "val_loss" in r]
    assert samples == [r["sample"] for r in read_log(one_process / "log.jsonl") if "val_loss" in r]
    assert len(samples) == 3 and all(samples)
    assert (tmp_path / "out" / "loss.png").read_bytes().startswith(b"\x89PNG")


def test_two_processes_on_conversations_follow_the_loss_curve_of_one(char_data, tmp_path, torchrun):
    """The mask travels with each micro-batch and evaluation batch, whichever process draws it."""
    chat = replies_are_even_ids(char_data, tmp_path / "chat", "{{ messages[0].content }}")
    train(tmp_path / "one", data=chat, max_iters=20, progress=False, **SETTINGS)
    torchrun("--data", str(chat), "--out", str(tmp_path / "two"), *flags(max_iters=20, **SETTINGS))
    assert_same_curve(tmp_path / "two", tmp_path / "one")
    assert load_checkpoint(tmp_path / "two")["chat_template"] == "{{ messages[0].content }}"


# HellaSwag at each evaluation, on a model of GPT-2's vocabulary
SCORED = dict(SETTINGS, block_size=32, eval_interval=2, warmup_iters=0, eval_task="hellaswag")


@pytest.fixture(scope="module")
def scored_one(gpt2_data, tmp_path_factory) -> tuple[Path, list[str]]:
    """The reference, 4 iterations in this process, and the flags of its task: as many of the
    corpus's examples as make an odd number of batches."""
    root = tmp_path_factory.mktemp("scored")
    path = write_hellaswag(root / "hellaswag_val.jsonl", corpus_hellaswag(24))
    settings = dict(data=gpt2_data, eval_task_data=path, **SCORED)
    data = open_data(gpt2_data)
    limit = next(
        n
        for n in range(24, 1, -1)
        if len(TaskEvaluation(TrainSettings(**settings, eval_task_limit=n), data, False).batches(32, 4 * 32)) % 2
    )
    train(root / "out", max_iters=4, eval_task_limit=limit, progress=False, **settings)
    return root / "out", flags(eval_task_data=path, eval_task_limit=limit, **SCORED)


def hellaswag_scores(out: Path) -> list[tuple[int, float, float]]:
    return [
        (r["iter"], r["hellaswag_acc"], r["hellaswag_acc_norm"]) for r in read_log(out / "log.jsonl") if "val_loss" in r
    ]


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_processes_score_hellaswag_as_one_does(mode, gpt2_data, scored_one, tmp_path, torchrun):
    """The batches of pairs are shared out and the scores summed: one process's accuracies. Their
    number is odd: under FSDP the second process scores one more, dropped, so that both run as
    many forward passes (each gathers the shards of every block with the other)."""
    reference, task = scored_one
    fsdp = ["--fsdp"] if mode == "fsdp" else []
    torchrun("--data", str(gpt2_data), "--out", str(tmp_path / "out"), "--max-iters=4", *task, *fsdp)
    scores = hellaswag_scores(tmp_path / "out")
    assert scores == hellaswag_scores(reference) and [it for it, *_ in scores] == [0, 2, 4]
    assert len({acc for _, *accs in scores for acc in accs}) > 1  # not one number at every evaluation


@pytest.fixture(scope="module")
def fsdp_ten(char_data, torchrun, tmp_path_factory) -> Path:
    """10 iterations of two processes under FSDP: the run two tests resume, each a copy of it."""
    out = tmp_path_factory.mktemp("fsdp_ten") / "out"
    torchrun("--data", str(char_data), "--out", str(out), *flags(max_iters=10, **SETTINGS), "--fsdp")
    return out


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_a_resumed_run_continues_as_one_process_does(mode, char_data, one_process, tmp_path, torchrun, request):
    fsdp = ["--fsdp"] if mode == "fsdp" else []
    out = str(tmp_path / "out")
    if fsdp:
        shutil.copytree(request.getfixturevalue("fsdp_ten"), out)
    else:
        torchrun("--data", str(char_data), "--out", out, *flags(max_iters=10, **SETTINGS))
    torchrun("--out", out, "--resume", "--max-iters=20", *fsdp)
    assert_same_curve(tmp_path / "out", one_process)


def test_muon_under_ddp_follows_one_process_and_resumes(char_data, tmp_path, torchrun):
    """Muon orthogonalises whole matrices: under DDP each process has the averaged gradient of
    each, and makes the update one process makes; AdamW's and Muon's states resume together.
    The losses agree to 1e-4; the weights within 5% of their size, not to 1e-4: Muon's
    Newton-Schulz runs in bfloat16, where gradients summed in another order (over the processes)
    round differently, and orthogonalising amplifies the difference along the gradient's small
    singular directions (after 20 steps, 0.3% to 2.4% apart: 2.4% in h.0.attn.c_proj)."""
    train(tmp_path / "one", data=char_data, max_iters=20, optimizer="muon", progress=False, **SETTINGS)
    out = str(tmp_path / "out")
    torchrun("--data", str(char_data), "--out", out, *flags(max_iters=10, optimizer="muon", **SETTINGS))
    torchrun("--out", out, "--resume", "--max-iters=20")
    assert_same_curve(tmp_path / "out", tmp_path / "one")
    # the weights at the end (the checkpoint's), not the best model's: a validation loss within
    # 1e-4 of an earlier one may be the best in one run and not in the other
    ours, one = (load_checkpoint(tmp_path / run)["model"] for run in ("out", "one"))
    assert ours.keys() == one.keys()
    for name, b in one.items():
        assert (ours[name] - b).float().norm() < 0.05 * b.float().norm(), name


def test_one_process_resumes_a_run_of_two(fsdp_ten, one_process, tmp_path):
    """The checkpoint holds whole tensors: it does not depend on how many processes wrote it."""
    shutil.copytree(fsdp_ten, tmp_path / "out")
    train(tmp_path / "out", resume=True, max_iters=20, fsdp=False, progress=False)
    assert_same_curve(tmp_path / "out", one_process)


def test_ctrl_c_stops_every_process_with_a_checkpoint(char_data, one_process, tmp_path, torchrun, torchrun_command):
    out = tmp_path / "out"
    settings = dict(SETTINGS, max_iters=20_000, lr_decay_iters=20, eval_interval=10_000)
    command = torchrun_command("--no-progress", "--data", str(char_data), "--out", str(out), *flags(**settings))
    process = subprocess.Popen(
        command, env=FORKED_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=heed_ctrl_c
    )
    deadline = time.monotonic() + 120
    while (
        len(curve(out)[0] if (out / "log.jsonl").exists() else {}) < 25
    ):  # 25 steps logged, of 20,000: the run is under way
        assert time.monotonic() < deadline and process.poll() is None, "no 25 steps logged"
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)  # what Ctrl-C sends torchrun, which passes it on to each process
    _, err = process.communicate(timeout=120)
    assert "gpt2: interrupted at iteration" in err and "checkpoint saved" in err
    stopped = max(curve(out)[0]) + 1
    assert 25 <= stopped < 20_000
    torchrun("--out", str(out), "--resume", f"--max-iters={stopped + 5}")
    steps = curve(out)[0]
    assert sorted(steps) == list(range(stopped + 5))
    ref = curve(one_process)[0]
    assert (
        max(abs(steps[i] - ref[i]) for i in range(20)) < TOLERANCE
    )  # the same run as ever, up to where the reference ends


def test_ctrl_c_in_an_evaluation_stops_every_process_at_the_same_batch(
    char_data, one_process, tmp_path, torchrun, torchrun_command
):
    """An evaluation of a million and one batches (shared unevenly: one process draws one more):
    Ctrl-C stops both processes within seconds at the same batch (were one to go on, the other
    would wait for it for ever), with the checkpoint of iteration 0, whose evaluation the resume
    does, with the usual --eval-iters: the run follows the curve of one process."""
    out = tmp_path / "out"
    settings = dict(SETTINGS, max_iters=20, eval_iters=1_000_001)
    command = torchrun_command("--data", str(char_data), "--out", str(out), *flags(**settings))
    with open(tmp_path / "stdout", "w") as stdout:
        run = Watched(command, FORKED_ENV, stdout)
        run.wait_for(r"evaluating train [1-9]")  # rank 0's bar, after a batch: both processes are in the evaluation
        # what Ctrl-C sends torchrun, which passes it on to each process (and kills what is left 30 s later)
        seconds = run.stop(signal.SIGINT, timeout=120)
    assert "gpt2: interrupted at iteration 0; checkpoint saved" in run.err
    # no process took a signal that came late as a KeyboardInterrupt, leaving the group or exiting
    assert "KeyboardInterrupt" not in run.err and not re.search(r"gpt2: interrupted$", run.err, re.M), run.err[-3000:]
    assert seconds < 20, seconds  # not the evaluation's hours, nor torchrun's kill 30 s after the signal
    torchrun("--out", str(out), "--resume", "--eval-iters=3")
    assert_same_curve(out, one_process)


# ------------------------------------------------------------------ bad launches, lost processes


def test_a_diverged_run_stops_every_process_at_once(char_data, tmp_path, torchrun):
    """lr 1e30: the loss checked is the one summed over the processes, so all stop at the same
    logged step, none waiting on the others; rank 0 says so in one line and the files stay those
    of iteration 0's evaluation."""
    out = tmp_path / "out"
    result = torchrun(
        "--data", str(char_data), "--out", str(out), *flags(max_iters=20, **{**SETTINGS, "lr": 1e30}), check=False
    )
    assert result.returncode != 0
    assert result.stderr.count("gpt2: error: iter 1: the training loss is nan: training diverged") == 1, result.stderr[
        -3000:
    ]
    assert load_checkpoint(out)["iteration"] == 0 and all(
        torch.isfinite(t).all() for t in load_checkpoint(out)["model"].values()
    )


def test_grad_accum_must_divide_among_the_processes(char_data, tmp_path, torchrun):
    result = torchrun(
        "--data", str(char_data), "--out", str(tmp_path / "out"), *flags(**dict(SETTINGS, grad_accum=3)), check=False
    )
    assert result.returncode != 0
    message = "gpt2: error: --grad-accum 3 must be a multiple of the 2 processes"
    assert result.stderr.count(message) == 1  # every process finds it; rank 0 says it
    assert "src/gpt2/" not in result.stderr  # no traceback of ours (what follows is torchrun's report of the exit)


def test_fsdp_needs_a_distributed_launch(char_data, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(
        InvalidArgumentError, match="fsdp shards the model over the processes of a distributed launch: start"
    ) as e:
        train(tmp_path / "out", data=char_data, fsdp=True, progress=False, **SETTINGS)
    assert e.value.param == "fsdp"
    assert main(["train", "--data", str(char_data), "--out", str(tmp_path / "out"), "--fsdp", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpt2: error: --fsdp shards the model") and "torchrun" in err


@pytest.mark.parametrize(
    "env, message",
    [
        (dict(RANK="one", WORLD_SIZE="2", LOCAL_RANK="0"), "environment variable RANK must be a whole number"),
        (dict(RANK="0", WORLD_SIZE="2"), "environment variable LOCAL_RANK must be a whole number"),
        (dict(RANK="2", WORLD_SIZE="2", LOCAL_RANK="0"), "RANK 2 is not below WORLD_SIZE 2"),
        (
            dict(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="no"),
            "could not reach the other processes",
        ),
    ],
)
def test_a_bad_launch_environment_is_named(env, message, monkeypatch):
    for name in ("LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(DistributedError, match=message):
        start("cpu", timeout=5)
    assert not torch.distributed.is_initialized()


def test_one_process_needs_no_group(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    procs = start("cpu", timeout=5)
    assert (procs.rank, procs.world, procs.device, procs.is_main, procs.grouped) == (
        0,
        1,
        torch.device("cpu"),
        True,
        False,
    )
    assert procs.sum(torch.tensor([2.0, 3.0])).tolist() == [2.0, 3.0]
    assert procs.any(True) and not procs.any(False)
    assert procs.gather("x") == ["x"]
    assert procs.failure(RuntimeError("gloo: connection reset")) is None  # nobody else to lose


@pytest.mark.parametrize("how", ["dies", "hangs"])
def test_a_lost_process_is_named_and_the_others_stop(how, char_data, tmp_path, forks):
    """Two processes started by hand (as a launcher other than torchrun would), forked
    (tests/forks.py), then rank 1 is killed, or stopped (SIGSTOP, sent to the forked command
    itself, not its client: it hangs): rank 0 stops within the timeout, naming rank 1."""
    settings = dict(SETTINGS, max_iters=100_000, eval_interval=100_000)
    env = {**FORKED_ENV, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    args = [
        "train",
        "--no-progress",
        "--data",
        str(char_data),
        "--out",
        str(tmp_path / "out"),
        "--timeout=3",
        *flags(**settings),
    ]
    pid_file = tmp_path / "rank1.pid"
    ranks = [
        subprocess.Popen(
            [str(forks.command), *args],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r), **pid},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r, pid in ((0, {}), (1, {"FORKED_PID_FILE": str(pid_file)}))
    ]
    try:
        log = tmp_path / "out" / "log.jsonl"
        deadline = time.monotonic() + 120
        while len(read_log(log)) < 5:  # steps logged: both processes train
            assert time.monotonic() < deadline and ranks[0].poll() is None, "no steps logged"
            time.sleep(0.05)
        if how == "dies":
            ranks[1].kill()  # its client: the fork server then kills the command
        else:
            os.kill(int(pid_file.read_text()), signal.SIGSTOP)
        lost = time.monotonic()
        _, err = ranks[0].communicate(timeout=120)
        assert (
            time.monotonic() - lost < 3 + 10 + 30
        )  # the timeout, the wait to hear from the others, a busy machine's slack (not 600 s)
    finally:
        if how == "hangs" and pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGCONT)
        for process in ranks:
            process.kill()
            process.communicate()
    assert ranks[0].returncode == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith("gpt2: error: rank 1 of 2 stopped answering (died, or hangs), so rank 0 stops too"), err
    assert "timeout (--timeout) 3 s" in last
