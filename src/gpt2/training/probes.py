"""What a run's model does with one fixed input, recorded as it trains: probes.jsonl beside log.jsonl.

At each probe (every `probe_interval` iterations, by default at each evaluation) the model as it
is then reads the probe: a text (`probe`), or `probe_repeat` random tokens written twice, the
standard test of induction, which any vocabulary can spell. A record is one JSON line:

    {"iter", "ids", "tokens" (None without a tokenizer),
     "head_scores": {"previous_token": [[n_head] x n_layer], "duplicate_token": ..., "induction": ...},
     "attention": [n_layer][n_head][T][T] (4 decimals), "logit_lens": [n_layer + 1][T] {"token", "id", "prob"},
     "sample", "sample_ids"}  (the model's greedy continuation of the probe, SAMPLE_TOKENS long)

so that a person watching (the page's Training view, TensorBoard, W&B) sees heads specialise and
the samples improve. The file is appended a whole line at a time; a resumed run rewrites it cut back
to the iterations before its checkpoint's, atomically, as log.jsonl.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from gpt2._files import atomic_write_text
from gpt2.checkpoints.config import GPT2Config
from gpt2.errors import InvalidArgumentError
from gpt2.inspect.circuits import HEAD_SCORES, pattern_scores, repeated_tokens, score_masks
from gpt2.inspect.tracing import logit_lens_top, trace
from gpt2.model.model import GPT2
from gpt2.settings import TrainSettings
from gpt2.tokenizer import CharTokenizer, Tokenizer
from gpt2.training.loggers import read_log

PROBES = "probes.jsonl"
SAMPLE_TOKENS = 16
DECIMALS = 4  # of the attention probabilities: finer than any picture shows


def probe_ids(s: TrainSettings, config: GPT2Config, tokenizer: Tokenizer | CharTokenizer | None) -> list[int] | None:
    """The run's probe as token ids (None: the run records none): the text `probe` through the
    data's tokenizer, or `probe_repeat` random tokens (seeded by the run's seed) written twice,
    fewer where the context is short. Checked before the run's first iteration."""
    if s.probe is not None:
        if tokenizer is None:
            raise InvalidArgumentError(
                "probe: this run's data has no tokenizer to read a text with; probe_repeat probes with random ids",
                "probe",
                ("probe_repeat",),
            )
        ids = tokenizer.encode_ordinary(s.probe)
        if not 0 < len(ids) <= config.n_ctx:
            raise InvalidArgumentError(
                f"probe must be 1 to {config.n_ctx} tokens (the model's context), got {len(ids)}", "probe"
            )
        if not all(score_masks(ids, kind)[1].any() for kind in HEAD_SCORES):  # a score with no query to average
            raise InvalidArgumentError(
                f"probe {s.probe!r} has no token that repeats: the duplicate and induction scores need one "
                "(e.g. a line written twice)",
                "probe",
            )
        return ids
    if s.probe_repeat == 0:
        return None
    n = max(1, min(s.probe_repeat, (config.n_ctx - SAMPLE_TOKENS) // 2))
    return repeated_tokens(n, config.n_vocab, seed=s.seed)


@torch.no_grad()
def probe_record(model: GPT2, tokenizer: Tokenizer | CharTokenizer | None, ids: list[int], it: int) -> dict[str, Any]:
    """What the model does with `ids` now (call it in eval mode: no dropout); see the module's docstring."""
    n_layer = model.config.n_layer
    patterns = [f"h.{i}.attn.pattern" for i in range(n_layer)]
    looked = trace(model, ids, names=["wte", "wpe", *(f"h.{i}" for i in range(n_layer)), *patterns])
    text = (lambda i: None) if tokenizer is None else (lambda i: tokenizer.decode([i]))  # noqa: E731
    attention = torch.stack([looked.activations[name] for name in patterns]).double()  # (L, H, T, T)
    probs, tops = logit_lens_top(looked)  # (L + 1, T) each
    lens = [
        [{"token": text(i), "id": i, "prob": round(p, 6)} for i, p in zip(row_ids, row_probs)]
        for row_ids, row_probs in zip(tops.tolist(), probs.tolist())
    ]
    scores = {kind: pattern_scores(attention.float().cpu(), ids, kind).tolist() for kind in HEAD_SCORES}  # this pass's
    room = min(SAMPLE_TOKENS, model.config.n_ctx - len(ids))
    new = []
    if room > 0:
        idx = torch.tensor([ids], device=model.device)
        new = model.generate(idx, room, temperature=0.0)[0, len(ids) :].tolist()
    return {
        "iter": it,
        "ids": ids,
        "tokens": None if tokenizer is None else [text(i) for i in ids],
        "head_scores": scores,
        "attention": attention.round(decimals=DECIMALS).cpu().tolist(),
        "logit_lens": lens,
        "sample": None if tokenizer is None else tokenizer.decode(new),
        "sample_ids": new,
    }


def append_probe(out: Path, record: dict[str, Any]) -> None:
    """One record as a line of OUT/probes.jsonl, written whole in one call (a reader never sees half of it
    unless the process dies mid-write; `read_log` skips such a line)."""
    with open(out / PROBES, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def trim_probes(out: Path, iteration: int) -> None:
    """Keep the records of the iterations before `iteration`: a resumed run probes the later ones again."""
    path = out / PROBES
    if path.is_file():
        kept = [r for r in read_log(path) if r["iter"] < iteration]
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))
