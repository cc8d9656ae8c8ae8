"""What a run is set up with before its first iteration, each checked then: the model's configuration and weights
(new, fine-tuned or resumed), the chat template it carries, the memory and FLOPs a step takes, and the benchmark it
scores at each evaluation.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, NamedTuple

import torch

from gpt2.checkpoints.config import GPT2Config
from gpt2.checkpoints.weights import expected_shapes, read_config
from gpt2.data.files import TokenData
from gpt2.devices import check_fits, format_bytes
from gpt2.errors import ContextLengthError, DataError, GPT2Warning, InvalidArgumentError
from gpt2.evaluation.evaluate import hellaswag_pairs
from gpt2.evaluation.tasks import read_hellaswag, task_file
from gpt2.model.model import GPT2
from gpt2.settings import TrainSettings
from gpt2.tokenizer import CharTokenizer, Tokenizer
from gpt2.training import distributed
from gpt2.training.checkpoint import checkpoint_config

WORKSPACE = 200_000_000  # bytes a run takes whatever its size (benchmarks/memory.py: 180 to 230 MB on a CPU)


class ChatTemplateReplacedWarning(GPT2Warning):
    """The model fine-tuned on conversations had a chat template of its own, not the one the data
    was rendered with: the model saved carries the data's, whose turns it learns."""


def flops_per_token(model: GPT2) -> float:
    """Forward and backward FLOPs a token costs (PaLM's appendix B, as nanoGPT's estimate_mfu):
    6 per weight (the position table excluded: a lookup) plus attention's 12 L C T."""
    config = model.config
    weights = sum(p.numel() for name, p in model.named_parameters() if not name.startswith("transformer.wpe"))
    return 6 * weights + 12 * config.n_layer * config.n_embd * config.n_ctx


def build_model(s: TrainSettings, data: TokenData) -> GPT2:
    """A new model (weights drawn from torch's generator: seed it first) or the `init` model,
    whose vocabulary must be the data's."""
    if s.init is None:
        return GPT2(s.model_config(data.vocab_size))
    model = GPT2.from_pretrained(s.init, device="cpu", dropout=s.dropout)  # with the tokenizer saved beside it
    data.check_vocabulary(model.tokenizer, model.config.n_vocab, repr(s.init))
    if s.block_size is not None:
        if s.block_size > model.config.n_ctx:
            raise ContextLengthError(
                f"block_size {s.block_size} is over the context of the model {s.init!r} (n_ctx={model.config.n_ctx})"
            )
        model.crop_context(s.block_size)
    return model


def chat_template_for(data: TokenData, earlier: str | None, model: str) -> str | None:
    """The chat template the trained model carries: the data's, whose turns it learns (with a
    ChatTemplateReplacedWarning where `earlier`, the model's own, differs), else the model's own."""
    if data.chat_template is None:
        return earlier
    if earlier is not None and earlier != data.chat_template:
        warnings.warn(
            ChatTemplateReplacedWarning(
                f"the chat template of the model {model} is replaced by the one the data in "
                f"{data.directory} was rendered with: the model saved carries the data's",
                "init",
            ),
            stacklevel=2,
        )
    return data.chat_template


def planned_config(s: TrainSettings, data: TokenData, state: dict[str, Any] | None) -> GPT2Config:
    """The architecture a run will train, known before any weight is made or read."""
    if state is not None:
        return checkpoint_config(state)
    if s.init is None:
        return s.model_config(data.vocab_size)
    config = read_config(s.init)
    return config if s.block_size is None else config.replace(n_ctx=min(s.block_size, config.n_ctx))


class TrainingMemory(NamedTuple):
    states: int  # bytes of the weights, their gradients and AdamW's moments
    activations: int  # bytes one micro-batch keeps for the backward pass

    @property
    def total(self) -> int:
        return self.states + self.activations + WORKSPACE


