"""Training and fine-tuning GPT-2 on one machine: nanoGPT's recipe, resumable to the same curve.

    for it in range(start, max_iters):
        lr = learning_rate(it)                       # linear warm-up, then cosine decay to min_lr
        for micro in range(grad_accum):              # one step sees batch_size * grad_accum windows
            x, y = get_batch(train, seed, it, micro) # (B, T) ids and their next ids
            loss = cross_entropy(model(x), y) / grad_accum
            loss.backward()
        clip_grad_norm(grad_clip); adamw.step()      # --optimizer muon: muon.step() for the blocks' matrices too

On data with a loss mask (conversations, `gpt2 prepare --chat`: the replies; synthetic data,
`--synthetic`: the ids copying predicts) the loss counts the targets the mask marks only: each
micro-batch's is the mean over its targets the mask marks (0 where it marks none), the
evaluations' the mean over all the marked targets of their batches; a model trained on
conversations carries the data's chat template. Data made of rows gives batches of whole rows.

Evaluations (at iteration 0, every eval_interval and at the end) log the mean loss of both
splits, keep the model of the best validation loss in OUT (Hugging Face's layout, with its
tokenizer), redraw OUT/loss.png and write OUT/checkpoint.pt, all a resume needs. Batches
come from generators seeded by (seed, iteration, micro-step) and dropout's random state is
saved, so a resumed run repeats the losses of a run never stopped. Ctrl-C or SIGTERM stops at
the next micro-batch or evaluation batch: the iteration (or evaluation) under way is abandoned
and the checkpoint is the last completed iteration's, from which a resume redoes it. A loss that
is not a number (a logged step's, an evaluation's) stops the run with a NonFiniteError before
anything more is written: the files are the last evaluation's.

On several processes (torchrun, gpt2/training/distributed.py) each takes an equal share of a step's
micro-batches, the same batches one process would draw, and the gradients are averaged over
the processes: N processes follow the loss curve of one. Only rank 0 writes files and prints;
evaluation batches are shared out too, and their losses summed over all processes. The checkpoint
records torchrun's job (--rdzv-id): when torchrun restarts the job's workers (a node was lost,
under --max-restarts), they continue that run from it, on however many processes are left.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpt2._files import BackgroundWriter, atomic_write_text, writable_directory
from gpt2.checkpoints.weights import TRAINED_FROM, TRAINED_ITERATIONS
from gpt2.data.batches import get_batch
from gpt2.data.files import open_data
from gpt2.devices import Precision, enable_tf32, peak_flops, should_compile, training_precision
from gpt2.errors import GPT2Error, InvalidArgumentError, NonFiniteError
from gpt2.evaluation.evaluate import hellaswag_right, loss_sum, score_continuations
from gpt2.generation.decoding import ContextOverflowWarning
from gpt2.generation.generate import generate_text
from gpt2.model.model import GPT2
from gpt2.settings import TEMPERATURE, TOP_K, TrainSettings, check_setting_names, resumed_settings
from gpt2.tokenizer import CharTokenizer, Tokenizer
from gpt2.training import distributed
from gpt2.training.checkpoint import (
    CHECKPOINT,
    checkpoint_job,
    checkpoint_state,
    load_checkpoint,
    load_optimizer,
    model_from_checkpoint,
    process_rng,
    rng_state,
    set_rng_state,
    write_checkpoint,
)
from gpt2.training.curves import plot_head_scores, plot_losses
from gpt2.training.loggers import LOG, WANDB_ID, Loggers, check_loggers, open_loggers, read_log
from gpt2.training.optim import learning_rate, make_optimizers, peak_lr, warn_about_warmup
from gpt2.training.plan import (
    ChatTemplateReplacedWarning,
    TaskEvaluation,
    build_model,
    chat_template_for,
    check_training_memory,
    flops_per_token,
    planned_config,
)
from gpt2.training.probes import PROBES, append_probe, probe_ids, probe_record, trim_probes
from gpt2.training.stopping import StopRequested, StopSignals

PLOT = "loss.png"
HEADS_PLOT = "heads.png"  # each head's scores on the probe
EVAL_STREAM = 1 << 32  # evaluation batches use micro-steps from here on: never a training batch's seed


@dataclass
class TrainResult:
    out: Path
    iteration: int  # iterations done
    best_val_loss: float
    last_eval: dict[str, Any] | None  # the last evaluation's log record
    interrupted: bool  # stopped by Ctrl-C or SIGTERM (a checkpoint was saved)
    rank: int = 0  # the process that returns it (0: the one that wrote the files)


class Progress:
    """What a run shows as it goes: tqdm's bar over the iterations (drawn by rank 0, where asked),
    the last logged step's numbers, and inside an iteration what it is doing."""

    def __init__(self, bar: Any = None):
        self.bar = bar  # tqdm's, while the loop runs
        self.stats = ""  # the last logged step's numbers, as tqdm's set_postfix writes them
        self.score = ""  # the last evaluation's task score ("hellaswag=0.2950"), where a run scores one
        self.shown = 0.0  # when the bar was last drawn

    def show(self, description: str, detail: str = "", force: bool = False) -> None:
        """What the bar shows inside an iteration: `description` ("training", "evaluating val
        3/200"), and after the last step's numbers `detail` (the micro-batch). Redrawn in place,
        at most every tqdm's mininterval unless `force`d: many small batches a second cost nothing."""
        bar = self.bar
        if bar is None or bar.disable:
            return
        bar.set_description_str(description, refresh=False)
        bar.set_postfix_str(self._postfix(detail), refresh=False)
        now = time.monotonic()
        if force or now - self.shown >= bar.mininterval:
            bar.refresh()
            self.shown = now

    def step_done(self, it: int, stats: dict[str, str] | None) -> None:
        """Iteration `it` done; `stats`: its numbers by name, where it was logged (on rank 0). Without
        a bar (--no-progress) they are a line of their own, as nanoGPT prints them."""
        if stats is not None:
            self.stats = ", ".join(f"{k}={v}" for k, v in stats.items())  # as tqdm's set_postfix writes them
            if self.bar.disable:
                self.write(f"iter {it}: " + ", ".join(f"{k} {v}" for k, v in stats.items()))
        if stats is not None or not self.bar.disable:
            self.bar.set_postfix_str(self._postfix(), refresh=False)  # (the micro-batch count off)
        self.bar.update()

    def set_score(self, score: str) -> None:
        """The last evaluation's task score ("hellaswag=0.2950"), shown from now on beside the steps' numbers."""
        self.score = score
        self.show("training", force=True)

    def _postfix(self, detail: str = "") -> str:
        return ", ".join(part for part in (self.stats, self.score, detail) if part)

    def write(self, text: str, **kwargs: Any) -> None:
        """A line above the bar (printed even where the bar is not drawn)."""
        self.bar.write(text, **kwargs)


