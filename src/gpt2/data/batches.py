"""The batches training draws: random windows of the ids (and their targets, masked where the mask says), from a
generator seeded by (seed, iteration, micro-step): the same batches whether a run was resumed or how many processes
share it. Data made of rows (each a sample on its own, TokenData.row) gives whole rows: a window at a row's start,
never the end of one row and the start of the next.
"""

from __future__ import annotations

import numpy as np
import torch

from gpt2._checks import int_between, positive_int
from gpt2.errors import DataError, InvalidArgumentError

IGNORE = -100  # a target that is not scored (PyTorch's and Hugging Face's ignore_index)


def get_batch(
    ids: np.ndarray,
    block_size: int,
    batch_size: int,
    *,
    seed: int,
    iteration: int,
    micro_step: int,
    device: str | torch.device = "cpu",
    mask: np.ndarray | None = None,
    row: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, y: (batch_size, block_size) int64 windows of ids at random offsets, y = x shifted by one;
    with a `mask` (a byte per id, TokenData.masks), y is IGNORE where the mask of y's id is 0. With
    `row` (ids are rows of `row` ids one after another, TokenData.row), the offsets are the starts
    of random rows, and a window the first block_size + 1 ids of its row.

    The offsets come from a generator seeded by (seed, iteration, micro_step), so a batch
    depends on nothing else: not on resumption, not on which process draws it, not on the mask.
    """
    block_size, batch_size = positive_int("block_size", block_size), positive_int("batch_size", batch_size)
    for name, value in (("seed", seed), ("iteration", iteration), ("micro_step", micro_step)):
        int_between(name, value, 0, 2**63 - 1, "a whole number")
    if len(ids) < block_size + 1:
        raise DataError(
            f"{len(ids)} ids are too short for block_size {block_size}: a window needs {block_size + 1}", "block_size"
        )
    if mask is not None and len(mask) != len(ids):
        raise InvalidArgumentError(f"mask holds {len(mask)} bytes for {len(ids)} ids: it needs one for each id", "mask")
    rng = np.random.default_rng([seed, iteration, micro_step])
    if row is None:
        offsets = rng.integers(0, len(ids) - block_size, size=batch_size)
    else:
        offsets = rng.integers(0, _rows(len(ids), block_size, row), size=batch_size) * row  # rows' starts
    windows = torch.from_numpy(np.stack([ids[i : i + block_size + 1] for i in offsets]).astype(np.int64))  # (B, T + 1)
    x, y = windows[:, :-1], windows[:, 1:]
    if mask is not None:
        scored = torch.from_numpy(np.stack([mask[i + 1 : i + block_size + 1] for i in offsets]) != 0)  # (B, T): y's
        y = y.masked_fill(~scored, IGNORE)
    if torch.device(device).type == "cuda":  # pinned, so the copy overlaps the work already queued
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.contiguous().to(device), y.contiguous().to(device)


def _rows(n_ids: int, block_size: int, row: int) -> int:
    """The rows n_ids ids hold; raises unless they are whole rows of `row` ids, each holding a window."""
    row = int_between("row", row, 2, None, "a whole number")
    if n_ids % row:
        raise InvalidArgumentError(f"{n_ids} ids are not a whole number of rows of {row} ids", "row")
    if block_size + 1 > row:
        raise DataError(
            f"rows of {row} ids are too short for block_size {block_size}: a window needs {block_size + 1}",
            "block_size",
        )
    return n_ids // row
