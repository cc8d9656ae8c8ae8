"""CUDA graphs for decoding (`DecodeGraphs`): a decoding step captured once per bucket of rows and replayed, its
inputs written into fixed buffers.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from gpt2.errors import GPT2Warning
from gpt2.generation.caches import KVCache, Model


@dataclass
class FixedStep:
    """One batch-size bucket's decoding step: the device tensors it reads and writes, and its graph."""

    tokens: torch.Tensor  # (B,) each row's newest token
    positions: torch.Tensor  # (B, 1) where each row's token goes
    logits: torch.Tensor | None = None  # (B, V) what the step computed
    graph: torch.cuda.CUDAGraph | None = None


class CUDAGraphWarning(GPT2Warning, RuntimeWarning):
    """Capturing decoding as CUDA graphs failed: decoding goes on without them."""


class DecodeGraphs:
    """Decoding steps replayed as CUDA graphs: a step's few hundred kernel launches, recorded
    once per batch-size bucket, cost one launch from Python (issue 12: at batch 1 on an H100,
    launches, not memory, set the speed).

    A graph replays fixed shapes over fixed memory, so a step reads its tokens and positions
    from device tensors filled before each replay, writes each row's key and value at its own
    position, and attends over the whole preallocated cache through a mask built from those
    positions (`KVCache.begin_fixed_decode`). B rows run in the bucket of the next power of
    two (at most the cache's slots); padding rows decode token 0 into the first free position
    of the slots past B (where rows may be filling: what they hold stays). A bucket is captured at its
    first step, after two warm-up runs of that very step (writing the same keys and values again changes nothing); where
    capture fails, decoding goes on without graphs, with a warning. Off the GPU the same
    fixed steps run without capture: slower than plain decoding, a check of this path.
    """

    def __init__(self, model: Model, cache: KVCache):
        self.model, self.cache = model, cache
        self.capture = cache.device.type == "cuda"
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None  # one memory pool for every bucket
        self.steps: dict[int, FixedStep] = {}

    def decode(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        """Logits (B, V) after each row's newest token, at its position."""
        B, slots = len(tokens), len(self.cache.lengths)
        size = min(1 << (B - 1).bit_length(), slots)
        step = self.steps.get(size)
        if step is None:
            device = self.cache.device
            step = self.steps[size] = FixedStep(
                torch.zeros(size, dtype=torch.long, device=device),
                torch.zeros(size, 1, dtype=torch.long, device=device),
            )
        # padding rows write past what their slots hold (a row filling there keeps its keys)
        spare = [min(self.cache.lengths[b], self.cache.max_len - 1) for b in range(B, size)]
        step.tokens.copy_(torch.tensor(tokens + [0] * (size - B)))
        step.positions.copy_(torch.tensor(positions + spare)[:, None])
        if step.graph is None and self.capture:
            self._capture(step)
        if step.graph is not None:
            step.graph.replay()
        else:
            step.logits = self._run(step)
        return step.logits[:B].clone()  # the graph's output is overwritten by the next replay

    def _run(self, step: FixedStep) -> torch.Tensor:
        self.cache.begin_fixed_decode(step.positions)
        return self.model.unembed(self.model.trunk(step.tokens[:, None], self.cache)[:, -1])  # (B, V)

    def _capture(self, step: FixedStep) -> None:
        try:
            side = torch.cuda.Stream()  # warm-up off the default stream, as torch.cuda.graphs asks
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._run(step)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                step.logits = self._run(step)
            step.graph = graph
        except RuntimeError as e:
            warnings.warn(f"CUDA graph capture failed, decoding without graphs: {e}", CUDAGraphWarning, stacklevel=2)
            self.capture = False
