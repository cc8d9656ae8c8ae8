"""gpt2.data.batches: get_batch's windows, drawn from a seed, the targets a mask leaves out, and whole rows of data
made of rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from data_helpers import chat_splits

from gpt2 import DataError, InvalidArgumentError
from gpt2.data.batches import get_batch


def test_batches_are_windows_and_their_next_ids():
    ids = np.arange(1000, dtype=np.uint16)
    x, y = get_batch(ids, 8, 5, seed=1, iteration=3, micro_step=2)
    assert x.shape == y.shape == (5, 8) and x.dtype == torch.int64
    assert (y == x + 1).all() and (x[:, 1:] == x[:, :-1] + 1).all()
    assert int(x.max()) < 1000 - 1 and int(y.max()) <= 999


def test_batches_depend_only_on_seed_iteration_and_micro_step():
    ids = np.arange(10_000, dtype=np.uint16)
    first = get_batch(ids, 16, 4, seed=7, iteration=10, micro_step=1)[0]
    for other in [(7, 11, 1), (7, 10, 0), (8, 10, 1)]:
        get_batch(ids, 16, 4, seed=other[0], iteration=other[1], micro_step=other[2])  # draws in between change nothing
        assert not torch.equal(get_batch(ids, 16, 4, seed=other[0], iteration=other[1], micro_step=other[2])[0], first)
    assert torch.equal(get_batch(ids, 16, 4, seed=7, iteration=10, micro_step=1)[0], first)
    assert get_batch(ids, 16, 4, seed=7, iteration=0, micro_step=2**32 + 5)[0].shape == (4, 16)


def test_batch_offsets_are_the_seeded_draw():
    ids = np.arange(5000, dtype=np.uint16)
    for seed, iteration, micro_step in [(0, 0, 0), (1337, 12, 3), (5, 7, 2**32 + 9)]:
        offsets = np.random.default_rng([seed, iteration, micro_step]).integers(0, 5000 - 32, size=6)
        x, y = get_batch(ids, 32, 6, seed=seed, iteration=iteration, micro_step=micro_step)
        assert x[:, 0].tolist() == offsets.tolist() and y[:, -1].tolist() == (offsets + 32).tolist()


@pytest.mark.parametrize(
    "args, error, message",
    [
        (dict(block_size=0), InvalidArgumentError, "block_size must be a positive integer, got 0"),
        (dict(batch_size=1.0), InvalidArgumentError, "batch_size must be a positive integer, got 1.0"),
        (dict(seed=-1), InvalidArgumentError, "seed must be a whole number from 0 to"),
        (dict(micro_step=True), InvalidArgumentError, "micro_step must be a whole number from 0 to .*got True"),
        (dict(block_size=10), DataError, "10 ids are too short for block_size 10: a window needs 11"),
        (
            dict(mask=np.ones(9, dtype=np.uint8)),
            InvalidArgumentError,
            "mask holds 9 bytes for 10 ids: it needs one for each id",
        ),
        (dict(row=1), InvalidArgumentError, "row must be a whole number from 2 up, got 1"),
        (dict(row=5.0), InvalidArgumentError, "row must be a whole number from 2 up, got 5.0"),
        (dict(row=3), InvalidArgumentError, "10 ids are not a whole number of rows of 3 ids"),
        (dict(row=5, block_size=5), DataError, "rows of 5 ids are too short for block_size 5: a window needs 6"),
    ],
)
def test_bad_batch_arguments(args, error, message):
    with pytest.raises(error, match=message):
        get_batch(
            np.arange(10, dtype=np.uint16),
            **{"block_size": 4, "batch_size": 2, "seed": 0, "iteration": 0, "micro_step": 0, **args},
        )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_batches_on_cuda_equal_those_on_the_cpu():
    ids = np.arange(4096, dtype=np.uint16)
    x, y = get_batch(ids, 64, 8, seed=3, iteration=5, micro_step=1, device="cuda")
    x_cpu, y_cpu = get_batch(ids, 64, 8, seed=3, iteration=5, micro_step=1)
    assert x.is_cuda and y.is_cuda and torch.equal(x.cpu(), x_cpu) and torch.equal(y.cpu(), y_cpu)


def test_batches_with_a_mask_ignore_the_targets_it_does_not_mark():
    ids, masks = chat_splits(5000)
    ids, mask = ids["train"].astype(np.uint16), masks["train"].astype(np.uint8)
    for seed, iteration, micro_step in [(0, 0, 0), (1337, 12, 3)]:
        x, y = get_batch(ids, 32, 6, seed=seed, iteration=iteration, micro_step=micro_step)
        mx, my = get_batch(ids, 32, 6, seed=seed, iteration=iteration, micro_step=micro_step, mask=mask)
        assert torch.equal(mx, x)  # the same windows
        marked = torch.from_numpy(mask[y.numpy()] == 1)  # an id here is its own position: y's own byte of the mask
        assert torch.equal(my[marked], y[marked]) and (my[~marked] == -100).all()
        assert 0 < int(marked.sum()) < marked.numel()


def test_batches_of_rows_are_whole_rows_at_the_seeded_draw():
    """ids of 300 rows of 13 (row r: 13 r, 13 r + 1, ...): each window is the start of a row, the rows drawn by the
    seeded generator (one integer below the number of rows each); a shorter block_size takes a row's first ids."""
    ids, row = np.arange(300 * 13, dtype=np.uint16), 13
    for seed, iteration, micro_step in [(0, 0, 0), (1337, 12, 3), (5, 7, 2**32 + 9)]:
        picked = np.random.default_rng([seed, iteration, micro_step]).integers(0, 300, size=6)
        for block_size in (12, 8):
            x, y = get_batch(ids, block_size, 6, seed=seed, iteration=iteration, micro_step=micro_step, row=row)
            starts = torch.from_numpy(picked * row)[:, None]
            assert torch.equal(x, starts + torch.arange(block_size)) and torch.equal(y, x + 1)


def test_batches_of_rows_with_a_mask_score_the_ids_it_marks():
    ids, row = np.arange(40 * 13, dtype=np.uint16), 13
    mask = np.random.default_rng(0).integers(0, 2, len(ids)).astype(np.uint8)
    x, y = get_batch(ids, 12, 8, seed=3, iteration=1, micro_step=0, mask=mask, row=row)
    plain = get_batch(ids, 12, 8, seed=3, iteration=1, micro_step=0, row=row)[1]
    marked = torch.from_numpy(mask[plain.numpy()] == 1)  # an id here is its own position
    assert torch.equal(x % row, torch.arange(12).expand(8, 12))  # rows' starts
    assert torch.equal(y[marked], plain[marked]) and (y[~marked] == -100).all() and 0 < int(marked.sum()) < 96
