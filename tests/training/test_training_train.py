"""Training: nanoGPT's recipe checked against transformers, resumption, files, devices, bad input."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import (
    REPO,
    Watched,
    corpus_hellaswag,
    heed_ctrl_c,
    make_hf_model,
    replies_are_even_ids,
    write_conversations,
    write_hellaswag,
)
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
from training_helpers import CHAT_TEMPLATE, nanogpt_lr

import gpt2.training.train
from gpt2 import (
    CheckpointError,
    ContextLengthError,
    DataError,
    GPT2Error,
    InvalidArgumentError,
    NonFiniteError,
    Tokenizer,
    UnwritablePathError,
)
from gpt2.checkpoints.config import GPT2Config
from gpt2.data.batches import get_batch
from gpt2.data.files import open_data
from gpt2.data.text import prepare
from gpt2.evaluation.evaluate import hellaswag
from gpt2.evaluation.tasks import read_hellaswag
from gpt2.model.model import GPT2
from gpt2.settings import TrainSettings
from gpt2.training.curves import plot_losses
from gpt2.training.loggers import read_log
from gpt2.training.optim import WarmupWarning, make_optimizers
from gpt2.training.plan import ChatTemplateReplacedWarning, TaskEvaluation
from gpt2.training.train import EVAL_STREAM, Trainer, train

# Runs of a few iterations are shorter than TINY's warm-up on purpose: its warning is tested once, below.
pytestmark = pytest.mark.filterwarnings("ignore::gpt2.training.optim.WarmupWarning")

# A model small enough to train for dozens of iterations in a second or two.
TINY = dict(
    n_layer=2,
    n_head=2,
    n_embd=32,
    block_size=16,
    batch_size=4,
    grad_accum=2,
    lr=3e-3,
    min_lr=3e-4,
    warmup_iters=5,
    eval_interval=10,
    eval_iters=2,
    log_interval=1,
    device="cpu",
    probe_repeat=0,  # the probes are test_training_probes.py's: here they would cost a third of every run
)


def losses(out: Path) -> dict[int, float]:
    return {r["iter"]: r["loss"] for r in read_log(out / "log.jsonl") if "loss" in r}


# ------------------------------------------------------------------ the recipe


def initial_loss(n_vocab: int, n_embd: int, repeats: float, std: float = 0.02) -> float:
    """The cross-entropy of an untrained GPT-2 (weights ~ N(0, std)), worked out by hand.

    Its logits are not all equal: the unembedding is tied to wte, so the input token t's own row
    scores ln_f(x) . wte[t], where x = wte[t] + wpe[p] (the blocks add little) and ln_f scales x
    by 1 / (std sqrt 2): about b = n_embd std / sqrt 2 (0.45 nats for n_embd 32), every other
    token about 0. An untrained model predicts "the same token again", and its loss
    ln(e^b + V - 1) - repeats * b depends on how often the text repeats a token: prose rarely
    (ln V within 0.01), code often (its indentation: 22% of characters, 0.1 below ln V).
    """
    b = n_embd * std / math.sqrt(2)
    return math.log(math.exp(b) + n_vocab - 1) - repeats * b


def test_initial_loss_is_about_ln_of_the_vocabulary(char_data, tmp_path):
    """ln V, less the tied embeddings' pull towards repeating the input, whatever the corpus."""
    result = train(tmp_path / "out", data=char_data, max_iters=1, progress=False, seed=1337, **TINY)
    first = next(r for r in read_log(tmp_path / "out" / "log.jsonl") if "val_loss" in r)
    vocab = json.loads((char_data / "meta.json").read_text())["vocab_size"]
    assert first["iter"] == 0
    for split in ("train", "val"):
        ids = np.fromfile(char_data / f"{split}.bin", dtype=np.uint16)
        batches = [
            get_batch(ids, 16, 4, seed=1337, iteration=0, micro_step=EVAL_STREAM + k) for k in range(TINY["eval_iters"])
        ]
        repeats = float(np.mean([(x == y).float().mean() for x, y in batches]))  # targets equal to their input
        assert abs(first[f"{split}_loss"] - initial_loss(vocab, TINY["n_embd"], repeats)) < 0.1
    assert result.iteration == 1


def test_a_tiny_model_overfits_one_batch(tmp_path):
    # a train split of exactly block_size + 1 ids: every window is the same one
    data = tmp_path / "data"
    text = "the quick brown fox jumps over a lazy dog"
    (tmp_path / "a.txt").write_text(text[:17] + text, encoding="utf-8")
    prepare([tmp_path / "a.txt"], data, "char", val_fraction=1 - 17 / 58, progress=False)
    assert (data / "train.bin").stat().st_size == 17 * 2
    settings = {**TINY, "lr": 1e-2, "min_lr": 1e-2, "warmup_iters": 0, "eval_interval": 1000, "grad_accum": 1}
    train(tmp_path / "out", data=data, max_iters=150, progress=False, **settings)
    assert losses(tmp_path / "out")[149] < 0.05


def test_one_step_equals_transformers(gpt2_data, tmp_path):
    """The same weights and batch: the loss, every gradient, and the weights after one AdamW step."""
    hf = make_hf_model(seed=3, vocab_size=50257, n_positions=16, n_embd=32, n_layer=2, n_head=2)  # eval: no dropout
    hf.save_pretrained(tmp_path / "init")
    settings = dict(TINY, grad_accum=1, warmup_iters=0, weight_decay=0.1, grad_clip=1.0, seed=7, eval_interval=1000)
    for name in ("n_layer", "n_head", "n_embd"):
        settings.pop(name)
    train(tmp_path / "out", data=gpt2_data, init=tmp_path / "init", max_iters=1, progress=False, **settings)

    x, y = get_batch(np.fromfile(gpt2_data / "train.bin", dtype=np.uint16), 16, 4, seed=7, iteration=0, micro_step=0)
    logits = hf(x).logits
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
    assert abs(losses(tmp_path / "out")[0] - float(loss.detach())) < 1e-5
    # the evaluation at iteration 0 (gpt2 eval's computation), on its fixed batches
    val = np.fromfile(gpt2_data / "val.bin", dtype=np.uint16)
    with torch.no_grad():
        batches = [get_batch(val, 16, 4, seed=7, iteration=0, micro_step=EVAL_STREAM + k) for k in range(2)]
        expected = np.mean(
            [float(F.cross_entropy(hf(vx).logits.flatten(0, 1).double(), vy.flatten())) for vx, vy in batches]
        )
    first_eval = next(r for r in read_log(tmp_path / "out" / "log.jsonl") if "val_loss" in r)
    assert first_eval["iter"] == 0 and abs(first_eval["val_loss"] - expected) < 1e-5
    loss.backward()
    ours = GPT2.from_pretrained(tmp_path / "init", device="cpu", dropout=0.0).train()
    _, our_loss = ours(x, y)
    our_loss.backward()
    hf_params = dict(hf.named_parameters())
    for name, p in ours.named_parameters():
        assert (p.grad - hf_params[name].grad).abs().max() < 1e-5, name
    # nanoGPT's optimizer by hand: AdamW, weight decay on 2-D parameters only, clipped gradients
    torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
    params = [p for n, p in hf.named_parameters()]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    torch.optim.AdamW(groups, lr=3e-3, betas=(0.9, 0.95)).step()  # iteration 0's rate: no warm-up
    state = torch.load(tmp_path / "out" / "checkpoint.pt", weights_only=True)["model"]  # the weights after the step
    for name, p in hf.named_parameters():
        assert (state[name] - p.detach()).abs().max() < 1e-5, name


# ------------------------------------------------------------------ Muon


def muon_update(grad: torch.Tensor, momentum: float = 0.95) -> torch.Tensor:
    """Muon's first update of a matrix, written out from Keller Jordan's muon.py and Moonshot's
    paper as the independent reference: Nesterov momentum on an average of the gradients (after one
    step the buffer is (1 - momentum) grad), five quintic Newton-Schulz iterations in bfloat16 on the
    wide way round (each as addmm: bfloat16 rounds every product, so only the same order of
    operations gives the same numbers), and Moonshot's scale 0.2 sqrt(max(A, B))."""
    buffer = (1 - momentum) * grad
    x = grad.lerp(buffer, momentum).bfloat16()
    wide = x.size(0) <= x.size(1)
    x = x if wide else x.T
    x = x / x.norm().clamp(min=1e-7)
    a, b, c = 3.4445, -4.7750, 2.0315
    for _ in range(5):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)  # a x + (b gram + c gram^2) x
    return (x if wide else x.T).float() * 0.2 * math.sqrt(max(grad.shape))


def test_a_muon_run_logs_muon_lr_beside_adamws_lr(char_data, tmp_path):
    """Each step's and each evaluation's record: lr, AdamW's schedule (the embeddings, biases and
    LayerNorms), and muon_lr, Muon's (the blocks' matrices): nanoGPT's curve topped at muon_lr,
    decaying to min_lr x muon_lr / lr."""
    settings = dict(TINY, grad_accum=1, warmup_iters=1, eval_interval=2, eval_iters=1)
    train(tmp_path / "out", data=char_data, max_iters=4, progress=False, optimizer="muon", muon_lr=6e-3, **settings)
    records = [r for r in read_log(tmp_path / "out" / "log.jsonl") if "lr" in r]
    assert [r["iter"] for r in records if "loss" in r] == [0, 1, 2, 3] and [
        r["iter"] for r in records if "val_loss" in r
    ] == [0, 2, 4]
    for r in records:
        assert r["lr"] == pytest.approx(nanogpt_lr(r["iter"], 3e-3, 1, 4, 3e-4), rel=1e-12)
        assert r["muon_lr"] == pytest.approx(nanogpt_lr(r["iter"], 6e-3, 1, 4, 3e-4 * 6e-3 / 3e-3), rel=1e-12)