class Trainer:
    """One training run: the model, its optimizer and data, and the loop over iterations. Its
    parts: the step (`train_step`), the evaluation (`evaluate`, `evaluate_and_save`), the
    checkpoint (`save_checkpoint`, in the format of gpt2/training/checkpoint.py) and the stop on a signal
    (`_abandon`, with gpt2/training/stopping.py's handlers)."""

    def __init__(self, s: TrainSettings, out: Path, *, progress: bool = True, state: dict[str, Any] | None = None):
        self.s, self.out, self.progress = s, out, progress
        if s.fsdp and not distributed.launched():
            raise InvalidArgumentError(
                "fsdp shards the model over the processes of a distributed launch: "
                "start the run under torchrun, one process a GPU",
                "fsdp",
            )
        self.logger: Loggers | None = None  # rank 0's, from the loop's start: log.jsonl, W&B, TensorBoard
        self.data = open_data(s.data)
        self.task = (
            None if s.eval_task is None else TaskEvaluation(s, self.data, progress and distributed.launch_rank() == 0)
        )
        self.procs = distributed.start(s.device, s.timeout)  # this process's rank of world; its device
        try:
            self._build(state)
        except BaseException:
            self.close()
            raise

    def _build(self, state: dict[str, Any] | None) -> None:
        s = self.s
        self.rank, self.world, self.device = self.procs.rank, self.procs.world, self.procs.device
        if s.grad_accum % self.world:
            raise InvalidArgumentError(
                f"grad_accum {s.grad_accum} must be a multiple of the {self.world} processes: "
                f"each takes an equal share of a step's micro-batches",
                "grad_accum",
            )
        self.precision: Precision = training_precision(self.device, s.dtype)
        check_training_memory(planned_config(s, self.data, state), s, self.procs, self.precision.compute)
        enable_tf32(self.device)
        torch.manual_seed(s.seed)  # the initial weights (the same in every process), and dropout's stream from there
        model = build_model(s, self.data) if state is None else model_from_checkpoint(state)
        if self.rank:
            torch.manual_seed(s.seed + self.rank)  # each process its own dropout masks
        self.data.check_block_size(model.config.n_ctx)
        model.checkpoint_activations = s.checkpoint_activations
        self.model = model.to(self.device).train()
        self.tokenizer = self._tokenizer(model, state)
        # rank 0 probes the whole model it holds; under FSDP no process holds it whole
        self.probe = probe_ids(s, model.config, self.tokenizer) if self.is_main and not s.fsdp else None
        self.probed = -1  # the last iteration probed
        self.task_batches = (
            [] if self.task is None else self.task.batches(model.config.n_ctx, s.batch_size * model.config.n_ctx)
        )
        self.forward = self.procs.wrap(self.model, fsdp=s.fsdp, compiled=should_compile(s.compile, self.device))
        self.optimizers = make_optimizers(self.model, s, self.device)  # after wrap: under FSDP they update the shards
        self.scaler = self.precision.scaler()
        self.iteration, self.evaluated, self.best_val_loss = 0, -1, math.inf
        self.resumed = state is not None
        if state is not None:
            self._restore(state)
        self.tokens_per_iter = s.batch_size * model.config.n_ctx * s.grad_accum  # over all processes
        self.flops_per_iter = flops_per_token(model) * self.tokens_per_iter
        peak = peak_flops(self.device, self.precision.compute)
        self.peak_flops = peak * self.world if peak else None
        self.stop = StopSignals(self.procs)
        self.last_eval: dict[str, Any] | None = None
        self.at_start = rng_state(self.device)  # the random state an abandoned iteration is saved with
        self.bar = Progress()
        self.writer = BackgroundWriter()  # rank 0's files of an evaluation, written while training goes on

    def _tokenizer(self, model: GPT2, state: dict[str, Any] | None) -> Tokenizer | CharTokenizer | None:
        """The data's tokenizer, which the model saved carries, with the chat template it carries too
        (`chat_template_for`: the data's, else the init model's, on resume the checkpoint's)."""
        if state is not None:
            earlier, whose = state.get("chat_template"), f"trained in {self.out}"
        else:
            earlier, whose = None if model.tokenizer is None else model.tokenizer.chat_template, repr(self.s.init)
        if self.is_main:
            template = chat_template_for(self.data, earlier, whose)
        else:  # the same choice, said once (by rank 0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ChatTemplateReplacedWarning)
                template = chat_template_for(self.data, earlier, whose)
        tokenizer = self.data.tokenizer
        return (
            tokenizer
            if tokenizer is None or template == tokenizer.chat_template
            else tokenizer.with_chat_template(template)
        )

    @property
    def is_main(self) -> bool:
        """The process that writes files and prints (rank 0)."""
        return self.procs.is_main

    # -------------------------------------------------------------- the loop

    def close(self) -> None:
        """Leave the process group, once nothing holds it: DDP's wrapper, and under FSDP the
        model and the optimizer (their tensors are shards that name the group); then put back
        the signal handlers a group's run kept until now (gpt2/training/stopping.py)."""
        try:
            self.forward = self.model = self.optimizers = None
            if self.logger is not None:
                self.logger.close()
                self.logger = None
            self.procs.close()
        finally:
            if hasattr(self, "stop"):  # (not made yet: the run failed to start)
                self.stop.release()

    def run(self) -> TrainResult:
        try:
            return self._run()
        except BaseException as e:
            self.writer.finish()  # whatever stopped the run, the files of the last evaluation are whole
            if isinstance(e, NonFiniteError):  # raised in every process at once (_diverged): none leaves before
                self.procs.barrier()  # rank 0's files are whole (torchrun ends the others when one process exits)
            failure = (
                self.procs.failure(e) if isinstance(e, Exception) else None
            )  # another process died or hangs: say which
            if failure is not None:
                raise failure from None
            raise

    def _run(self) -> TrainResult:
        s = self.s
        if self.is_main:
            self._begin()
        from tqdm.auto import tqdm

        bar = tqdm(
            total=s.max_iters,
            initial=self.iteration,
            unit="iter",
            desc="training",
            disable=not (self.progress and self.is_main),
            dynamic_ncols=True,
        )
        with self.stop.handled(lambda text: self.bar.write(text, file=sys.stderr)), bar:
            self.bar = Progress(bar)
            for it in range(self.iteration, s.max_iters + 1):
                self.iteration = it
                try:
                    self.at_start = rng_state(self.device)
                    if (it % s.eval_interval == 0 or it == s.max_iters) and self.evaluated != it:
                        self.evaluate_and_save(it)  # with the probe due now, once its losses are numbers
                        self.at_start = rng_state(self.device)  # (sampling draws from its own generator, but need not)
                    if self.probe_due(it):  # between evaluations (probe_interval)
                        self.record_probe(it)
                    if it == s.max_iters:
                        break
                    started = time.perf_counter()
                    loss = self.train_step(it)
                except StopRequested:
                    return self._abandon()
                stats = None
                if it % s.log_interval == 0 or it + 1 == s.max_iters:
                    loss = float(self.procs.sum(loss)) / self.world  # the mean over all micro-batches of the step
                    if not math.isfinite(loss):  # the same sum in every process: all stop here
                        raise self._diverged(f"the training loss is {loss}")
                    stats = self._log_step(it, loss, time.perf_counter() - started)
                self.bar.step_done(it, stats)
        self.writer.wait()
        self.procs.barrier()  # every process ends when rank 0 has written everything
        return self._result(interrupted=False)

    def _begin(self) -> None:
        """On rank 0, before the loop: OUT still writable, its log cut back to the checkpoint's
        iteration, the loggers opened with the settings from here on, and a word on the warm-up and
        on where a resumed run resumes."""
        writable_directory(self.out)
        _trim_log(self.out / LOG, self.iteration, self.evaluated)
        trim_probes(self.out, self.iteration)
        self.logger = open_loggers(self.s, self.out / LOG, self.iteration, self.resumed)
        job = distributed.job_id()  # the torchrun job's, whose restart before the first checkpoint starts over
        self.logger.log({"iter": self.iteration, "settings": self.s.to_dict(), **({"job": job} if job else {})})
        warn_about_warmup(self.s)
        if self.data.masks:  # conversations' mask marks the replies; synthetic data's, say, the ids copying predicts
            marked, n = int(self.data.masks["train"].sum(dtype="int64")), len(self.data.train)
            what = "conversations" if self.data.chat_template is not None else "data with a loss mask"
            print(
                f"gpt2: training on {what}: the loss counts {self.data.mask_marks} only, the {marked:,} of {n:,} "
                f"training tokens their mask marks",
                file=sys.stderr,
            )
        if self.data.row is not None:
            print(
                f"gpt2: the data is rows of {self.data.row} ids: each batch takes whole rows (the first "
                f"{self.model.config.n_ctx + 1} ids of each), never the end of one and the start of the next",
                file=sys.stderr,
            )
        if self.resumed:
            best = "no evaluation yet" if math.isinf(self.best_val_loss) else f"best val loss {self.best_val_loss:.4f}"
            print(f"gpt2: resuming from iteration {self.iteration} ({best})", file=sys.stderr)

    def _abandon(self) -> TrainResult:
        """Stop in the middle of iteration `self.iteration`: drop its gradients and put back the
        random state it started from (dropout's draws), then save the checkpoint of the last
        completed iteration, which a resume repeats from here. The optimizer and the gradient
        scaler are as they were: both change only after the last micro-batch. A stop in an
        evaluation leaves `evaluated` at the last one done, so the resume redoes this one."""
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)
        self.model.train()
        set_rng_state(self.at_start, self.device)
        self.writer.wait()  # the last evaluation's files first: this checkpoint is later
        if not self.procs.all_finite(self.model):  # diverged since the last logged step: keep the checkpoint there is
            raise self._diverged("the weights are not finite")
        self.save_checkpoint()
        self.procs.barrier()
        return self._result(interrupted=True)

    def _result(self, interrupted: bool) -> TrainResult:
        return TrainResult(self.out, self.iteration, self.best_val_loss, self.last_eval, interrupted, self.rank)

    def _diverged(self, what: str) -> NonFiniteError:
        """The error that stops a run whose loss is not a number (`what`: which, and its value);
        every process raises it at once (the losses checked are sums over all of them)."""
        s = self.s
        rates = f"lr={s.lr:g}" + (f", muon_lr={peak_lr(s, muon=True):g}" if s.optimizer == "muon" else "")
        kept = (
            f"the files in {self.out} are those of the evaluation at iteration {self.evaluated}, not overwritten"
            if self.evaluated >= 0
            else f"nothing was saved in {self.out}"
        )
        also = ("muon_lr",) * (s.optimizer == "muon") + ("warmup_iters", "overwrite")
        return NonFiniteError(
            f"iter {self.iteration}: {what}: training diverged, most likely because the learning rate is too "
            f"high ({rates}, warmup_iters={s.warmup_iters}); {kept}; to start again with a lower lr, pass "
            f"overwrite=True",
            "lr",
            also,
        )

    # -------------------------------------------------------------- the step

    def train_step(self, it: int) -> torch.Tensor:
        """One optimizer step over grad_accum micro-batches; returns their mean loss (a tensor, not synchronised)."""
        s = self.s
        for optimizer in self.optimizers:
            lr = learning_rate(it, s, peak_lr(s, muon=isinstance(optimizer, torch.optim.Muon)))
            for group in optimizer.param_groups:
                group["lr"] = lr
        total = torch.zeros((), device=self.device)
        share = range(self.rank, s.grad_accum, self.world)  # this process's micro-batches: 1 in `world`
        for i, micro in enumerate(share):
            self.stop.check()
            x, y = get_batch(
                self.data.train,
                self.model.config.n_ctx,
                s.batch_size,
                seed=s.seed,
                iteration=it,
                micro_step=micro,
                device=self.device,
                mask=self.data.masks.get("train"),
                row=self.data.row,
            )
            with self.procs.gradient_sync(micro == share[-1]):  # averaged over the processes after the last
                with self.precision.autocast():
                    _, loss = self.forward(x, y, check_ids=False)  # ids were checked when the data was opened
                # the mean over this process's share; averaging over the processes makes it the step's mean
                # (on conversations, each micro-batch's loss is the mean over the targets its mask marks)
                loss = loss / len(share)
                self.scaler.scale(loss).backward()
            total += loss.detach()
            if len(share) > 1:
                self.bar.show("training", f"micro-batch {i + 1}/{len(share)}")
        if s.grad_clip > 0:
            for optimizer in self.optimizers:
                self.scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), s.grad_clip)
        for optimizer in self.optimizers:  # (one scaler for all: torch's recipe for several optimizers)
            self.scaler.step(optimizer)
        self.scaler.update()
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)
        return total

    def rates(self, it: int) -> dict[str, float]:
        """The learning rates of iteration `it`, as logged: lr, AdamW's (every weight, or with Muon
        the embeddings, biases and LayerNorms), and muon_lr, Muon's (the blocks' matrices), where it runs."""
        lrs = {"lr": learning_rate(it, self.s)}
        if any(isinstance(optimizer, torch.optim.Muon) for optimizer in self.optimizers):
            lrs["muon_lr"] = learning_rate(it, self.s, peak_lr(self.s, muon=True))
        return lrs

    def _log_step(self, it: int, loss: float, seconds: float) -> dict[str, str] | None:
        """Log a step (on rank 0); returns its numbers as shown, by name, for the progress bar or its line."""
        if not self.is_main:
            return None
        tokens_per_s = self.tokens_per_iter / seconds
        record = {"iter": it, "loss": loss, **self.rates(it), "ms": seconds * 1000, "tokens_per_s": tokens_per_s}
        shown = {"loss": f"{loss:.4f}", "time": f"{seconds * 1000:.1f}ms", "tok/s": f"{tokens_per_s:,.0f}"}
        if self.peak_flops:
            record["mfu"] = self.flops_per_iter / seconds / self.peak_flops
            shown["mfu"] = f"{record['mfu']:.1%}"
        self.logger.log(record)
        return shown

    # -------------------------------------------------------------- the evaluation

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean loss over eval_iters batches of each split: the same batches at every evaluation,
        shared out over the processes (under FSDP each runs as many: all take part in each one)."""
        self.model.eval()
        try:
            losses = {
                split: self._split_loss(split, ids)
                for split, ids in (("train", self.data.train), ("val", self.data.val))
            }
        finally:
            self.model.train()
        self.bar.show("training", force=True)
        return losses

    def _my_batches(self, n: int) -> Iterator[int]:
        """This process's share of n evaluation batches: k = rank, rank + world, ... Under FSDP
        every process runs as many forward passes (each takes part in all), so past n it goes on
        with batches to throw away (k >= n: the caller drops their result). A stop is checked
        before each, as often in every process."""
        for k in range(self.rank, math.ceil(n / self.world) * self.world, self.world):
            self.stop.check()
            if k >= n and self.procs.sharded is None:
                return
            yield k

    def _split_loss(self, split: str, ids: Any) -> float:
        """The mean loss of one split's evaluation batches, over all processes: the summed loss of
        their targets (on conversations, those the mask marks) over their number (NaN: none)."""
        s = self.s
        total = torch.zeros(2, dtype=torch.float64, device=self.device)  # summed loss, ids scored
        self.bar.show(f"evaluating {split} 0/{s.eval_iters}", force=True)
        for k in self._my_batches(s.eval_iters):
            x, y = get_batch(
                ids,
                self.model.config.n_ctx,
                s.batch_size,
                seed=s.seed,
                iteration=0,
                micro_step=EVAL_STREAM + k % s.eval_iters,
                device=self.device,
                mask=self.data.masks.get(split),
                row=self.data.row,
            )
            with self.precision.autocast():
                loss, n = loss_sum(self.model, x, y)  # gpt2 eval's computation
            if k < s.eval_iters:
                total += torch.stack([loss, torch.tensor(float(n), dtype=torch.float64, device=self.device)])
            self.bar.show(f"evaluating {split} {min(k + self.world, s.eval_iters)}/{s.eval_iters}")
        loss, count = self.procs.sum(total).tolist()
        if count and not math.isfinite(
            loss
        ):  # the same sum in every process: all stop here, before any file is written
            raise self._diverged(f"the {split} loss of its evaluation is {loss}")
        return loss / count if count else math.nan

    @torch.no_grad()
    def score_task(self) -> dict[str, float]:
        """The eval_task's acc and acc_norm ({} without one), by `gpt2 eval`'s scoring under the
        run's autocast: the batches shared out over the processes (under FSDP each runs as many),
        each pair's score summed over all of them."""
        task, batches = self.task, self.task_batches
        if task is None:
            return {}
        scores = torch.zeros(len(task.pairs), 2, dtype=torch.float64, device=self.device)  # log-probability, ids scored
        n = len(batches)
        self.bar.show(f"evaluating {task.name} 0/{n}", force=True)
        for k in self._my_batches(n):
            pairs = [task.pairs[i] for i in batches[k % n]]
            with self.precision.autocast():
                got = score_continuations(
                    self.model, pairs, batch_size=len(pairs), prefix_cache_mb=0
                )  # one forward pass
            if k < n:
                scores[batches[k]] = torch.tensor(
                    [[g.log_prob, g.n_ids] for g in got], dtype=torch.float64, device=self.device
                )
            self.bar.show(f"evaluating {task.name} {min(k + self.world, n)}/{n}")
        log_probs, n_ids = self.procs.sum(scores).T.tolist()
        right, right_norm = hellaswag_right(task.examples, log_probs, n_ids)
        self.bar.show("training", force=True)
        return {
            f"{task.name}_acc": right / len(task.examples),
            f"{task.name}_acc_norm": right_norm / len(task.examples),
        }

    def evaluate_and_save(self, it: int) -> None:
        """Evaluate, then log it, keep the model if it is the best so far, sample, save the checkpoint and plot."""
        losses = self.evaluate()
        scores = self.score_task()
        if self.probe_due(it):  # before the files' writer is handed heads.png to draw
            self.record_probe(it)
        self.evaluated = it
        improved = losses["val"] < self.best_val_loss
        record = {
            "iter": it,
            "train_loss": losses["train"],
            "val_loss": losses["val"],
            **scores,
            **self.rates(it),
            "best": improved,
        }
        weights = self.procs.model_state(self.model)  # gathered once (under FSDP, by every process) for both files
        if improved:
            self.best_val_loss = losses["val"]
        if self.s.sample_prompt is not None and (self.is_main or self.procs.sharded is not None):  # FSDP: all take part
            record["sample"] = self.sample(self.s.sample_prompt)
        state = self.checkpoint_state(weights)  # under FSDP every process's part of gathering the optimizer's state
        if not self.is_main:
            return
        self.last_eval = record
        self.logger.log(record)
        line = f"iter {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"
        if self.task is not None:  # acc_norm, the accuracy llm.c and build-nanogpt print
            score = scores[f"{self.task.name}_acc_norm"]
            line += f", {self.task.name} {score:.4f}"
            self.bar.set_score(f"{self.task.name}={score:.4f}")
        self.bar.write(line + (" (best so far: saved)" if improved else ""))
        if "sample" in record:
            self.bar.write(f"sample: {self.s.sample_prompt}{record['sample']}")
        self.writer.write(
            lambda: self.write_files(weights if improved else None, state, it)
        )  # copies: training goes on

    def probe_due(self, it: int) -> bool:
        """Whether this process probes at iteration `it` (rank 0, a run with probes) and has not yet."""
        s = self.s
        due = it % (s.probe_interval or s.eval_interval) == 0 or it == s.max_iters
        return self.probe is not None and self.probed != it and due

    def record_probe(self, it: int) -> None:
        """What the model does with the run's probe now, a line of OUT/probes.jsonl and to W&B and TensorBoard
        (rank 0's; no randomness drawn: greedy, in eval mode)."""
        self.model.eval()
        record = probe_record(self.model, self.tokenizer, self.probe, it)
        self.model.train()
        append_probe(self.out, record)
        self.logger.probe(record)
        self.probed = it

    def write_files(self, best: dict[str, torch.Tensor] | None, state: dict[str, Any], it: int) -> None:
        """Rank 0's files of an evaluation at iteration `it` (in the writer's thread): the model, if
        `best`, the checkpoint, then the plot."""
        if best is not None:
            self.save_model(best, it)
        write_checkpoint(self.out, state)
        plot_losses(self.out / LOG, self.out / PLOT, note=self.bar.write)
        plot_head_scores(self.out / PROBES, self.out / HEADS_PLOT)

    def sample(self, prompt: str, max_new_tokens: int = 100) -> str:
        """A continuation of the prompt by the model as it is now (seeded: the same at every resume)."""
        self.model.eval()
        top_k = min(TOP_K, self.model.config.n_vocab)
        with warnings.catch_warnings():  # past the block size the context slides, as expected here
            warnings.simplefilter("ignore", ContextOverflowWarning)
            text = generate_text(
                self.model,
                self.tokenizer,
                prompt,
                max_new_tokens=max_new_tokens,
                temperature=TEMPERATURE,
                top_k=top_k,
                seed=self.s.seed,
            )[0]
        self.model.train()
        return text

    # -------------------------------------------------------------- files

    def save_model(self, weights: dict[str, torch.Tensor], it: int) -> None:
        """The model of the best validation loss, as a model directory: `weights` (those of
        `Processes.model_state`, on rank 0, which writes), config, tokenizer; its weights file
        records the iteration they are of, and whether the run started from random weights (a
        model of iteration 0 of those is warned about when loaded: gpt2/checkpoints/weights.py)."""
        if self.is_main:
            self.model.tokenizer = self.tokenizer
            trained = {TRAINED_ITERATIONS: str(it), TRAINED_FROM: "scratch" if self.s.init is None else "init"}
            self.model.save_pretrained(self.out, weights, metadata=trained)

    def save_checkpoint(self) -> None:
        """Write the checkpoint now (rank 0; every process takes part in gathering it)."""
        state = self.checkpoint_state()
        if self.is_main:
            write_checkpoint(self.out, state)

    def checkpoint_state(self, weights: dict[str, torch.Tensor] | None = None) -> dict[str, Any] | None:
        """All a resume needs, for one file written by rank 0 (gpt2/training/checkpoint.py): whole weights,
        the optimizers' state by parameter name, and each process's random state (dropout's), as
        copies that later steps leave alone (None on the other ranks). `weights`: the model's,
        already gathered (`Processes.model_state`); else gathered here."""
        model = self.procs.model_state(self.model) if weights is None else weights
        optimizer = self.procs.optimizer_state(self.model, self.optimizers)
        rng = self.procs.gather(rng_state(self.device))
        if not self.is_main:
            return None
        return checkpoint_state(
            settings=self.s.to_dict(),
            config=self.model.config,
            iteration=self.iteration,
            evaluated=self.evaluated,
            best_val_loss=self.best_val_loss,
            model=model,
            optimizer=optimizer,
            scaler=self.scaler.state_dict(),
            rng=rng,
            chat_template=None if self.tokenizer is None else self.tokenizer.chat_template,
            job=distributed.job_id(),
        )

    def _restore(self, state: dict[str, Any]) -> None:
        load_optimizer(state, self.procs, self.model, self.optimizers)
        self.scaler.load_state_dict(state["scaler"])
        self.iteration, self.evaluated, self.best_val_loss = (
            state["iteration"],
            state["evaluated"],
            state["best_val_loss"],
        )
        rng = process_rng(state, self.rank, self.device)
        if rng is not None:  # a process added on resume keeps the seed it started from
            set_rng_state(rng, self.device)


