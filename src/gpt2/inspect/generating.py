"""Activations while generating: one trace of a generation, the prompt and every new token.

    t = gpt2.inspect.trace_generation(model, "The dog chased the", 10, temperature=0)
    t.new_ids                                # the 10 tokens generated
    t.activations["h.1.mlp.c_proj"]          # (T_prompt + 10, C): every position's, prompt and new
    t.activations["h.1.attn.pattern"]        # (H, T, T): complete, as one pass over the whole text gives it

The generation is `GPT2.generate`'s: the same checks, the same token loop
(`gpt2.generation.decoding.run`), the same sampling and seeds, with a KV cache: the prompt's
forward pass once, then one position a step. Only the engine differs: each of its steps is the
traced pass (`tracing.forward_steps` over the cache), whose steps are recorded, and patched where
`patch` says so, at every step. The last token generated is run through once more, so that it too
has its activations (and the logits after it), as one trace of the whole text has.

A step's activations are those of its positions: (T_prompt, ...) for the prompt, then (1, ...)
for each new token, joined along the positions. A query's scores and pattern see the keys up to
its own position; the keys after it, which it cannot see, are filled as one pass over the whole
text fills them (-inf in the scores, 0 in the pattern), so each comes out (H, T, T), whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from gpt2._checks import boolean
from gpt2.generation.caches import KVCache
from gpt2.generation.decoding import Request, run
from gpt2.generation.sampling import Sampling
from gpt2.inspect.tracing import Patch, Recorder, Trace, forward_steps, recorder, token_ids
from gpt2.model.model import GPT2

# the steps of shape (H, T, S) whose keys past a query's position are filled, and with what
FILL = {"attn.scores": float("-inf"), "attn.pattern": 0.0}


@dataclass
class GenerationTrace(Trace):
    """A `Trace` of a prompt and the tokens generated after it: `ids` the whole text's,
    `prompt_length` how many of them are the prompt's."""

    prompt_length: int = 0

    @property
    def new_ids(self) -> list[int]:
        """The tokens generated."""
        return self.ids[self.prompt_length :]


@torch.no_grad()
def trace_generation(
    model: GPT2,
    prompt: str | Sequence[int] | torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    *,
    eos_token_id: int | None = None,
    patch: Mapping[str, Patch] | None = None,
    names: Iterable[str] | None = None,
    prepend_bos: bool = False,
) -> GenerationTrace:
    """Continue `prompt` by max_new_tokens tokens, as `model.generate` does, and trace every
    position of the text: returns a GenerationTrace of T = T_prompt + new positions.

    prompt: a string the model's tokenizer encodes, or 1-D token ids. temperature (0: greedy),
    top_k, top_p, seed and eos_token_id as `GPT2.generate` takes them: with a seed, the tokens
    are those `model.generate(prompt[None], ..., seed=seed)` gives (up to a draw that falls within
    float rounding of the traced pass's logits from the fused one's). Generation stops early at
    eos_token_id. The prompt and the new tokens must fit the context: nothing slides out of it.
    patch, names and prepend_bos as `trace` takes them; a patch applies at every step, to that step's
    positions: (T_prompt, ...) first, then (1, ...) for each new token (a steering vector, an
    ablation), and the tokens generated follow from it.
    """
    tap = recorder(model, patch, names, "trace_generation")
    ids, _ = token_ids(model, prompt, boolean("prepend_bos", prepend_bos))
    request = Request.build(
        [ids],
        max_new_tokens,
        n_vocab=model.config.n_vocab,
        n_ctx=model.config.n_ctx,
        sampling=Sampling(temperature, top_k, top_p),
        seed=seed,
        eos_token_id=eos_token_id,
        on_overflow="error",
    )
    engine = TracedEngine(model, len(ids) + max_new_tokens, tap)
    (row,) = request.rows()
    run(engine, [row])
    engine.decode(torch.tensor(row.tokens[-1:]))  # the last token's own activations, as the rest have
    text, tokens = token_ids(model, ids + row.tokens)
    return GenerationTrace(text, tokens, torch.cat(engine.logits), engine.activations(), model, prompt_length=len(ids))


class TracedEngine:
    """An engine of one row (a `gpt2.generation.decoding.Engine`) whose every step is the traced
    pass over its KV cache: `steps` holds each step's activations, `logits` each step's (T_step, V).
    The token loop gives it one prompt, whole (no token budget, no prefix cache), then one token a
    step."""

    slots = 1
    block_size = None  # no prefix cache

    def __init__(self, model: GPT2, max_len: int, tap: Recorder):
        self.model, self.tap = model, tap
        self.cache = KVCache.for_model(model, 1, max_len)
        self.max_len = self.cache.max_len
        self.steps: list[dict[str, torch.Tensor]] = []
        self.logits: list[torch.Tensor] = []

    def extend(
        self,
        slots: Sequence[int],
        starts: Sequence[int],
        chunks: Sequence[Sequence[int]],
        every_position: Sequence[bool] | None = None,
    ) -> list[torch.Tensor]:
        (chunk,) = chunks  # the whole prompt into slot 0
        self.cache.begin_prefill(0, len(chunk))
        return [self._step(torch.tensor([list(chunk)]))[-1]]

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        self.cache.begin_decode(1)
        return self._step(tokens[:, None])[-1:]  # (1, V)

    def _step(self, idx: torch.Tensor) -> torch.Tensor:
        """The traced pass over idx (1, T), the new positions; their logits (T, V)."""
        tap = Recorder(self.tap.record, self.tap.patch)
        logits = forward_steps(self.model, idx.to(self.model.device), tap, self.cache)[0]
        self.steps.append(tap.activations)
        self.logits.append(logits)
        return logits

    def activations(self) -> dict[str, torch.Tensor]:
        """Every step's activations joined along the positions (per-head steps: their dim 1),
        each query's scores and pattern filled out to the whole text's keys (`FILL`)."""
        T = sum(len(logits) for logits in self.logits)
        joined = {}
        for name in self.steps[0]:
            parts, step = [s[name] for s in self.steps], name.split(".", 2)[-1]
            if step in FILL:  # (H, T_step, S_step) -> (H, T_step, T)
                parts = [F.pad(p, (0, T - p.size(-1)), value=FILL[step]) for p in parts]
            joined[name] = torch.cat(parts, dim=1 if parts[0].dim() == 3 else 0)
        return joined

    def reuse(self, slot: int, tokens: Sequence[int]) -> int:
        return 0  # no prefix cache: every prompt is computed

    def remember(self, slot: int, tokens: Sequence[int]) -> None:
        pass

    def cached_logits(self, slot: int, n: int) -> torch.Tensor:
        raise NotImplementedError("a traced engine keeps no blocks (reuse always gives 0)")

    def move(self, src: int, dst: int) -> None:
        raise NotImplementedError("a traced engine holds one row: it never moves")