def test_one_muon_step_equals_muon_written_out(gpt2_data, tmp_path):
    """The weights after one step: Muon's update (written out above) for the blocks' matrices,
    with decoupled weight decay at Muon's lr, and AdamW's for the rest."""
    hf = make_hf_model(seed=3, vocab_size=50257, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    hf.save_pretrained(tmp_path / "init")
    settings = dict(TINY, grad_accum=1, warmup_iters=0, weight_decay=0.1, grad_clip=1.0, seed=7, eval_interval=1000)
    for name in ("n_layer", "n_head", "n_embd"):
        settings.pop(name)
    train(
        tmp_path / "out",
        data=gpt2_data,
        init=tmp_path / "init",
        max_iters=1,
        optimizer="muon",
        progress=False,
        **settings,
    )
    x, y = get_batch(np.fromfile(gpt2_data / "train.bin", dtype=np.uint16), 16, 4, seed=7, iteration=0, micro_step=0)
    model = GPT2.from_pretrained(tmp_path / "init", device="cpu", dropout=0.0).train()
    model(x, y)[1].backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    lr, muon_lr = 3e-3, 0.01  # TINY's, and Muon's by default
    matrices = {n for n, p in model.named_parameters() if n.startswith("transformer.h.") and p.dim() == 2}
    expected = {
        n: (p * (1 - muon_lr * 0.1) - muon_lr * muon_update(p.grad)).detach()
        for n, p in model.named_parameters()
        if n in matrices
    }
    rest = [p for n, p in model.named_parameters() if n not in matrices]
    torch.optim.AdamW(
        [
            {"params": [p for p in rest if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=lr,
        betas=(0.9, 0.95),
    ).step()
    expected |= {n: p.detach() for n, p in model.named_parameters() if n not in matrices}
    state = torch.load(tmp_path / "out" / "checkpoint.pt", weights_only=True)
    for name, p in expected.items():
        assert (state["model"][name] - p).abs().max() < 2e-6, name
    moved = [
        float((state["model"][n] - p.detach()).abs().max())
        for n, p in GPT2.from_pretrained(tmp_path / "init", device="cpu").named_parameters()
    ]
    assert min(moved) > 1e-4  # every weight moved: the tolerance above is far below a step
    assert {"momentum_buffer"} == set(state["optimizer"]["state"]["transformer.h.0.mlp.c_fc.weight"])
    assert {"step", "exp_avg", "exp_avg_sq"} == set(state["optimizer"]["state"]["transformer.wte.weight"])


def test_a_muon_run_resumes_bit_for_bit_and_keeps_its_optimizer(char_data, tmp_path, capsys):
    settings = dict(RESUMABLE, optimizer="muon", muon_lr=6e-3)
    train(tmp_path / "whole", data=char_data, max_iters=12, progress=False, **settings)
    train(tmp_path / "parts", data=char_data, max_iters=7, lr_decay_iters=12, progress=False, **settings)
    with pytest.raises(InvalidArgumentError, match="optimizer is 'adamw', but the run was started with 'muon'") as e:
        train(tmp_path / "parts", resume=True, max_iters=12, optimizer="adamw", progress=False)
    assert e.value.param == "optimizer"
    train(tmp_path / "parts", resume=True, max_iters=12, progress=False)
    whole, parts = losses(tmp_path / "whole"), losses(tmp_path / "parts")
    assert sorted(parts) == list(range(12)) and parts == whole  # bit for bit, dropout on
    adamw = losses(train(tmp_path / "adamw", data=char_data, max_iters=12, progress=False, **RESUMABLE).out)
    assert adamw[0] == whole[0] and adamw[11] != whole[11]  # the same start, another optimizer
    # a Muon-trained model is a model like any other: it loads and generates
    from gpt2.cli import main

    capsys.readouterr()
    assert (
        main(
            [
                "generate",
                "--model",
                str(tmp_path / "parts"),
                "--max-new-tokens",
                "5",
                "--seed",
                "1",
                "--device",
                "cpu",
                "To",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.startswith("To")


def test_muon_is_refused_under_fsdp_and_an_unknown_optimizer_is_named(char_data, tmp_path, capsys):
    from gpt2.cli import main

    with pytest.raises(
        InvalidArgumentError, match="optimizer muon cannot run with fsdp: Muon orthogonalises each matrix whole"
    ) as e:
        train(tmp_path / "out", data=char_data, optimizer="muon", fsdp=True, progress=False, **TINY)
    assert (e.value.param, e.value.also) == ("optimizer", ("fsdp",))
    with pytest.raises(InvalidArgumentError, match="^optimizer must be one of adamw, muon, got 'sgd'$"):
        train(tmp_path / "out", data=char_data, optimizer="sgd", progress=False, **TINY)
    with pytest.raises(
        InvalidArgumentError, match="muon_lr is the learning rate of optimizer muon, but optimizer is 'adamw'"
    ):
        train(tmp_path / "out", data=char_data, muon_lr=0.02, progress=False, **TINY)
    base = ["train", "--data", str(char_data), "--out", str(tmp_path / "out"), "--device", "cpu"]
    assert main([*base, "--optimizer", "muon", "--fsdp"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpt2: error: --optimizer muon cannot run with fsdp (--fsdp)")
    assert main([*base, "--optimizer", "sgd"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert (
        err.startswith("gpt2: error: argument --optimizer: invalid choice: 'sgd'") and "adamw" in err and "muon" in err
    )
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ resuming


RESUMABLE = dict(TINY, dropout=0.1, eval_interval=4)


def test_resume_after_max_iters_equals_an_uninterrupted_run(char_data, tmp_path):
    train(tmp_path / "whole", data=char_data, max_iters=12, progress=False, **RESUMABLE)
    train(tmp_path / "parts", data=char_data, max_iters=7, lr_decay_iters=12, progress=False, **RESUMABLE)
    with pytest.raises(InvalidArgumentError, match="already did its 7 iterations: pass a larger max_iters"):
        train(tmp_path / "parts", resume=True, progress=False)
    train(tmp_path / "parts", resume=True, max_iters=12, progress=False)
    whole, parts = losses(tmp_path / "whole"), losses(tmp_path / "parts")
    assert sorted(parts) == list(range(12))
    assert parts == whole  # bit for bit, dropout on
    evals = [r for r in read_log(tmp_path / "parts" / "log.jsonl") if "val_loss" in r]
    assert [r["iter"] for r in evals] == [0, 4, 7, 8, 12]


def test_resume_after_ctrl_c_equals_an_uninterrupted_run(char_data, tmp_path, forks):
    """Ctrl-C once 5 steps are logged, in a run too long to end first (however slow the machine is
    to send it); the resume to 5 steps past the stop gives the losses of a run never stopped."""
    settings = dict(RESUMABLE, lr_decay_iters=200, eval_interval=50)
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]
    command = [
        str(forks.command),
        "train",
        "--data",
        str(char_data),
        "--out",
        str(tmp_path / "parts"),
        "--max-iters=20000",
        *flags,
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=heed_ctrl_c
    )
    log = tmp_path / "parts" / "log.jsonl"
    deadline = time.monotonic() + 120
    while len(losses(tmp_path / "parts") if log.exists() else {}) < 5:
        assert time.monotonic() < deadline and process.poll() is None, (
            process.stderr.read() if process.poll() is not None else ""
        )
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert "--resume" in err
    stopped = max(losses(tmp_path / "parts")) + 1
    assert 5 <= stopped < 20_000
    train(tmp_path / "parts", resume=True, max_iters=stopped + 5, progress=False)
    train(tmp_path / "whole", data=char_data, max_iters=stopped + 5, progress=False, **settings)
    assert sorted(losses(tmp_path / "parts")) == list(range(stopped + 5))
    assert losses(tmp_path / "parts") == losses(tmp_path / "whole")


def test_a_checkpoint_of_the_first_format_resumes(char_data, tmp_path):
    """Version 1 (before several processes) kept the optimizer's state by parameter index and
    one random state: a run saved so resumes as ever."""
    train(tmp_path / "whole", data=char_data, max_iters=12, progress=False, **RESUMABLE)
    train(tmp_path / "parts", data=char_data, max_iters=7, lr_decay_iters=12, progress=False, **RESUMABLE)
    path = tmp_path / "parts" / "checkpoint.pt"
    state = torch.load(path, weights_only=True)
    model = GPT2(GPT2Config.from_hf_dict(state["model_config"]))
    model.load_state_dict(state["model"])
    (optimizer,) = make_optimizers(model, TrainSettings(**state["settings"]), torch.device("cpu"))
    set_optimizer_state_dict(model, optimizer, state["optimizer"], options=StateDictOptions(full_state_dict=True))
    old = {k: v for k, v in state.items() if k not in ("rng", "optimizer")}
    later = ("fsdp", "timeout", "optimizer", "muon_lr")  # added with format 2, and since
    old["settings"] = {k: v for k, v in old["settings"].items() if k not in later}
    torch.save(
        {**old, "version": 1, "optimizer": optimizer.state_dict(), "rng_cpu": state["rng"][0]["cpu"], "rng_cuda": []},
        path,
    )
    assert isinstance(next(iter(torch.load(path, weights_only=True)["optimizer"]["state"])), int)
    train(tmp_path / "parts", resume=True, max_iters=12, timeout=60.0, progress=False)
    assert losses(tmp_path / "parts") == losses(tmp_path / "whole")


def test_a_run_stopped_before_its_first_step_resumes(char_data, tmp_path, monkeypatch):
    """The checkpoint of iteration 0 holds no optimizer state yet, and the resumed optimizer
    makes no step that a run never stopped would not (Adam counts its steps)."""
    train(tmp_path / "whole", data=char_data, max_iters=6, progress=False, **RESUMABLE)

    def crash(self, it):
        raise KeyboardInterrupt  # a crash after the first evaluation's checkpoint, before any step

    with monkeypatch.context() as m:
        m.setattr(Trainer, "train_step", crash)
        with pytest.raises(KeyboardInterrupt):
            train(tmp_path / "parts", data=char_data, max_iters=6, progress=False, **RESUMABLE)
    assert torch.load(tmp_path / "parts" / "checkpoint.pt", weights_only=True)["iteration"] == 0
    train(tmp_path / "parts", resume=True, progress=False)
    assert losses(tmp_path / "parts") == losses(tmp_path / "whole")


def test_files_written_while_training_goes_on_hold_the_evaluations_state(char_data, tmp_path, monkeypatch):
    """An evaluation's checkpoint is written in a thread while the next steps run: it holds the
    state of the evaluation's iteration, not a later one (iteration 4's written only once steps 4
    and 5 are done, and a crash at iteration 6: the resume from iteration 4 repeats the run never
    stopped), and it is whole when the run stops."""
    train(tmp_path / "whole", data=char_data, max_iters=8, progress=False, **RESUMABLE)
    real, crash_at, crashing = gpt2.training.train.write_checkpoint, 6, threading.Event()

    def slow(out, state):
        if state["iteration"] == 4:
            assert crashing.wait(timeout=120)  # steps 4 and 5 ran meanwhile
        real(out, state)

    def step(self, it, real_step=Trainer.train_step):
        if it == crash_at:
            crashing.set()
            raise RuntimeError("a crash")
        return real_step(self, it)

    with monkeypatch.context() as m:
        m.setattr(gpt2.training.train, "write_checkpoint", slow)
        m.setattr(Trainer, "train_step", step)
        with pytest.raises(RuntimeError, match="a crash"):
            train(tmp_path / "parts", data=char_data, max_iters=8, progress=False, **RESUMABLE)
    assert checkpoint(tmp_path / "parts")["iteration"] == 4
    train(tmp_path / "parts", resume=True, progress=False)
    assert losses(tmp_path / "parts") == losses(tmp_path / "whole")


def test_a_checkpoint_that_cannot_be_written_stops_the_run_with_its_error(char_data, tmp_path, monkeypatch):
    def full(out, state):
        raise CheckpointError(
            f"could not write {out / 'checkpoint.pt'}: No space left on device; the previous checkpoint is intact"
        )

    monkeypatch.setattr(gpt2.training.train, "write_checkpoint", full)
    with pytest.raises(CheckpointError, match="No space left on device; the previous checkpoint is intact"):
        train(tmp_path / "out", data=char_data, max_iters=8, progress=False, **TINY)
    assert max(losses(tmp_path / "out")) < 8  # raised in the run's thread, at the next evaluation or the end


def test_a_resumed_run_keeps_its_model(char_data, tmp_path):
    train(tmp_path / "out", data=char_data, max_iters=2, progress=False, **TINY)
    with pytest.raises(InvalidArgumentError, match=r"n_embd is 64, but the run was started with 32"):
        train(tmp_path / "out", resume=True, max_iters=4, n_embd=64, progress=False)
    with pytest.raises(InvalidArgumentError, match=r"lr is 1.0, but") as e:
        train(tmp_path / "out", resume=True, max_iters=4, lr=1.0, progress=False)
    assert e.value.param == "lr"
    with pytest.raises(InvalidArgumentError, match=re.escape("unknown training setting(s): learning_rate")):
        train(
            tmp_path / "out", resume=True, learning_rate=1.0, progress=False
        )  # checked once, in train, as resumed_settings takes them


# ------------------------------------------------------------------ stopping

STOPPABLE = dict(RESUMABLE, grad_accum=4)  # dropout on: a resume must redraw the masks of the iteration it repeats
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}  # tiny models: threads only contend


def flags(**settings) -> list[str]:
    return [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]


@pytest.fixture
def one_thread():
    """Tiny models in this process on one thread, as the commands below run (OMP_NUM_THREADS=1):
    on a busy machine, two threads of microsecond-sized work wait on each other for milliseconds."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def signal_during(monkeypatch, signum: int, when, times: int = 1) -> list[tuple[int, int]]:
    """Send `signum` to this process (`times` in a row) while the batch `when(draws)` picks is
    drawn: the handler runs, as a user's Ctrl-C would, in the middle of an iteration or an
    evaluation. Returns the (iteration, micro_step) of every batch drawn."""
    draws, real = [], gpt2.training.train.get_batch

    def get_batch(*args, iteration, micro_step, **kwargs):
        draws.append((iteration, micro_step))
        if when(draws) and not getattr(get_batch, "sent", False):
            get_batch.sent = True
            for _ in range(times):
                os.kill(os.getpid(), signum)
        return real(*args, iteration=iteration, micro_step=micro_step, **kwargs)

    monkeypatch.setattr(gpt2.training.train, "get_batch", get_batch)
    return draws


def checkpoint(out: Path) -> dict:
    return torch.load(out / "checkpoint.pt", weights_only=True)


def test_a_stop_between_micro_batches_abandons_the_iteration(char_data, tmp_path, monkeypatch, capsys, one_thread):
    """Ctrl-C in micro-batch 1 of iteration 6's 4: no micro-batch 2, no step; the checkpoint is
    iteration 6's start (its random state too), and the resume gives the same losses, bit for bit."""
    train(tmp_path / "whole", data=char_data, max_iters=10, progress=False, **STOPPABLE)
    with monkeypatch.context() as m:
        draws = signal_during(m, signal.SIGINT, lambda draws: draws[-1] == (6, 1))
        result = train(tmp_path / "parts", data=char_data, max_iters=10, progress=False, **STOPPABLE)
    assert result.interrupted and result.iteration == 6
    assert draws[-1] == (6, 1)  # stopped before micro-batch 2
    assert "gpt2: stopping at the next micro-batch or evaluation batch" in capsys.readouterr().err
    state = checkpoint(tmp_path / "parts")
    assert (state["iteration"], state["evaluated"]) == (6, 4)
    assert sorted(losses(tmp_path / "parts")) == list(range(6))
    train(tmp_path / "parts", resume=True, progress=False)
    assert losses(tmp_path / "parts") == losses(tmp_path / "whole")


@pytest.mark.parametrize("max_iters", [12, 8], ids=["middle", "last"])
def test_a_stop_in_an_evaluation_abandons_it_and_the_resume_redoes_it(
    max_iters, char_data, tmp_path, monkeypatch, capsys, one_thread
):
    """SIGTERM in the first batch of the evaluation at iteration 8 (the run's last, or not): the
    checkpoint is iteration 8's, the evaluation is not logged, and the resume does it."""
    train(tmp_path / "whole", data=char_data, max_iters=max_iters, progress=False, **STOPPABLE)
    with monkeypatch.context() as m:
        draws = signal_during(m, signal.SIGTERM, lambda draws: draws[-1] == (0, EVAL_STREAM) and (7, 3) in draws)
        result = train(tmp_path / "parts", data=char_data, max_iters=max_iters, progress=False, **STOPPABLE)
    assert result.interrupted and result.iteration == 8
    assert draws[-1] == (0, EVAL_STREAM)  # not its second batch (eval_iters 2), nor the validation split
    state = checkpoint(tmp_path / "parts")
    assert (state["iteration"], state["evaluated"]) == (8, 4)
    assert [r["iter"] for r in read_log(tmp_path / "parts" / "log.jsonl") if "val_loss" in r] == [0, 4]
    capsys.readouterr()
    train(tmp_path / "parts", resume=True, progress=False)
    assert f"gpt2: resuming from iteration 8 (best val loss {state['best_val_loss']:.4f})\n" in capsys.readouterr().err
    assert losses(tmp_path / "parts") == losses(tmp_path / "whole")
    evals = {
        run: [
            {k: r[k] for k in ("iter", "train_loss", "val_loss", "best")}
            for r in read_log(tmp_path / run / "log.jsonl")
            if "val_loss" in r
        ]
        for run in ("parts", "whole")
    }
    assert evals["parts"] == evals["whole"] and evals["parts"][-1]["iter"] == max_iters


def test_a_second_signal_stops_at_once(char_data, tmp_path, monkeypatch, capsys):
    """SIGTERM twice (as SIGINT twice): no waiting for the micro-batch, no new checkpoint; the
    command says so in one line and exits 130."""
    from gpt2.cli import main

    out = tmp_path / "out"
    with monkeypatch.context() as m:
        draws = signal_during(m, signal.SIGTERM, lambda draws: draws[-1] == (6, 1), times=2)
        command = [
            "train",
            "--data",
            str(char_data),
            "--out",
            str(out),
            "--no-progress",
            "--max-iters=10",
            *flags(**STOPPABLE),
        ]
        assert main(command) == 130
    assert draws[-1] == (6, 1)
    assert checkpoint(out)["iteration"] == 4  # the last evaluation's
    err = capsys.readouterr().err
    assert err.endswith("once more to stop at once)\ngpt2: interrupted\n") and "Traceback" not in err


def test_the_progress_bar_shows_micro_batches_and_evaluations(char_data, tmp_path, monkeypatch, capsys):
    """Drawn in place (carriage returns, no new line a micro-batch): "micro-batch 3/4" while a step
    accumulates, "evaluating val 1/2" in an evaluation, then "training" again."""
    import functools

    import tqdm.auto

    monkeypatch.setattr(tqdm.auto, "tqdm", functools.partial(tqdm.auto.tqdm, mininterval=0))  # every frame drawn
    settings = {**TINY, "grad_accum": 4, "warmup_iters": 0, "log_interval": 2}
    train(tmp_path / "out", data=char_data, max_iters=3, progress=True, **settings)
    captured = capsys.readouterr()
    err = captured.err
    assert not re.search(
        r"^iter \d+: loss", captured.out, re.M
    )  # the steps' numbers are on the bar, not lines of their own
    frames = [frame.strip() for frame in err.replace("\n", "\r").split("\r") if frame.strip()]
    evaluating = [f.split(":")[0] for f in frames if f.startswith("evaluating")]
    assert evaluating[:6] == [f"evaluating {split} {k}/2" for split in ("train", "val") for k in range(3)]
    micro = [f for f in frames if "micro-batch" in f]
    assert all(f.startswith("training:") for f in micro)
    assert [f.split("micro-batch ")[1][:3] for f in micro][:4] == ["1/4", "2/4", "3/4", "4/4"]
    assert "loss=" in micro[-1] and micro[-1].endswith("micro-batch 4/4]")  # after the logged step's numbers
    assert frames[-1].startswith("training: 100%") and "micro-batch" not in frames[-1]
    assert err.count("\n") <= 4  # the evaluations' lines, the bar's last: 12 micro-batches drew no line of their own


def test_a_run_stops_within_seconds_of_a_signal_and_resumes_exactly(char_data, tmp_path, one_thread, forks):
    """The command itself, in an evaluation of a million batches (minutes): SIGINT ends it within
    seconds, with status 130 and the checkpoint of iteration 8 (whose evaluation is left to do)."""
    settings = dict(STOPPABLE, lr_decay_iters=12)
    train(tmp_path / "whole", data=char_data, max_iters=12, progress=False, **settings)
    train(tmp_path / "parts", data=char_data, max_iters=6, progress=False, **settings)
    command = [
        str(forks.command),
        "train",
        "--out",
        str(tmp_path / "parts"),
        "--resume",
        "--max-iters=12",
        "--eval-iters=1000000",
    ]
    with open(tmp_path / "stdout", "w") as stdout:
        run = Watched(command, ENV, stdout)
        run.wait_for("evaluating train")  # at iteration 8
        seconds = run.stop(signal.SIGINT)
    assert run.process.returncode == 130, run.err
    assert seconds < 10, seconds  # not the evaluation's minutes
    assert "gpt2: interrupted at iteration 8; checkpoint saved" in run.err
    assert (checkpoint(tmp_path / "parts")["iteration"], checkpoint(tmp_path / "parts")["evaluated"]) == (8, 6)
    train(tmp_path / "parts", resume=True, eval_iters=2, progress=False)
    assert losses(tmp_path / "parts") == losses(tmp_path / "whole")


def test_a_run_stops_within_seconds_of_sigterm_in_a_long_step_and_resumes_exactly(
    char_data, tmp_path, one_thread, forks
):
    """A step of 300 micro-batches (a second or more): SIGTERM in iteration 1 ends the command
    before iteration 1 is done, and the bar counted the micro-batches meanwhile. The command is
    stopped (SIGSTOP) once step 0 is logged, so that where it is when the signal comes is known,
    however slow the machine is to send it."""
    settings = dict(
        RESUMABLE,
        n_layer=1,
        n_embd=16,
        block_size=8,
        batch_size=2,
        grad_accum=300,
        warmup_iters=0,
        lr_decay_iters=2,
        eval_iters=1,
    )
    train(tmp_path / "whole", data=char_data, max_iters=2, progress=False, **settings)
    command = [
        str(forks.command),
        "train",
        "--data",
        str(char_data),
        "--out",
        str(tmp_path / "parts"),
        "--max-iters=3",
        *flags(**settings),
    ]
    pid_file = tmp_path / "pid"  # the forked command's own (tests/forks.py), for SIGSTOP, which would stop its client

    def frozen_then(signum: int) -> None:  # the signal while the command is stopped, then it runs on and takes it
        os.kill(pid, signum)
        os.kill(pid, signal.SIGCONT)

    with open(tmp_path / "stdout", "w") as stdout:
        run = Watched(command, {**ENV, "FORKED_PID_FILE": str(pid_file)}, stdout)
        deadline = time.monotonic() + 120
        while 0 not in (losses(tmp_path / "parts") if (tmp_path / "parts" / "log.jsonl").exists() else {}):
            assert time.monotonic() < deadline and run.process.poll() is None, run.err
            time.sleep(0.01)
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGSTOP)
        try:
            assert sorted(losses(tmp_path / "parts")) == [
                0
            ]  # stopped in iteration 1: its 300 micro-batches take a second
            seconds = run.stop(signal.SIGTERM, send=frozen_then)
        finally:
            with contextlib.suppress(ProcessLookupError):  # never left stopped, whatever failed
                os.kill(pid, signal.SIGCONT)
    assert run.process.returncode == 130, run.err
    assert seconds < 10, seconds
    assert "gpt2: interrupted at iteration 1; checkpoint saved" in run.err
    assert "micro-batch" in run.err and run.err.count("\n") < 10  # the bar moved in place
    assert sorted(losses(tmp_path / "parts")) == [0]
    train(tmp_path / "parts", resume=True, max_iters=2, progress=False)
    assert losses(tmp_path / "parts") == losses(tmp_path / "whole")


# ------------------------------------------------------------------ settings that do nothing useful


def test_a_warm_up_as_long_as_the_run_is_warned_about(char_data, tmp_path):
    settings = dict(TINY, warmup_iters=50, lr_decay_iters=100)
    last = nanogpt_lr(19, 3e-3, 50, 100, 3e-4)  # the last iteration's rate: 20/51 of lr
    with pytest.warns(
        WarmupWarning,
        match=rf"warmup_iters 50 is not below max_iters 20: "
        rf"the learning rate warms up for the whole run, from 5.9e-05 to {last:.2g} at its last "
        rf"iteration \(39% of lr 0.003\), and never decays; pass a smaller warmup_iters",
    ) as caught:
        train(tmp_path / "out", data=char_data, max_iters=20, progress=False, **settings)
    warning = next(w.message for w in caught if isinstance(w.message, WarmupWarning))
    assert (warning.param, warning.also) == ("warmup_iters", ("max_iters", "lr"))
    with pytest.warns(WarmupWarning, match="50 is not below max_iters 50"):  # a resume, with its settings
        train(tmp_path / "out", resume=True, max_iters=50, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", WarmupWarning)
        train(tmp_path / "out", resume=True, max_iters=52, progress=False)  # now it decays: no warning
        train(tmp_path / "fine", data=char_data, max_iters=6, progress=False, **TINY)  # warmup_iters 5 < 6


def finite_files(out: Path) -> int:
    """The iteration of OUT's checkpoint, once its weights and the model's are checked to be numbers
    (the model's read by safetensors, the checkpoint's by torch)."""
    from safetensors.torch import load_file

    state = checkpoint(out)
    assert all(torch.isfinite(t).all() for t in state["model"].values())
    assert all(torch.isfinite(t).all() for t in load_file(out / "model.safetensors").values())
    return state["iteration"]


@pytest.mark.parametrize(
    "where, changes, said",
    [
        ("a logged step", {}, "iter 1: the training loss is nan"),
        ("an evaluation", {"log_interval": 100, "eval_interval": 4}, "iter 4: the train loss of its evaluation is nan"),
        ("a stop", {"log_interval": 100}, "iter 3: the weights are not finite"),
    ],
)
def test_a_loss_that_is_not_a_number_stops_the_run_and_keeps_its_files(
    where, changes, said, char_data, tmp_path, monkeypatch
):
    """lr 1e30: the first step makes every weight NaN. Found at the next logged step, the next
    evaluation, or a Ctrl-C's checkpoint (where no logged step came between), it stops the run
    naming the iteration and the learning rate; the files stay those of iteration 0's evaluation."""
    settings = {**TINY, "lr": 1e30, "min_lr": 0.0, **changes}
    with monkeypatch.context() as m:
        if where == "a stop":
            signal_during(m, signal.SIGINT, lambda draws: draws[-1] == (3, 0))
        with pytest.raises(NonFiniteError, match=re.escape(said)) as e:
            train(tmp_path / "out", data=char_data, max_iters=8, progress=False, **settings)
    assert "the learning rate is too high (lr=1e+30, warmup_iters=5); the files in " in str(e.value)
    assert (e.value.param, e.value.also) == ("lr", ("warmup_iters", "overwrite"))
    assert finite_files(tmp_path / "out") == 0
    assert [r["iter"] for r in read_log(tmp_path / "out" / "log.jsonl") if "val_loss" in r] == [0]


def test_a_diverged_run_is_one_line_at_the_command_line_and_its_model_says_it_is_untrained(char_data, tmp_path, capsys):
    """Exit 2 and one line naming --lr; the model left, iteration 0's, warns when generate loads it."""
    from gpt2.cli import main

    out = tmp_path / "out"
    command = ["train", "--data", str(char_data), "--out", str(out), "--no-progress", "--max-iters=8", *flags(**TINY)]
    assert main([*command, "--lr=1e30"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "gpt2: error: iter 1: the training loss is nan: training diverged, most likely because the learning "
        "rate is too high (--lr 1e+30, --warmup-iters 5)"
    )
    assert err.endswith("pass --overwrite\n") and err.count("\n") == 1
    assert finite_files(out) == 0
    assert main(["generate", "--model", str(out), "ROMEO:", "--max-new-tokens", "3", "--no-stream"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "initialisation" in line]
    assert warned == [
        f"gpt2: warning: this model is its initialisation: {out} holds the random weights its training run started "
        f"from (saved at iteration 0, before any step), which write noise; train until an evaluation saves a better "
        f"one: resume its run with more iterations or more frequent evaluations, or, if its loss diverged, start "
        f"again with a lower learning rate"
    ]


def test_the_model_of_a_run_stopped_before_its_second_evaluation_says_it_is_its_initialisation(
    char_data, tmp_path, monkeypatch
):
    """Ctrl-C before the evaluation at 10: OUT's model is iteration 0's random weights, as its
    safetensors header says. Loading it warns, until the resume the warning suggests (a smaller
    eval_interval) saves a trained one; a fine-tuning run's iteration 0 (its --init's) is no noise."""
    from safetensors import safe_open

    from gpt2.checkpoints.weights import InitialisationWarning

    out, settings = tmp_path / "out", dict(TINY, lr_decay_iters=20)
    with monkeypatch.context() as m:
        signal_during(m, signal.SIGINT, lambda draws: draws[-1] == (3, 0))
        assert train(out, data=char_data, max_iters=20, progress=False, **settings).interrupted
    with safe_open(out / "model.safetensors", "pt") as f:
        assert f.metadata() == {"format": "pt", "gpt2_train_iteration": "0", "gpt2_train_from": "scratch"}
    with pytest.warns(
        InitialisationWarning, match=rf"^this model is its initialisation: {re.escape(str(out))} holds the random"
    ):
        GPT2.from_pretrained(out, device="cpu")
    train(out, resume=True, eval_interval=5, max_iters=5, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InitialisationWarning)
        GPT2.from_pretrained(out, device="cpu")  # iteration 5's, trained
        with monkeypatch.context() as m:
            signal_during(m, signal.SIGINT, lambda draws: draws[-1] == (1, 0))
            tuned = {k: v for k, v in settings.items() if k not in ("n_layer", "n_head", "n_embd")}  # the init's
            assert train(
                tmp_path / "tuned", data=char_data, init=out, max_iters=20, progress=False, **tuned
            ).interrupted
        with safe_open(tmp_path / "tuned" / "model.safetensors", "pt") as f:
            assert (f.metadata()["gpt2_train_iteration"], f.metadata()["gpt2_train_from"]) == ("0", "init")
        GPT2.from_pretrained(tmp_path / "tuned", device="cpu")


def test_without_a_bar_each_logged_step_is_a_line_as_nanogpt_prints_it(char_data, tmp_path, capsys):
    """--no-progress: "iter 3: loss 4.1234, time 5.6ms, tok/s 12,345", the log's numbers, every
    --log-interval iterations and at the last; with the bar, they are on the bar only."""
    from gpt2.cli import main

    out = tmp_path / "out"
    assert (
        main(
            [
                "train",
                "--data",
                str(char_data),
                "--out",
                str(out),
                "--no-progress",
                "--max-iters=8",
                *flags(**{**TINY, "log_interval": 3}),
            ]
        )
        == 0
    )
    lines = [line for line in capsys.readouterr().out.splitlines() if re.match(r"iter \d+: loss", line)]
    logged = [r for r in read_log(out / "log.jsonl") if "loss" in r]
    assert [r["iter"] for r in logged] == [0, 3, 6, 7] and len(lines) == len(logged)
    for line, r in zip(lines, logged, strict=True):
        mfu = "" if "mfu" not in r else f", mfu {r['mfu']:.1%}"
        assert (
            line == f"iter {r['iter']}: loss {r['loss']:.4f}, time {r['ms']:.1f}ms, tok/s {r['tokens_per_s']:,.0f}{mfu}"
        )


def test_a_resume_says_where_it_resumes_from_the_command_line(char_data, tmp_path, capsys):
    from gpt2.cli import main

    out = tmp_path / "out"
    assert (
        main(["train", "--data", str(char_data), "--out", str(out), "--no-progress", "--max-iters=8", *flags(**TINY)])
        == 0
    )
    best = checkpoint(out)["best_val_loss"]
    capsys.readouterr()
    assert main(["train", "--out", str(out), "--resume", "--max-iters=9", "--no-progress"]) == 0
    assert capsys.readouterr().err.startswith(f"gpt2: resuming from iteration 8 (best val loss {best:.4f})\n")


def test_the_plot_legend_says_what_its_points_are(char_data, tmp_path):
    out = tmp_path / "out"
    train(out, data=char_data, max_iters=10, progress=False, **{**TINY, "log_interval": 3, "eval_interval": 4})
    figure = plot_losses(out / "log.jsonl", tmp_path / "loss.png")
    assert [text.get_text() for text in figure.axes[0].get_legend().get_texts()] == [
        "train loss of a step (every 3 iterations, log_interval)",  # iterations 0, 3, 6, 9 (the last)
        "train loss at each evaluation (every 4 iterations, eval_interval)",  # 0, 4, 8 and 10 (the last)
        "val loss at each evaluation (every 4 iterations, eval_interval)",
    ]
    assert (tmp_path / "loss.png").read_bytes()[:4] == b"\x89PNG"


# ------------------------------------------------------------------ a benchmark at each evaluation


# HellaSwag at each evaluation: a GPT-2-vocabulary model, windows long enough for most examples' pairs
SCORED = dict(TINY, block_size=32, grad_accum=1, eval_interval=2, eval_iters=1, warmup_iters=0, eval_task="hellaswag")


@pytest.fixture
def hellaswag_file(tmp_path) -> Path:
    return write_hellaswag(tmp_path / "hellaswag_val.jsonl", corpus_hellaswag(24))


def test_hellaswag_at_each_evaluation_is_gpt2_evals_score_of_the_model_saved_there(
    gpt2_data, hellaswag_file, tmp_path, monkeypatch, capsys
):
    """The log's acc and acc_norm at an evaluation are `gpt2.evaluation.evaluate.hellaswag`'s (the prefix-cached
    scoring of `gpt2 eval`) for the model saved there, over the first eval_task_limit examples;
    the line printed and the progress bar show acc_norm, a resume keeps scoring, and loss.png
    draws the accuracies beside the loss."""
    import functools

    import tqdm.auto

    monkeypatch.setattr(tqdm.auto, "tqdm", functools.partial(tqdm.auto.tqdm, mininterval=0))  # every frame drawn
    out, examples = tmp_path / "out", read_hellaswag(hellaswag_file, limit=12)
    scores = []
    for max_iters in (2, 4):  # iteration 2's model is saved, then the resume saves iteration 4's
        settings = (
            dict(data=gpt2_data, eval_task_data=hellaswag_file, eval_task_limit=12, **SCORED) if max_iters == 2 else {}
        )
        train(out, resume=max_iters > 2, max_iters=max_iters, progress=True, **settings)
        record = [r for r in read_log(out / "log.jsonl") if "val_loss" in r][-1]
        assert record["iter"] == max_iters and record["best"]  # the model in OUT is this evaluation's
        expected = hellaswag(GPT2.from_pretrained(out, device="cpu"), examples)
        assert (record["hellaswag_acc"], record["hellaswag_acc_norm"]) == (expected["acc"], expected["acc_norm"])
        scores += [expected["acc"], expected["acc_norm"]]
        output = capsys.readouterr()
        frames = [f.strip() for f in output.err.replace("\n", "\r").split("\r") if f.strip()]
        assert any(f.startswith("evaluating hellaswag 1/") for f in frames)
        assert f"hellaswag={record['hellaswag_acc_norm']:.4f}" in frames[-1]  # beside the steps' numbers, to the end
        assert re.search(
            rf"iter {max_iters}: train loss [\d.]+, val loss [\d.]+, hellaswag {record['hellaswag_acc_norm']:.4f} "
            rf"\(best so far: saved\)\n",
            output.out,
        )
    assert all(0 < score < 1 for score in scores)  # scores that a wrong choice of ending would change
    evals = [r for r in read_log(out / "log.jsonl") if "val_loss" in r]
    assert [r["iter"] for r in evals] == [0, 2, 4] and all("hellaswag_acc_norm" in r for r in evals)
    assert (out / "loss.png").read_bytes()[:4] == b"\x89PNG"
    figure = plot_losses(out / "log.jsonl", tmp_path / "loss.png")
    assert len(figure.axes) == 2  # the loss, and beside it HellaSwag
    acc_norm, acc, gpt2_124m = figure.axes[1].get_lines()
    assert list(acc_norm.get_xdata()) == [0, 2, 4] and list(acc_norm.get_ydata()) == [
        r["hellaswag_acc_norm"] for r in evals
    ]
    assert list(acc.get_ydata()) == [r["hellaswag_acc"] for r in evals]
    assert set(gpt2_124m.get_ydata()) == {0.2955}  # llm.c's acc_norm of OpenAI's 124M, for scale
    assert [t.get_text() for t in figure.axes[1].get_legend().get_texts()][0] == (
        "acc_norm at each evaluation (every 2 iterations, eval_interval)"
    )


def test_a_stop_while_hellaswag_is_scored_abandons_the_evaluation(gpt2_data, hellaswag_file, tmp_path, monkeypatch):
    """Ctrl-C between two of HellaSwag's batches at iteration 2: the checkpoint is iteration 2's,
    with its evaluation to do, and the resume logs what a run never stopped logs."""
    settings = dict(data=gpt2_data, eval_task_data=hellaswag_file, eval_task_limit=8, **SCORED)
    batches = len(TaskEvaluation(TrainSettings(**settings), open_data(gpt2_data), progress=False).batches(32, 4 * 32))
    assert batches >= 2
    train(tmp_path / "whole", max_iters=3, progress=False, **settings)
    calls, real = [], gpt2.training.train.score_continuations

    def score_continuations(*args, **kwargs):  # one call a batch
        calls.append(1)
        if len(calls) == batches + 2:  # iteration 2's second batch, after iteration 0's
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(gpt2.training.train, "score_continuations", score_continuations)
    result = train(tmp_path / "parts", max_iters=3, progress=False, **settings)
    assert result.interrupted and (
        checkpoint(tmp_path / "parts")["iteration"],
        checkpoint(tmp_path / "parts")["evaluated"],
    ) == (2, 0)
    assert len(calls) == batches + 2  # no batch after the stop
    train(tmp_path / "parts", resume=True, progress=False)
    keys = ("iter", "loss", "val_loss", "hellaswag_acc", "hellaswag_acc_norm")
    logged = [
        [
            tuple(r.get(k) for k in keys) for r in read_log(out / "log.jsonl") if "settings" not in r
        ]  # (a resume logs them again)
        for out in (tmp_path / "parts", tmp_path / "whole")
    ]
    assert logged[0] == logged[1] and len(logged[0]) == 3 + 3  # 3 steps, evaluations at 0, 2, 3


# ------------------------------------------------------------------ what a run leaves


def test_a_run_leaves_a_model_a_log_and_a_plot(char_data, tmp_path):
    out = tmp_path / "out"
    result = train(out, data=char_data, max_iters=10, bias=True, sample_prompt="The ", progress=False, **TINY)
    records = read_log(out / "log.jsonl")
    steps = [r for r in records if "loss" in r]
    evals = [r for r in records if "val_loss" in r]
    assert [r["iter"] for r in steps] == list(range(10))
    assert set(steps[0]) >= {"iter", "loss", "lr", "ms", "tokens_per_s"}
    assert [r["iter"] for r in evals] == [0, 10] and set(evals[0]) >= {"iter", "train_loss", "val_loss"}
    assert evals[-1]["val_loss"] < evals[0]["val_loss"]
    assert result.best_val_loss == min(r["val_loss"] for r in evals)
    assert isinstance(evals[-1]["sample"], str) and len(evals[-1]["sample"]) == 100  # 100 characters
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the best model: transformers loads it, and ours comes with its character tokenizer
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(out)
    ours = GPT2.from_pretrained(out, device="cpu")
    idx = torch.tensor([ours.tokenizer.encode("The king")])
    with torch.no_grad():
        assert (hf(idx).logits - ours(idx)).abs().max() < 1e-4
    assert ours.tokenizer.decode(ours.tokenizer.encode("The king")) == "The king"


def test_char_model_trains_and_generates_from_the_command_line(char_data, tmp_path, capsys):
    from gpt2.cli import main

    out = tmp_path / "out"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
    assert (
        main(["train", "--data", str(char_data), "--out", str(out), "--max-iters", "20", "--no-progress", *flags]) == 0
    )
    captured = capsys.readouterr()
    assert "iter 20: train loss" in captured.out + captured.err
    assert (
        main(["generate", "--model", str(out), "ROMEO:", "--max-new-tokens", "30", "--seed", "1", "--no-stream"]) == 0
    )
    text = capsys.readouterr().out
    assert len(text.rstrip("\n")) == 30  # 30 new characters, one token each


@pytest.mark.parametrize("vocabulary", ["char", "gpt2"])
def test_transformers_loads_a_trained_model_and_generates_what_we_generate(
    vocabulary, char_data, gpt2_data, tmp_path, capsys
):
    """nanoGPT's defaults (no biases; here sinusoidal positions too for GPT-2's vocabulary): transformers
    loads OUT with its tokenizer, nothing newly initialised, and its greedy pipeline equals gpt2 generate."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    from gpt2.cli import main

    out = tmp_path / "out"
    data = char_data if vocabulary == "char" else gpt2_data
    train(
        out,
        data=data,
        max_iters=10,
        positions="learned" if vocabulary == "char" else "sinusoidal",
        progress=False,
        **TINY,
    )
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info
    generator = pipeline("text-generation", model=model, tokenizer=AutoTokenizer.from_pretrained(out))
    prompt = "The "
    theirs = generator(prompt, max_new_tokens=10, do_sample=False)[0]["generated_text"]
    capsys.readouterr()
    assert main(["generate", "--model", str(out), prompt, "--temperature", "0", "--max-new-tokens", "10"]) == 0
    assert capsys.readouterr().out == theirs + "\n"
    assert len(theirs) > len(prompt)


# ------------------------------------------------------------------ devices and compiling


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_the_training_step_compiles_without_graph_breaks(checkpointing):
    from gpt2.checkpoints.config import GPT2Config

    torch.manual_seed(0)
    model = GPT2(GPT2Config(n_vocab=50, n_ctx=16, n_embd=32, n_head=2, n_layer=2, dropout=0.1)).train()
    model.checkpoint_activations = checkpointing
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")  # fullgraph: a graph break is an error
    x = torch.randint(0, 50, (2, 16))
    _, loss = compiled(x, x, check_ids=False)
    loss.backward()
    assert model.transformer.wte.weight.grad is not None and torch.isfinite(loss)


def test_activation_checkpointing_gives_the_same_gradients():
    from gpt2.checkpoints.config import GPT2Config

    torch.manual_seed(0)
    model = GPT2(GPT2Config(n_vocab=50, n_ctx=16, n_embd=32, n_head=2, n_layer=2, dropout=0.1)).train()
    x = torch.randint(0, 50, (2, 16))
    grads = []
    for checkpointing in (False, True):
        model.checkpoint_activations = checkpointing
        model.zero_grad()
        torch.manual_seed(1)  # the same dropout masks
        model(x, x)[1].backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads))


# ------------------------------------------------------------------ fine-tuning


def test_fine_tuning_crops_the_context_and_checks_the_vocabulary(gpt2_data, char_data, tmp_path):
    hf = make_hf_model(seed=1, vocab_size=50257, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    hf.save_pretrained(tmp_path / "init")
    settings = {k: v for k, v in TINY.items() if k not in ("n_layer", "n_head", "n_embd")}
    result = train(tmp_path / "out", data=gpt2_data, init=tmp_path / "init", max_iters=3, progress=False, **settings)
    tuned = GPT2.from_pretrained(tmp_path / "out", device="cpu")
    assert tuned.config.n_ctx == 16 and tuned.config.n_vocab == 50257 and result.iteration == 3
    with pytest.raises(InvalidArgumentError, match="prepared with another tokenizer"):
        train(tmp_path / "char", data=char_data, init=tmp_path / "init", max_iters=3, progress=False, **settings)
    with pytest.raises(ContextLengthError, match="block_size 64 is over the context of the model"):
        train(
            tmp_path / "long",
            data=gpt2_data,
            init=tmp_path / "init",
            max_iters=3,
            progress=False,
            **{**settings, "block_size": 64},
        )
    with pytest.raises(
        InvalidArgumentError, match="the architecture comes from the model being fine-tuned; drop n_layer"
    ):
        train(tmp_path / "x", data=gpt2_data, init=tmp_path / "init", n_layer=3, max_iters=3, progress=False)


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            dict(min_lr=1.0),
            r"min_lr must be a number in \[0, 0.003\]",
        ),  # the settings' own checks: tests/test_settings.py
        (dict(n_embd=30, n_head=4), r"n_embd \(30\) must be divisible by n_head \(4\)"),
        (dict(device="cuda:7" if torch.cuda.is_available() else "cuda"), "cuda"),
        (dict(block_size=40_000), "too short|shorter"),
    ],
)
def test_bad_settings_are_named(char_data, tmp_path, changes, message):
    with pytest.raises(GPT2Error, match=message):
        train(tmp_path / "out", data=char_data, progress=False, **{**TINY, "max_iters": 2, **changes})


def test_an_unwritable_out_is_named_before_anything_is_loaded(char_data, tmp_path):
    (tmp_path / "a-file").write_text("x")
    cases = [(tmp_path / "a-file" / "out", f"{tmp_path / 'a-file'} is a file, not a directory")]
    if os.path.isdir("/proc/self"):  # Linux
        cases.append((Path("/proc/gpt2-run"), "/proc takes no new files or directories (no such file or directory)"))
    for out, reason in cases:
        for data in (char_data, tmp_path / "no-data"):  # the data is not even opened
            with pytest.raises(UnwritablePathError, match=f"^{re.escape(f'cannot write into {out}: {reason}')}$"):
                train(out, data=data, max_iters=1, progress=False, **TINY)
    # a run that cannot start leaves no directory it made
    with pytest.raises(GPT2Error, match="no-data"):
        train(tmp_path / "new" / "out", data=tmp_path / "no-data", max_iters=1, progress=False, **TINY)
    assert not (tmp_path / "new" / "out").exists()


def weights_and_activations(
    n_vocab: int, n_layer: int = 2, n_embd: int = 32, block: int = 16, batch: int = 4
) -> tuple[int, int]:
    """The bytes a run of TINY's shape (no biases, learned positions) needs, written out: 16 a weight (float32, its
    gradient, AdamW's two moments); for each token of a micro-batch, 17 values of n_embd a layer kept for the backward
    pass (LayerNorms' inputs and outputs, q k v, attention's output, the MLP's 4C twice) and 4 of n_vocab (logits,
    log-probabilities, the gradients of both), all float32."""
    C = n_embd
    weights = n_vocab * C + block * C + n_layer * (3 * C * C + C * C + 4 * C * C + 4 * C * C + 2 * C) + C
    return 16 * weights, batch * block * (n_layer * 17 * C * 4 + 4 * n_vocab * 4)


def test_a_run_that_cannot_fit_is_refused_before_anything_is_made(char_data, tmp_path, monkeypatch):
    from gpt2 import MemoryLimitError, devices

    vocab = json.loads((char_data / "meta.json").read_text())["vocab_size"]
    states, activations = weights_and_activations(vocab)
    monkeypatch.setattr(devices, "available_memory", lambda device: 100_000)  # (a run takes a 200 MB workspace too)
    message = (
        f"training needs about {(states + activations + 200e6) / 1e6:.1f} MB of memory, "
        "but the CPU has 100 kB available: "
        f"lower batch_size (or block_size): a micro-batch of 4 windows of 16 tokens keeps about "
        f"{activations / 1e3:.0f} kB of activations, {activations / 4e3:.0f} kB a window, beside "
        f"{states / 1e3:.0f} kB for the weights, their gradients and AdamW's moments"
    )
    with pytest.raises(MemoryLimitError, match=f"^{re.escape(message)}$") as e:
        train(tmp_path / "out", data=char_data, max_iters=1, progress=False, **TINY)
    assert (e.value.param, e.value.also) == ("batch_size", ("block_size",))
    assert not (tmp_path / "out").exists()  # nothing made, nothing written


def test_a_run_a_little_over_the_memory_available_is_warned_about_and_goes_on(char_data, tmp_path, monkeypatch):
    from gpt2 import devices

    vocab = json.loads((char_data / "meta.json").read_text())["vocab_size"]
    needed = sum(weights_and_activations(vocab)) + 200_000_000  # with torch's workspace
    monkeypatch.setattr(devices, "available_memory", lambda device: int(needed / 1.2))
    with pytest.warns(devices.MemoryWarning, match="training needs about .* so it may not fit: lower batch_size"):
        result = train(tmp_path / "out", data=char_data, max_iters=1, progress=False, **TINY)
    assert result.iteration == 1


def test_out_is_protected(char_data, tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(UnwritablePathError, match="file is a file, not a directory"):
        train(tmp_path / "file", data=char_data, max_iters=1, progress=False, **TINY)
    with pytest.raises(InvalidArgumentError, match="nothing to resume in"):
        train(tmp_path / "empty", resume=True, progress=False)
    train(tmp_path / "out", data=char_data, max_iters=1, progress=False, **TINY)
    with pytest.raises(
        InvalidArgumentError, match="already holds a run: pass resume=True to continue it, or overwrite=True"
    ) as e:
        train(tmp_path / "out", data=char_data, max_iters=1, progress=False, **TINY)
    assert (e.value.param, e.value.also) == ("resume", ("overwrite",))
    train(tmp_path / "out", data=char_data, max_iters=2, overwrite=True, progress=False, **TINY)
    assert sorted(losses(tmp_path / "out")) == [0, 1]


def test_data_with_ids_beyond_the_model_vocabulary(gpt2_data, tmp_path):
    hf = make_hf_model(seed=1, vocab_size=300, n_positions=32, n_embd=32, n_layer=1, n_head=2)
    hf.save_pretrained(tmp_path / "init")
    with pytest.raises(InvalidArgumentError, match="vocabulary of 50257 ids, more than the 300"):
        train(tmp_path / "out", data=gpt2_data, init=tmp_path / "init", max_iters=1, progress=False)


def test_train_command_errors_are_one_line(char_data, tmp_path, capsys):
    from gpt2.cli import main

    assert main(["train", "--data", str(char_data), "--out", str(tmp_path / "o"), "--batch-size", "0"]) == 2
    assert (
        capsys.readouterr().err == "gpt2: error: --batch-size must be a positive integer, got 0\n"
    )  # the CLI names its flag
    assert main(["train", "--out", str(tmp_path / "o")]) == 2
    assert "no data (--data): give data, the directory gpt2 prepare wrote" in capsys.readouterr().err
    assert main(["train", "--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nowhere" in err


def test_a_bad_eval_task_is_refused_before_anything_is_made(
    gpt2_data, char_data, hellaswag_file, tmp_path, monkeypatch, capsys
):
    """Each is named before the run starts (nothing is left in OUT), and in one line at the
    command line, with its flag and exit status 2."""
    from gpt2.cli import main

    monkeypatch.setenv("GPT2_CACHE", str(tmp_path / "empty-cache"))  # and HF_HUB_OFFLINE=1 (conftest): no download
    lambada = write_hellaswag(tmp_path / "lambada_test.jsonl", [{"text": "a b c"}])
    missing = tmp_path / "nowhere.jsonl"
    cases = [  # (changes, error, its message's start, the setting it names)
        (dict(eval_task="mmlu"), InvalidArgumentError, "eval_task must be one of hellaswag, got 'mmlu'", "eval_task"),
        (
            dict(eval_task_limit=0),
            InvalidArgumentError,
            "eval_task_limit must be a positive integer, got 0",
            "eval_task_limit",
        ),
        (dict(eval_task_data=missing), DataError, f"{missing} does not exist", "eval_task_data"),
        (
            dict(eval_task_data=lambada),
            DataError,
            f'{lambada}, line 1: expected {{"ctx": text, "endings": [texts], "label": index}} '
            "(HellaSwag's format), got keys ['text']",
            "eval_task_data",
        ),
        (
            dict(eval_task_data=None),
            DataError,
            f"hellaswag is not in the cache ({tmp_path / 'empty-cache' / 'hellaswag_val.jsonl'}) "
            "and HF_HUB_OFFLINE is set; without a network, download it elsewhere and pass its "
            "path as eval_task_data",
            "eval_task_data",
        ),
        (
            dict(data=char_data),
            InvalidArgumentError,
            "eval_task hellaswag needs a BPE tokenizer that writes any text (GPT-2's, as "
            f"llm.c scores it), but the data in {char_data} has a character-level one (",
            "eval_task",
        ),
        (
            dict(eval_task=None, eval_task_limit=10),
            InvalidArgumentError,
            "eval_task_limit is a setting of eval_task, which is not set: give eval_task too",
            "eval_task_limit",
        ),
    ]
    for changes, error, message, param in cases:
        settings = {
            **dict(data=gpt2_data, eval_task="hellaswag", eval_task_data=hellaswag_file, max_iters=1, **TINY),
            **changes,
        }
        settings = {k: v for k, v in settings.items() if v is not None}
        with pytest.raises(error) as e:
            train(tmp_path / "out", progress=False, **settings)
        assert str(e.value).startswith(message) and e.value.param == param, str(e.value)
        assert not (tmp_path / "out").exists()
        assert main(["train", "--out", str(tmp_path / "out"), "--no-progress", *flags(**settings)]) == 2
        err, flag = capsys.readouterr().err, "--" + param.replace("_", "-")
        assert err.count("\n") == 1 and err.endswith("\n") and "Traceback" not in err, err
        if changes.get("eval_task") == "mmlu":  # argparse's choices
            assert re.fullmatch(
                r"gpt2: error: argument --eval-task: invalid choice: 'mmlu' \(choose from '?hellaswag'?\).*\n", err
            )
        else:  # the library's message, the setting named by its flag (in its place, or after the message)
            assert flag in err and param not in err.replace(str(tmp_path), ""), err
            as_named = re.sub(r"--([a-z0-9-]+)", lambda m: m[1].replace("-", "_"), err.replace(f" ({flag})", ""))
            assert as_named.startswith(f"gpt2: error: {message}"), err
        assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ fine-tuning on conversations

MESSAGES = [
    {"role": "user", "content": "Who wrote Hamlet?"},
    {"role": "assistant", "content": "Shakespeare."},
    {"role": "user", "content": "When?"},
]


@pytest.fixture(scope="module")
def chat_char(char_data, tmp_path_factory) -> Path:
    """char_data's ids as conversations whose replies are the even ids."""
    return replies_are_even_ids(char_data, tmp_path_factory.mktemp("chat") / "char", CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def chat_gpt2(gpt2_data, tmp_path_factory) -> Path:
    """gpt2_data's ids as conversations whose replies are the even ids."""
    return replies_are_even_ids(gpt2_data, tmp_path_factory.mktemp("chat") / "gpt2", CHAT_TEMPLATE)


def plain_batch(data: Path, split: str, seed: int, micro_step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x, y of a batch without the mask, and which targets the mask marks (the even ids)."""
    x, y = get_batch(
        np.fromfile(data / f"{split}.bin", dtype=np.uint16), 16, 4, seed=seed, iteration=0, micro_step=micro_step
    )
    return x, y, y % 2 == 0


def test_on_conversations_no_gradient_reaches_the_positions_outside_the_mask(chat_char, tmp_path):
    s = TrainSettings(data=chat_char, max_iters=1, compile="off", seed=3, **{**TINY, "grad_accum": 1})
    trainer = Trainer(s, tmp_path / "out", progress=False)
    hidden = []  # the final hidden states of the step's forward pass: the logits of each position are theirs alone

    def keep(module, args, output):
        output.retain_grad()
        hidden.append(output)

    trainer.model.transformer.ln_f.register_forward_hook(keep)
    try:
        trainer.train_step(0)
    finally:
        trainer.close()
    _, _, marked = plain_batch(chat_char, "train", 3, 0)
    grad = hidden[0].grad.abs().amax(dim=-1)  # (B, T)
    assert 0 < int(marked.sum()) < marked.numel()
    assert (grad[~marked] == 0).all() and (grad[marked] > 0).all()


def test_the_loss_on_conversations_is_the_cross_entropy_of_the_replies(chat_gpt2, tmp_path):
    """Each micro-batch's loss is the mean over its marked targets, the step's their mean; an
    evaluation's, all the marked targets of its batches together: against transformers' logits."""
    hf = make_hf_model(seed=3, vocab_size=50257, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    hf.save_pretrained(tmp_path / "init")
    settings = {k: v for k, v in TINY.items() if k not in ("n_layer", "n_head", "n_embd")}
    train(tmp_path / "out", data=chat_gpt2, init=tmp_path / "init", max_iters=1, seed=7, progress=False, **settings)
    with torch.no_grad():
        step = []
        for micro in range(2):
            x, y, marked = plain_batch(chat_gpt2, "train", 7, micro)
            step.append(float(F.cross_entropy(hf(x).logits[marked], y[marked])))
        first_eval = next(r for r in read_log(tmp_path / "out" / "log.jsonl") if "val_loss" in r)
        for split in ("train", "val"):
            summed, count = 0.0, 0
            for k in range(TINY["eval_iters"]):
                x, y, marked = plain_batch(chat_gpt2, split, 7, EVAL_STREAM + k)
                summed += float(F.cross_entropy(hf(x).logits[marked].double(), y[marked], reduction="sum"))
                count += int(marked.sum())
            assert abs(first_eval[f"{split}_loss"] - summed / count) < 1e-5
    assert abs(losses(tmp_path / "out")[0] - np.mean(step)) < 1e-5


def test_a_run_on_conversations_resumes_bit_for_bit(chat_char, char_data, tmp_path, capsys):
    train(tmp_path / "whole", data=chat_char, max_iters=12, progress=False, **RESUMABLE)
    assert "the loss counts the replies only, the " in capsys.readouterr().err
    train(tmp_path / "parts", data=chat_char, max_iters=7, lr_decay_iters=12, progress=False, **RESUMABLE)
    train(tmp_path / "parts", resume=True, max_iters=12, progress=False)
    whole, parts = losses(tmp_path / "whole"), losses(tmp_path / "parts")
    assert sorted(parts) == list(range(12)) and parts == whole  # bit for bit, dropout on
    plain = losses(train(tmp_path / "plain", data=char_data, max_iters=1, progress=False, **RESUMABLE).out)
    assert plain[0] != whole[0]  # the mask changed the loss


def test_chat_data_without_its_mask_is_one_line_at_the_command_line(chat_char, tmp_path, capsys):
    from gpt2.cli import main

    broken = tmp_path / "chat"
    shutil.copytree(chat_char, broken)
    (broken / "train.mask.bin").unlink()
    assert (
        main(
            [
                "train",
                "--data",
                str(broken),
                "--out",
                str(tmp_path / "out"),
                "--no-progress",
                *flags(max_iters=1, **TINY),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err == (
        f"gpt2: error: {broken / 'train.mask.bin'} is missing: meta.json says the data holds conversations (chat), "
        f"whose loss counts the targets the mask marks; prepare the data again\n"
    )
    assert not (tmp_path / "out").exists()


def test_a_model_trained_on_conversations_carries_their_template(chat_gpt2, tmp_path):
    """transformers renders a conversation with the template of our output (tokenizer_config.json's) as jinja2 does."""
    import jinja2
    from transformers import AutoTokenizer

    settings = dict(TINY, n_layer=1, eval_interval=1)
    train(tmp_path / "out", data=chat_gpt2, max_iters=1, progress=False, **settings)
    assert Tokenizer.gpt2().chat_template is None  # the shared tokenizer is left alone
    assert torch.load(tmp_path / "out" / "checkpoint.pt", weights_only=True)["chat_template"] == CHAT_TEMPLATE
    expected = jinja2.Environment().from_string(CHAT_TEMPLATE).render(messages=MESSAGES, add_generation_prompt=True)
    assert expected == "user: Who wrote Hamlet?\nassistant: Shakespeare.<|endoftext|>\nuser: When?\nassistant:"
    assert GPT2.from_pretrained(tmp_path / "out", device="cpu").tokenizer.chat_template == CHAT_TEMPLATE
    theirs = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert theirs.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == expected


def test_fine_tuning_keeps_the_models_template_unless_the_data_has_its_own(gpt2_data, chat_gpt2, tmp_path):
    """Plain data keeps the init model's template; conversations replace it with theirs, and say
    so; a resume keeps what the run chose."""
    model = GPT2.from_pretrained(save_hf(tmp_path), device="cpu")
    model.tokenizer = Tokenizer.gpt2().with_chat_template("{{ messages[0].content }}")
    model.save_pretrained(tmp_path / "init")
    settings = {k: v for k, v in TINY.items() if k not in ("n_layer", "n_head", "n_embd")}
    train(tmp_path / "plain", data=gpt2_data, init=tmp_path / "init", max_iters=1, progress=False, **settings)
    assert GPT2.from_pretrained(tmp_path / "plain", device="cpu").tokenizer.chat_template == "{{ messages[0].content }}"
    with pytest.warns(ChatTemplateReplacedWarning, match="the chat template of the model '.*init' is replaced"):
        train(tmp_path / "chat", data=chat_gpt2, init=tmp_path / "init", max_iters=1, progress=False, **settings)
    assert GPT2.from_pretrained(tmp_path / "chat", device="cpu").tokenizer.chat_template == CHAT_TEMPLATE
    shutil.rmtree(tmp_path / "init")  # a resume needs the init model no more
    train(tmp_path / "plain", resume=True, max_iters=2, eval_interval=1, progress=False)
    assert GPT2.from_pretrained(tmp_path / "plain", device="cpu").tokenizer.chat_template == "{{ messages[0].content }}"


def save_hf(tmp_path: Path) -> Path:
    make_hf_model(seed=1, vocab_size=50257, n_positions=16, n_embd=32, n_layer=1, n_head=2).save_pretrained(
        tmp_path / "hf"
    )
    return tmp_path / "hf"


def test_conversations_gpt2_prepare_wrote_train_on_their_replies(tmp_path):
    """End to end: gpt2 prepare --chat's files (the default template) train, and the model saved carries
    the template."""
    from gpt2.data.chat import prepare_chat
    from gpt2.tokenizer.chat import DEFAULT_TEMPLATE

    qa = [
        [{"role": "user", "content": f"What is {a} plus {b}?"}, {"role": "assistant", "content": f"{a + b}."}]
        for a in range(8)
        for b in range(5)
    ]
    prepare_chat([write_conversations(tmp_path / "qa.jsonl", qa)], tmp_path / "data", progress=False)
    data = open_data(tmp_path / "data")
    assert data.chat_template == DEFAULT_TEMPLATE and 0 < int(data.masks["train"].sum()) < len(data.train)
    result = train(tmp_path / "out", data=tmp_path / "data", max_iters=2, progress=False, **dict(TINY, n_layer=1))
    assert math.isfinite(result.best_val_loss) and all(math.isfinite(v) for v in losses(tmp_path / "out").values())
    assert GPT2.from_pretrained(tmp_path / "out", device="cpu").tokenizer.chat_template == DEFAULT_TEMPLATE


# ------------------------------------------------------------------ recipes/induction_2l.toml


def test_the_induction_recipe_is_the_fixtures_training(tmp_path, monkeypatch, capsys):
    """recipes/induction_2l.toml against tests/fixtures/make_induction_2l.py's settings, as written there: its model
    and initial weights (torch.manual_seed(0), then GPT2), AdamW (betas 0.9, 0.98, no weight decay, no clipping),
    lr * min(1, (step + 1) / 200) at each of 2,001 steps of 64 rows; then `gpt2 prepare --synthetic induction` and
    `gpt2 train --recipe induction_2l` as its comment gives them, for 3 iterations."""
    from gpt2.cli import main
    from gpt2.data.synthetic import prepare_synthetic
    from gpt2.settings import read_recipe
    from gpt2.training.optim import learning_rate

    monkeypatch.chdir(tmp_path)  # the recipe's paths are relative to the directory gpt2 runs in
    prepare_synthetic("data/induction_2l", rows=300, progress=False)
    recipe = read_recipe("induction_2l")
    settings = TrainSettings(**{k: v for k, v in recipe.items() if k != "out"})
    assert (settings.max_iters, settings.batch_size, settings.grad_accum, settings.grad_clip) == (2001, 64, 1, 0.0)
    for it in range(settings.max_iters):
        assert learning_rate(it, settings) == pytest.approx(1e-3 * min(1.0, (it + 1) / 200), rel=1e-12), it

    trainer = Trainer(settings, tmp_path / "unused", progress=False)
    try:
        torch.manual_seed(0)
        fixture = GPT2(GPT2Config(n_vocab=64, n_ctx=64, n_embd=128, n_head=2, n_layer=2, dropout=0.0))
        assert trainer.model.config == fixture.config
        for (name, ours), theirs in zip(trainer.model.state_dict().items(), fixture.state_dict().values()):
            assert torch.equal(ours, theirs), name
        (adamw,) = trainer.optimizers
        assert adamw.defaults["betas"] == (0.9, 0.98) and {g["weight_decay"] for g in adamw.param_groups} == {0.0}
    finally:
        trainer.close()

    assert main(["train", "--recipe", "induction_2l", "--max-iters", "3", "--eval-iters", "2", "--no-progress"]) == 0
    out = tmp_path / recipe["out"]
    assert losses(out).keys() == {0, 2} and all(math.isfinite(v) for v in losses(out).values())
    given = {"max_iters": 3, "lr_decay_iters": 3, "eval_iters": 2}  # (lr_decay_iters: max_iters', unset)
    assert read_log(out / "log.jsonl")[0]["settings"] == {**settings.to_dict(), **given}
    assert GPT2.from_pretrained(out, device="cpu").config == fixture.config
    assert "best validation loss" in capsys.readouterr().err


# ------------------------------------------------------------------ data of rows with a loss mask (--synthetic)


def test_training_on_rows_draws_whole_rows_and_scores_what_their_mask_marks(tmp_path, capsys):
    """Synthetic data (rows of 65 ids, a mask that is not conversations'): each micro-batch is the first
    block_size + 1 ids of whole rows, at the seeded draw of rows, and its loss the cross-entropy of the ids the mask
    marks; against transformers' logits on batches cut here from the files with numpy. The run says what its mask
    marks and that it takes whole rows."""
    from gpt2.data.synthetic import prepare_synthetic

    prepare_synthetic(tmp_path / "data", rows=200, progress=False)
    hf = make_hf_model(seed=3, vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    hf.save_pretrained(tmp_path / "init")
    settings = {k: v for k, v in TINY.items() if k not in ("n_layer", "n_head", "n_embd")}
    train(
        tmp_path / "out",
        data=tmp_path / "data",
        init=tmp_path / "init",
        max_iters=1,
        seed=7,
        progress=False,
        **settings,
    )
    err = capsys.readouterr().err
    assert "gpt2: training on data with a loss mask: the loss counts the ids copying predicts only, the " in err
    assert "gpt2: the data is rows of 65 ids: each batch takes whole rows (the first 17 ids of each), never " in err
    rows = np.fromfile(tmp_path / "data" / "train.bin", dtype="<u2").reshape(-1, 65).astype(np.int64)
    marks = np.fromfile(tmp_path / "data" / "train.mask.bin", dtype=np.uint8).reshape(-1, 65)
    with torch.no_grad():
        step = []
        for micro in range(TINY["grad_accum"]):
            picked = np.random.default_rng([7, 0, micro]).integers(0, len(rows), size=TINY["batch_size"])
            window, marked = torch.from_numpy(rows[picked, :17]), torch.from_numpy(marks[picked, 1:17] == 1)
            logits = hf(window[:, :-1]).logits  # (B, 16, 64)
            step.append(float(F.cross_entropy(logits[marked], window[:, 1:][marked])))
    assert abs(losses(tmp_path / "out")[0] - np.mean(step)) < 1e-5