def _trim_log(path: Path, iteration: int, evaluated: int) -> None:
    """Keep the records of the iterations done before `iteration` (and its evaluation, if done):
    a run that resumes from a checkpoint logs the later ones again."""
    if not path.is_file():  # a new run: its first record makes the file
        return
    kept = [r for r in read_log(path) if r["iter"] < iteration or ("val_loss" in r and r["iter"] <= evaluated)]
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))


def check_out(out: Path, resume: bool, overwrite: bool) -> None:
    """Nothing a user trained is overwritten by a typo: a run in OUT needs resume or overwrite."""
    if resume and overwrite:
        raise InvalidArgumentError("resume and overwrite contradict each other: pick one", "resume", ("overwrite",))
    holds_run = any((out / name).exists() for name in (CHECKPOINT, LOG, "model.safetensors"))
    if holds_run and not (resume or overwrite):
        raise InvalidArgumentError(
            f"{out} already holds a run: pass resume=True to continue it, or overwrite=True to start over",
            "resume",
            ("overwrite",),
        )


def make_out(out: Path, overwrite: bool) -> bool:
    """OUT, made and proved writable before anything is loaded (a run must not train for an hour,
    then fail to save), and emptied of an old run's files on overwrite. Only rank 0 writes.
    Returns whether OUT was made here."""
    if distributed.launch_rank() != 0:
        return False
    made = not out.exists()
    writable_directory(out)
    if overwrite:
        for name in (CHECKPOINT, LOG, PLOT, WANDB_ID):
            (out / name).unlink(missing_ok=True)
    return made


