"""How well a model predicts text: the loss, perplexity and bits per byte of a text, and the
zero-shot benchmarks people compare GPT-2 checkpoints by (LAMBADA, HellaSwag, WikiText-2).

Everything here is one computation, the log-probability of chosen ids given what precedes them:

    h = trunk(idx)                    # (B, T, C): final hidden states
    h = h[targets != IGNORE]          # (M, C): only the positions whose next id is scored
    log p = log_softmax(h @ wte.T)    # (M, V), in float32, a chunk of rows at a time
    sum of log p[target]              # accumulated in float64

Perplexity of a text longer than the context slides a window over its ids (Hugging Face's
recipe, "Perplexity of fixed-length models"): windows ids[b : b + N] for b = 0, S, 2S, ...,
the last one ending at the last id; each scores the ids after the previous window's end,
predicted from every earlier id of its own window. Training's evaluation runs the same code.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F
from tqdm.auto import tqdm

from gpt2._checks import check_batch_size, check_token_ids, int_between
from gpt2._files import read_text
from gpt2.data.batches import IGNORE
from gpt2.data.corpora import Shards
from gpt2.data.files import TokenData, open_data
from gpt2.errors import DataError, InvalidArgumentError
from gpt2.evaluation.tasks import (
    Choice,
    Completion,
    check_limit,
    check_task,
    read_hellaswag,
    read_lambada,
    read_wikitext,
    task_file,
)
from gpt2.generation.caches import PrefixCache, check_prefix_cache_mb
from gpt2.generation.engines import TorchEngine
from gpt2.model.model import GPT2
from gpt2.tokenizer import CharTokenizer, Tokenizer

# float32 logits are made a chunk of rows at a time, under 32 MB: glibc's malloc serves blocks
# below that from memory it reuses, where a larger block is mapped afresh, and its pages
# faulted in, for every chunk (166 rows at GPT-2's vocabulary; measured in benchmarks/RESULTS.md)
LOGIT_BYTES = 32 << 20
DEFAULT_BATCH_SIZE = 8
DEFAULT_PREFIX_CACHE_MB = 256  # contexts' KV blocks kept while scoring continuations


# ------------------------------------------------------------------ the one computation


def target_log_probs(
    model: GPT2, idx: torch.Tensor, targets: torch.Tensor, *, greedy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(targets[b, t] | idx[b, :t + 1]) wherever targets is not IGNORE, row by row: (M,) float32.

    idx, targets: (B, T) on the model's device. Logits are computed only where a target is
    scored. With `greedy`, also (M,) bools: whether each target is the most likely id there.
    Runs the model as it is (call model.eval() for inference) and under the caller's autocast.
    """
    keep = targets != IGNORE  # (B, T)
    return scored_log_probs(model, model.trunk(idx)[keep], targets[keep], greedy=greedy)