def training_memory(
    config: GPT2Config, s: TrainSettings, device: torch.device, compute: torch.dtype, world: int = 1
) -> TrainingMemory:
    """What one process of a run holds at its peak, estimated: the weights with their gradients
    and AdamW's two moments, one micro-batch's activations, and a workspace.
    benchmarks/memory.py checks it against the peak of real runs.

    Weights: float32, 16 bytes each with the rest (FSDP shares them out over the processes; DDP
    keeps a bucketed copy of the gradients, 4 more). Activations, those a micro-batch keeps for
    the backward pass, for each of its tokens:
      - each layer's 17 C values: the input and output of both LayerNorms, q, k and v, attention's
        output, the MLP's 4 C before and after its GELU (4 bytes each, 2 under 16-bit autocast);
        with activation checkpointing, each layer's input and one layer's 17 C;
      - the logits, their log-probabilities and the gradients of both: 4 V float32;
      - with dropout on a CPU, whose fused attention does not drop, each layer's attention
        scores, probabilities and mask, T per head (16 bytes each);
    and WORKSPACE bytes whatever the size (torch's first backward pass, oneDNN's buffers): in `total`.
    """
    C, L, T, H = config.n_embd, config.n_layer, config.n_ctx, config.n_head
    weights = sum(math.prod(shape) for shape in expected_shapes(config).values())
    states = 16 * weights // (world if s.fsdp else 1) + (4 * weights if world > 1 and not s.fsdp else 0)
    per_value = 2 if compute in (torch.bfloat16, torch.float16) else 4
    layers = (L * C + 17 * C) if s.checkpoint_activations else L * 17 * C
    per_token = layers * per_value + 16 * config.n_vocab
    if s.dropout > 0 and device.type != "cuda":
        per_token += L * H * T * 16
    return TrainingMemory(states, s.batch_size * T * per_token)


def check_training_memory(
    config: GPT2Config, s: TrainSettings, procs: distributed.Processes, compute: torch.dtype
) -> None:
    """Refuse, before anything is allocated, a run the device cannot hold (a warning if it may not)."""
    needed = training_memory(config, s, procs.device, compute, procs.world)
    states, activations = needed.states, needed.activations
    sharing = procs.sharing_memory  # on the CPU, the processes of this machine: each needs as much
    each = f" in each of the {sharing} processes on this machine" if sharing > 1 else ""
    hint = (
        f"lower batch_size (or block_size): a micro-batch of {s.batch_size:,} windows of {config.n_ctx:,} tokens "
        f"keeps about {format_bytes(activations)} of activations{each}, "
        f"{format_bytes(activations / s.batch_size)} a window, "
        f"beside {format_bytes(states)} for the weights, their gradients and AdamW's moments"
    )
    check_fits(needed.total * sharing, procs.device, "training", hint, "batch_size", ("block_size",))


class TaskEvaluation:
    """The benchmark a run scores at each evaluation (eval_task: HellaSwag, as llm.c and
    build-nanogpt score it while GPT-2 trains), with `gpt2 eval --task`'s scoring. Its examples
    are read and tokenized once, before the run starts: a file that is missing or not the
    task's, or data whose tokenizer cannot read them, stops the run before its first iteration."""

    def __init__(self, s: TrainSettings, data: TokenData, progress: bool):
        self.name = s.eval_task
        check_task_tokenizer(s.eval_task, data)
        path = task_file(s.eval_task, s.eval_task_data, progress, param="eval_task_data")
        try:
            self.examples = read_hellaswag(path, s.eval_task_limit)
        except DataError as e:  # the file is the eval_task_data setting's (or its download's)
            raise DataError(str(e), "eval_task_data") from None
        self.pairs, _ = hellaswag_pairs(data.tokenizer, self.examples)  # (context ids, ending ids), 4 an example

    def batches(self, n_ctx: int, ids: int) -> list[list[int]]:
        """The pairs' indices in batches of at most `ids` positions, padding included, longest
        first (a training micro-batch's: scoring, without gradients, fits wherever training does)."""
        length = [min(len(c) + len(x), n_ctx + 1) - 1 for c, x in self.pairs]  # positions in the forward pass
        batches, batch = [], []
        for i in sorted(range(len(self.pairs)), key=lambda i: -length[i]):
            if batch and (len(batch) + 1) * length[batch[0]] > ids:
                batches.append(batch)
                batch = []
            batch.append(i)
        return batches + [batch]


def check_task_tokenizer(task: str, data: TokenData) -> None:
    """Refuse a task the data's tokenizer cannot write: HellaSwag's text is any English, which a
    byte-level BPE tokenizer (GPT-2's, or a bpe:N one) encodes whole and a character vocabulary,
    which knows only its corpus's characters, does not."""
    if isinstance(data.tokenizer, Tokenizer):
        return
    has = (
        f"a character-level one ({data.tokenizer.n_vocab} characters), which knows only its corpus's characters"
        if isinstance(data.tokenizer, CharTokenizer)
        else "none of its own"
    )
    raise InvalidArgumentError(
        f"eval_task {task} needs a BPE tokenizer that writes any text (GPT-2's, as llm.c scores it), but the "
        f"data in {data.directory} has {has}: train on data prepared with tokenizer gpt2, or drop eval_task",
        "eval_task",
    )