def _jobs_own_run(out: Path, auto_resume: bool | None) -> tuple[bool, dict[str, Any] | None]:
    """Whether `out` holds a run this torchrun job (`distributed.job_id`) started, which the workers
    torchrun restarted continue (auto_resume: None, on under torchrun), and its checkpoint (None: it
    saved none yet, and starts over). A run of another job, or of none, is not: `check_out` treats
    OUT as ever, and a new job never continues another's run."""
    job = distributed.job_id()
    if auto_resume and job is None:
        raise InvalidArgumentError(
            "auto_resume continues a run whose torchrun job restarted its workers: launch with torchrun's "
            "--rdzv-id JOB (or --standalone), or continue a run with resume=True",
            "auto_resume",
            ("resume",),
        )
    if auto_resume is False or job is None:
        return False, None
    state = None
    if (out / CHECKPOINT).is_file():
        with suppress(GPT2Error):  # unreadable, or not ours: not this job's (check_out refuses it as ever)
            state = load_checkpoint(out)
        own = state is not None and checkpoint_job(state) == job
    else:  # lost before its first checkpoint: the log's start names the job
        own = any(r.get("job") == job for r in read_log(out / LOG) if "settings" in r)
    if own and distributed.launch_rank() == 0:
        restart, at = distributed.restart_count(), "its checkpoint" if state else "the start: it saved no checkpoint"
        print(f"gpt2: torchrun job {job!r} (restart {restart}): continuing its run in {out} from {at}", file=sys.stderr)
    return own, state if own else None