def scored_log_probs(
    model: GPT2, hidden: torch.Tensor, chosen: torch.Tensor, *, greedy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(chosen[m]) under the logits of hidden states (M, C): (M,) float32, and with
    `greedy` (M,) bools, whether each is the most likely id there."""
    log_probs, argmax = [], []
    rows = max(1, LOGIT_BYTES // (4 * model.config.n_vocab))
    for start in range(0, chosen.numel(), rows):
        logits = model.unembed(hidden[start : start + rows]).float()  # (m, V)
        y = chosen[start : start + rows]
        log_probs.append(-F.cross_entropy(logits, y, reduction="none"))
        if greedy:
            argmax.append(logits.argmax(dim=-1) == y)
    empty = hidden.new_zeros(0, dtype=torch.float32)
    return (torch.cat(log_probs) if log_probs else empty), (torch.cat(argmax) if greedy and argmax else None)


def loss_sum(model: GPT2, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The summed cross-entropy of the scored targets (a float64 tensor, left on the device) and their number."""
    log_probs, _ = target_log_probs(model, idx, targets)
    return -log_probs.double().sum(), log_probs.numel()


@contextlib.contextmanager
def _inference(model: GPT2) -> Iterator[None]:
    """Eval mode (no dropout) and no autograd, and the model's mode back afterwards."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was_training)


# ------------------------------------------------------------------ perplexity of a text


@dataclass(frozen=True)
class Window:
    """ids[begin:end] go in; ids[score_from:end] are scored (begin < score_from <= end)."""

    begin: int
    end: int
    score_from: int


def sliding_windows(n_ids: int, context: int, stride: int) -> list[Window]:
    """Hugging Face's windows over n_ids ids: begin = 0, S, 2S, ... until one ends at the last id.

    A window scores from the previous window's end (the first from 1: the first id has no
    context); with stride = context, each window's first id is not scored. Windows that would
    score nothing are left out."""
    windows, begin, previous_end = [], 0, 0
    while True:
        end = min(begin + context, n_ids)
        score_from = max(previous_end, begin + 1)
        if score_from < end:
            windows.append(Window(begin, end, score_from))
        if end == n_ids:
            return windows
        begin, previous_end = begin + stride, end


@dataclass(frozen=True)
class Perplexity:
    """tokens: ids scored; loss: their mean cross-entropy in nats; perplexity = exp(loss);
    bits_per_byte = total loss / ln 2 / the UTF-8 bytes of the scored ids (None without a tokenizer)."""

    tokens: int
    loss: float
    perplexity: float
    bits_per_byte: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def token_byte_lengths(tokenizer: Tokenizer | CharTokenizer) -> np.ndarray:
    """(n_vocab,) the UTF-8 bytes each id stands for; special tokens (<|endoftext|>) stand for none."""
    special = set(tokenizer.special_tokens.values())
    return np.array(
        [0 if i in special else len(tokenizer.decode_bytes([i])) for i in range(tokenizer.n_vocab)], dtype=np.int64
    )


def check_window(model: GPT2 | None, context: int | None, stride: int | None) -> tuple[int, int]:
    """The context (default: the model's) and stride (default: half the context) of the windows.
    With no model (a front door's flags, checked before one loads), what does not need its n_ctx."""
    n_ctx = None if model is None else model.config.n_ctx
    if context is not None:
        bound = "" if n_ctx is None else f" up to the model's n_ctx={n_ctx}, i.e."
        context = int_between("context", context, 2, n_ctx, f"a number of ids{bound}")
    context = n_ctx if context is None else context
    if stride is not None:
        bound = "" if context is None else f" up to the context ({context}), i.e."
        stride = int_between("stride", stride, 1, context, f"a number of ids{bound}")
    elif context is not None:
        stride = max(1, context // 2)
    return context, stride


def perplexity(
    model: GPT2,
    ids: Sequence[int] | np.ndarray | Shards,
    *,
    context: int | None = None,
    stride: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    tokenizer: Tokenizer | CharTokenizer | None = None,
    progress: bool = False,
) -> Perplexity:
    """The loss of the model on `ids`, one stream, with sliding windows of `context` ids moved
    by `stride` (defaults: the model's context, and half of it), `batch_size` windows at a time.
    `tokenizer` (the ids' own) gives bits per byte."""
    context, stride = check_window(model, context, stride)
    batch_size = check_batch_size(batch_size)
    ids = ids if isinstance(ids, Shards) else np.asarray(ids)  # shards are read a window at a time, never copied whole
    if ids.ndim != 1 or len(ids) < 2:
        raise InvalidArgumentError(
            f"perplexity needs a stream of at least 2 ids (one to predict from, one to score), "
            f"got {len(ids) if ids.ndim == 1 else list(ids.shape)}"
        )
    check_token_ids(int(ids.min()), int(ids.max()), model.config.n_vocab, whose="this model's ")
    windows = sliding_windows(len(ids), context, stride)
    byte_lengths = None if tokenizer is None else token_byte_lengths(tokenizer)
    total, scored, n_bytes = torch.zeros((), dtype=torch.float64, device=model.device), 0, 0
    with (
        _inference(model),
        tqdm(
            total=sum(w.end - w.score_from for w in windows),
            unit="tok",
            unit_scale=True,
            desc="perplexity",
            disable=not progress,
            dynamic_ncols=True,
        ) as bar,
    ):
        for first in range(0, len(windows), batch_size):
            batch = windows[first : first + batch_size]
            idx, targets = _window_batch(ids, batch, model.device)
            loss, count = loss_sum(model, idx, targets)
            total += loss
            scored += count
            if byte_lengths is not None:
                n_bytes += sum(int(byte_lengths[ids[w.score_from : w.end]].sum()) for w in batch)
            bar.update(count)
    loss = float(total) / scored
    bits_per_byte = None if byte_lengths is None or n_bytes == 0 else float(total) / math.log(2) / n_bytes
    return Perplexity(scored, loss, math.exp(loss), bits_per_byte)


def _window_batch(
    ids: np.ndarray, windows: Sequence[Window], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """idx, targets: (B, T) with T the longest window less one; a window's ids go in (the last
    one only as a target), its scored ids are targets, and shorter windows are padded on the right
    (causal attention never looks right, so the padding changes nothing before it)."""
    T = max(w.end - w.begin for w in windows) - 1
    idx = np.zeros((len(windows), T), dtype=np.int64)
    targets = np.full((len(windows), T), IGNORE, dtype=np.int64)
    for row, w in enumerate(windows):
        idx[row, : w.end - w.begin - 1] = ids[w.begin : w.end - 1]
        targets[row, w.score_from - w.begin - 1 : w.end - w.begin - 1] = ids[w.score_from : w.end]
    return torch.from_numpy(idx).to(device), torch.from_numpy(targets).to(device)


def evaluate_text(
    model: GPT2, text: str, tokenizer: Tokenizer | CharTokenizer | None = None, **options: Any
) -> Perplexity:
    """Perplexity of a text, tokenized as one stream with `tokenizer` (default: the model's own).
    options: those of `perplexity`."""
    return _text_perplexity(model, text, tokenizer, "the text", options)


def evaluate_file(
    model: GPT2, path: str | os.PathLike, tokenizer: Tokenizer | CharTokenizer | None = None, **options: Any
) -> Perplexity:
    """Perplexity of a UTF-8 text file (see `evaluate_text`)."""
    path = Path(path)
    text = read_text(path, DataError)
    if not text:
        raise DataError(f"{path} is empty: there is nothing to evaluate")
    return _text_perplexity(model, text, tokenizer, str(path), options)


def _text_perplexity(
    model: GPT2, text: str, tokenizer: Tokenizer | CharTokenizer | None, what: str, options: dict[str, Any]
) -> Perplexity:
    tokenizer = _model_tokenizer(model, tokenizer)
    ids = tokenizer.encode_ordinary(text)  # <|endoftext|> in the text is its characters
    if len(ids) < 2:
        raise DataError(f"{what} is {len(ids)} id{'s' if len(ids) != 1 else ''} long: perplexity needs at least 2")
    return perplexity(model, ids, tokenizer=tokenizer, **options)


@dataclass(frozen=True)
class Agreement:
    """How closely a model's next-token distributions follow a reference's, as llama.cpp reports
    its quantisations: the mean KL divergence KL(reference || model) per token, in nats, and the
    share of positions where both rank the same token first."""

    kl: float
    top1: float
    tokens: int


@torch.inference_mode()
def agreement(reference: GPT2, model: GPT2, ids: Sequence[int] | np.ndarray, context: int | None = None) -> Agreement:
    """Agreement of `model` with `reference` (the same model in float32, say) on every position of
    `ids`, cut into windows of `context` ids (default: the model's context), each scored once."""
    context = check_window(reference, context, None)[0]
    ids = torch.as_tensor(np.asarray(ids, dtype=np.int64))
    kl, same, count = 0.0, 0, 0
    for start in range(0, len(ids) - 1, context):
        window = ids[start : start + context][None]  # (1, T)
        p = torch.log_softmax(reference(window.to(reference.device)).double(), dim=-1)[0]  # (T, V)
        q = torch.log_softmax(model(window.to(model.device)).double(), dim=-1)[0]
        kl += float((p.exp() * (p - q.to(p.device))).sum())
        same += int((p.argmax(-1) == q.argmax(-1).to(p.device)).sum())
        count += window.size(1)
    return Agreement(kl / count, same / count, count)


def evaluate_data(
    model: GPT2, directory: str | os.PathLike | TokenData, split: str = "val", **options: Any
) -> Perplexity:
    """Perplexity of a prepared directory's split (val.bin, or the val shards, by default), its ids one
    stream; `directory` may be the directory already opened (`open_data`, whose check reads every id)."""
    if split not in ("train", "val"):
        raise InvalidArgumentError(f"split must be 'train' or 'val', got {split!r}")
    data = directory if isinstance(directory, TokenData) else open_data(directory)
    data.check_vocabulary(model.tokenizer, model.config.n_vocab, "evaluated")
    ids = getattr(data, split)
    if len(ids) < 2:
        raise DataError(f"{data.files[split]} holds {len(ids)} id(s): perplexity needs at least 2")
    return perplexity(model, ids, tokenizer=data.tokenizer, **options)


def _model_tokenizer(model: GPT2, tokenizer: Tokenizer | CharTokenizer | None) -> Tokenizer | CharTokenizer:
    tokenizer = model.tokenizer if tokenizer is None else tokenizer
    if tokenizer is None:
        raise InvalidArgumentError(
            f"the model comes with no tokenizer and its vocabulary of {model.config.n_vocab} ids is "
            f"not GPT-2's: pass the tokenizer its ids come from"
        )
    if tokenizer.n_vocab > model.config.n_vocab:
        raise InvalidArgumentError(
            f"the tokenizer has {tokenizer.n_vocab} ids, more than the model's {model.config.n_vocab}"
        )
    return tokenizer


# ------------------------------------------------------------------ continuations: LAMBADA, HellaSwag


@dataclass(frozen=True)
class Score:
    """A continuation's summed log-probability given its context, its length in ids, and
    whether each of its ids was the model's most likely one."""

    log_prob: float
    n_ids: int
    greedy: bool


def score_continuations(
    model: GPT2,
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = False,
    desc: str = "scoring",
    example_of: Sequence[int] | None = None,
    prefix_cache_mb: int = DEFAULT_PREFIX_CACHE_MB,
) -> list[Score]:
    """Score each (context ids, continuation ids): the continuation's log-probability given the
    context. A pair longer than the model's context keeps its last n_ctx ids (lm-evaluation-harness
    does the same). Pairs run `batch_size` at a time, those of one context together, each
    context's KV blocks kept (`gpt2.generation.caches.PrefixCache`, up to `prefix_cache_mb`, least recently
    used out first), so that its other continuations (HellaSwag's four endings) compute only
    what follows them. With prefix_cache_mb 0, pairs run longest first, padded on the right.
    The progress bar counts examples, each done once all its pairs are: `example_of[i]` is pair
    i's example (default: each pair is one)."""
    batch_size = check_batch_size(batch_size)
    prefix_cache_mb = check_prefix_cache_mb(prefix_cache_mb)
    n_ctx = model.config.n_ctx
    for i, (context, continuation) in enumerate(pairs):
        if not context or not continuation:
            raise InvalidArgumentError(f"pair {i}: a context and a continuation of at least one id each are needed")
        check_token_ids(
            min(min(context), min(continuation)),
            max(max(context), max(continuation)),
            model.config.n_vocab,
            f" in pair {i}",
            "this model's ",
        )
    if prefix_cache_mb:  # one context's pairs together; longest first
        order = sorted(range(len(pairs)), key=lambda i: (-len(pairs[i][0]), tuple(pairs[i][0]), -len(pairs[i][1])))
        longest = min(max(len(c) + len(x) for c, x in pairs) - 1, n_ctx)
        kept = PrefixCache(model.config, prefix_cache_mb << 20, dtype=model.compute_dtype, device=model.device)
        engine = model.engine(batch_size, longest, prefix_cache=kept, hint="a smaller batch_size", param="batch_size")
    else:
        order = sorted(range(len(pairs)), key=lambda i: -(len(pairs[i][0]) + len(pairs[i][1])))
    scores: list[Score | None] = [None] * len(pairs)
    unscored = Counter(range(len(pairs)) if example_of is None else example_of)  # example -> its pairs not yet scored
    with (
        _inference(model),
        tqdm(total=len(unscored), desc=desc, unit="example", disable=not progress, dynamic_ncols=True) as bar,
    ):
        for first in range(0, len(order), batch_size):
            rows = order[first : first + batch_size]
            # at most n_ctx + 1 ids of each: n_ctx in, the last n scored
            windows = [(list(pairs[i][0]) + list(pairs[i][1]))[-(n_ctx + 1) :] for i in rows]
            lengths = [min(len(pairs[i][1]), n_ctx) for i in rows]
            if prefix_cache_mb:
                log_probs, greedy = _reusing_log_probs(model, engine, windows, lengths)
            else:
                log_probs, greedy = _padded_log_probs(model, windows, lengths)
            log_probs, greedy = log_probs.double().cpu(), greedy.cpu()
            start = 0
            for i, n in zip(rows, lengths):  # the kept targets come row by row
                scores[i] = Score(float(log_probs[start : start + n].sum()), n, bool(greedy[start : start + n].all()))
                start += n
                example = i if example_of is None else example_of[i]
                unscored[example] -= 1
                bar.update(unscored[example] == 0)
    return scores


def _padded_log_probs(model: GPT2, windows: list[list[int]], lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The log-probabilities of the last lengths[b] ids of each window, and whether each is the
    greedy one, row by row: the windows in one batch padded on the right."""
    T = max(map(len, windows)) - 1
    idx = torch.zeros(len(windows), T, dtype=torch.long)
    targets = torch.full((len(windows), T), IGNORE, dtype=torch.long)
    for row, (window, n) in enumerate(zip(windows, lengths)):
        idx[row, : len(window) - 1] = torch.tensor(window[:-1])
        targets[row, len(window) - 1 - n : len(window) - 1] = torch.tensor(window[-n:])
    return target_log_probs(model, idx.to(model.device), targets.to(model.device), greedy=True)


def _reusing_log_probs(
    model: GPT2, engine: TorchEngine, windows: list[list[int]], lengths: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """As `_padded_log_probs`, each window in its slot of `engine` starting from the kept blocks of
    its context. The first window of each context in the batch goes first, and its context's
    blocks are kept, so that the others (its other continuations) start from them."""
    contexts = [window[: len(window) - n] for window, n in zip(windows, lengths)]  # the ids before the scored ones
    first: dict[tuple[int, ...], int] = {}
    for b, context in enumerate(contexts):
        first.setdefault(tuple(context[: engine.block_size]), b)
    leaders = sorted(first.values())
    hidden: list[torch.Tensor | None] = [None] * len(windows)
    for group in (leaders, [b for b in range(len(windows)) if b not in leaders]):
        if not group:
            continue
        starts = [engine.reuse(b, contexts[b]) for b in group]
        states = engine.hidden(group, starts, [windows[b][s:-1] for b, s in zip(group, starts)])
        for b, start, h in zip(group, starts, states):
            engine.remember(b, contexts[b])
            hidden[b] = h[len(contexts[b]) - 1 - start :]  # (n, C): the positions whose next id is scored
    chosen = torch.tensor([i for window, n in zip(windows, lengths) for i in window[-n:]], device=model.device)
    return scored_log_probs(model, torch.cat(hidden), chosen, greedy=True)


def encode_pair(tokenizer: Tokenizer | CharTokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-evaluation-harness's split of a (context, continuation): the context's trailing spaces
    move to the continuation, and the continuation's ids are those of the whole text after the
    context's own ids (so a merge across the boundary tokenizes as in running text)."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole, head = tokenizer.encode_ordinary(context + continuation), tokenizer.encode_ordinary(context)
    return head, whole[len(head) :]


def lambada(
    model: GPT2,
    examples: Sequence[Completion],
    tokenizer: Tokenizer | CharTokenizer | None = None,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = False,
) -> dict[str, Any]:
    """LAMBADA as lm-evaluation-harness's lambada_openai: acc, the share of examples whose last
    word is the model's greedy continuation, id for id; perplexity, exp(-mean of the last word's
    summed log-probability)."""
    tokenizer = _model_tokenizer(model, tokenizer)
    pairs = [encode_pair(tokenizer, e.context, e.target) for e in examples]
    scores = score_continuations(model, pairs, batch_size=batch_size, progress=progress, desc="lambada")
    mean = sum(s.log_prob for s in scores) / len(scores)
    return {
        "task": "lambada",
        "examples": len(scores),
        "acc": sum(s.greedy for s in scores) / len(scores),
        "perplexity": math.exp(-mean),
    }


def hellaswag(
    model: GPT2,
    examples: Sequence[Choice],
    tokenizer: Tokenizer | CharTokenizer | None = None,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = False,
) -> dict[str, Any]:
    """HellaSwag in llm.c's completion style: each ending, " " + ending, is scored after the
    context's ids; acc picks the ending of least total loss, acc_norm the least loss per id."""
    tokenizer = _model_tokenizer(model, tokenizer)
    pairs, example_of = hellaswag_pairs(tokenizer, examples)
    scores = score_continuations(
        model, pairs, batch_size=batch_size, progress=progress, desc="hellaswag", example_of=example_of
    )
    right, right_norm = hellaswag_right(examples, [s.log_prob for s in scores], [s.n_ids for s in scores])
    return {
        "task": "hellaswag",
        "examples": len(examples),
        "acc": right / len(examples),
        "acc_norm": right_norm / len(examples),
    }


def hellaswag_pairs(
    tokenizer: Tokenizer | CharTokenizer, examples: Sequence[Choice]
) -> tuple[list[tuple[list[int], list[int]]], list[int]]:
    """(context ids, ids of " " + ending) for each ending of each example, example by example,
    and the example each pair is of."""
    pairs, example_of = [], []
    for number, example in enumerate(examples):
        context = tokenizer.encode_ordinary(example.context)
        pairs += [(context, tokenizer.encode_ordinary(" " + ending)) for ending in example.endings]
        example_of += [number] * len(example.endings)
    return pairs, example_of


def hellaswag_right(examples: Sequence[Choice], log_probs: Sequence[float], n_ids: Sequence[int]) -> tuple[int, int]:
    """How many examples' right ending has the greatest log-probability (acc's count) and the
    greatest per id (acc_norm's), given each pair's score (in `hellaswag_pairs`' order)."""
    right = right_norm = start = 0
    for example in examples:
        k = range(start, start + len(example.endings))
        start += len(example.endings)
        # the first of equal scores wins, as torch's argmin in llm.c
        right += max(k, key=lambda i: log_probs[i]) - k.start == example.label
        right_norm += max(k, key=lambda i: log_probs[i] / n_ids[i]) - k.start == example.label
    return right, right_norm


def wikitext2(
    model: GPT2, text: str, tokenizer: Tokenizer | CharTokenizer | None = None, **options: Any
) -> dict[str, Any]:
    """WikiText-2's test text (rows joined with "\\n\\n"), scored as any text (`evaluate_text`)."""
    return {"task": "wikitext2", **evaluate_text(model, text, tokenizer, **options).to_dict()}


def run_task(
    model: GPT2,
    task: str,
    data: str | os.PathLike | None = None,
    *,
    limit: int | None = None,
    context: int | None = None,
    stride: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = False,
) -> dict[str, Any]:
    """Evaluate a task by name on its file (`data`, else the download, cached): the first
    `limit` examples (WikiText-2: rows), or all. context and stride apply to wikitext2."""
    check_task(task)
    limit = check_limit(limit)
    batch_size = check_batch_size(batch_size)
    if task == "wikitext2":
        context, stride = check_window(model, context, stride)
    elif context is not None or stride is not None:
        raise InvalidArgumentError(
            f"context and stride set the windows of a text; {task} scores each example whole",
            "context" if context is not None else "stride",
            ("context", "stride"),
        )
    _model_tokenizer(model, None)
    path = task_file(task, data, progress)
    if task == "lambada":
        return lambada(model, read_lambada(path, limit), batch_size=batch_size, progress=progress)
    if task == "hellaswag":
        return hellaswag(model, read_hellaswag(path, limit), batch_size=batch_size, progress=progress)
    return wikitext2(
        model, read_wikitext(path, limit), context=context, stride=stride, batch_size=batch_size, progress=progress
    )