def train(
    out: str | os.PathLike,
    *,
    resume: bool = False,
    overwrite: bool = False,
    auto_resume: bool | None = None,
    progress: bool = True,
    **settings: Any,
) -> TrainResult:
    """Train (or fine-tune) a model on prepared data, writing everything into `out`.

    settings: the fields of TrainSettings (data=... is required for a new run). With resume,
    the run in `out` continues with its own settings; max_iters and a few others may change.
    With auto_resume (None: on under torchrun), a run in `out` that this torchrun job started
    (its --rdzv-id) continues as with resume (from the start if it saved no checkpoint yet),
    whatever overwrite says: torchrun restarted the job's workers, after a process or a node was
    lost, with the command that started them.
    """
    out = Path(out)
    own, state = (False, None) if resume else _jobs_own_run(out, auto_resume)
    if own:  # overwrite, given to start the job, must not wipe the run the job is doing
        resume, overwrite = state is not None, False
    if not (own and state is None):  # (a start over: a new run's files replace the old's as it goes)
        check_out(out, resume, overwrite)
    check_setting_names(settings)
    if resume:
        state = state or load_checkpoint(out)
        s = resumed_settings(state["settings"], settings)
        left = s.max_iters - state["iteration"]  # 0 with the last evaluation still to do: stopped during it
        done = left < 0 or (left == 0 and state["evaluated"] == state["iteration"])
        if done and own and left == 0:  # lost a process after its end (at the last barrier): done
            return TrainResult(out, state["iteration"], state["best_val_loss"], None, False, distributed.launch_rank())
        if done:
            raise InvalidArgumentError(
                f"the run in {out} already did its {state['iteration']} iterations: "
                f"pass a larger max_iters to train further",
                "max_iters",
            )
    else:
        if settings.get("data") is None:
            raise InvalidArgumentError("no data: give data, the directory gpt2 prepare wrote", "data")
        s = TrainSettings(**settings)
    check_loggers(s)
    made = make_out(out, overwrite)
    try:
        trainer = Trainer(s, out, progress=progress, state=state)
    except BaseException:
        if made:  # a run that could not start leaves no empty directory behind
            with suppress(OSError):
                out.rmdir()
        raise
    try:
        return trainer.run()
    finally:
        trainer.close()
