"""Synthetic training data: `prepare_synthetic`, rows drawn from a stated distribution and written
as prepared data, with a mask of the targets the loss counts.

"induction" is the data of docs/inspect.md's 2-layer induction model (recipes/induction_2l.toml):
rows of n_ctx + 1 random ids (a window of inputs and their next ids), alternately

- *runs*: random tokens, each written 1 to 4 times in a row ("A A A B C C ...");
- *copies*: random tokens, in which one stretch of 6 to 24 tokens (its length drawn for each row)
  is written twice in a row, at a random place.

The mask marks the ids that copying predicts: id j where the id after the latest earlier
occurrence of id j - 1 is id j itself. The others are random, and would add only noise.
meta.json says both (gpt2/data/files.py): "row", the ids a row, so that training draws whole
rows (a window across two would cut the earlier occurrence off some ids it scores), and "mask",
what the mask marks and how many by split.
A run tells an induction head (attend the position after the earlier occurrence, copy its id)
from a circuit that attends further on and copies what was moved there: in "A A A" the third A
is predicted only the induction head's way (tests/fixtures/make_induction_2l.py says why).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from gpt2._checks import int_between, real_between
from gpt2._files import atomic_write_text
from gpt2.data.corpora import SHARD_NAME
from gpt2.data.files import FORMAT, MASK_DTYPE, Split, ids_dtype, scratch_in, write_split_files
from gpt2.errors import DataError, InvalidArgumentError
from gpt2.tokenizer import CHARS_FILE

SYNTHETIC = ("induction",)  # the kinds of synthetic data, `prepare_synthetic`'s `kind`
INDUCTION_VOCAB = 64  # the induction model's vocabulary and context (n_vocab, n_ctx)
INDUCTION_CTX = 64
COPY_LENGTHS = (6, 24)  # the shortest and the longest stretch a copies row writes twice
RUN_TIMES = (1, 4)  # how many times a runs row writes each token: from 1 to 4
DEFAULT_ROWS = 144_000  # 90% train: 129,600 rows, about the 2,001 x 64 the recipe's steps draw
CHUNK_ROWS = 8192  # rows drawn (and their mask computed) at a time
COPY_MARKS = "the ids copying predicts"  # what an induction mask marks (meta.json's mask.marks)


def copies_rows(
    rng: np.random.Generator, n_rows: int, n_ctx: int, n_vocab: int, lengths: tuple[int, int] = COPY_LENGTHS
) -> np.ndarray:
    """(n_rows, n_ctx + 1) random ids, each row with a stretch of lengths[0]..lengths[1] ids
    (its length drawn for the row) written twice in a row, starting at a random place."""
    L = n_ctx + 1
    x = rng.integers(0, n_vocab, (n_rows, L))  # (R, L)
    n = rng.integers(lengths[0], lengths[1] + 1, n_rows)[:, None]  # (R, 1): the stretch's length
    start = rng.integers(0, L + 1 - 2 * n)  # (R, 1): the first copy's start; the second ends by L
    cols = np.arange(L)
    second = (cols >= start + n) & (cols < start + 2 * n)  # (R, L): the second copy's places
    return np.take_along_axis(x, np.where(second, cols - n, cols), axis=1)  # each takes the id n before it


def runs_rows(rng: np.random.Generator, n_rows: int, n_ctx: int, n_vocab: int) -> np.ndarray:
    """(n_rows, n_ctx + 1) ids: random tokens, each written RUN_TIMES[0]..RUN_TIMES[1] times in a row, the
    row cut at n_ctx + 1."""
    L = n_ctx + 1
    tokens = rng.integers(0, n_vocab, (n_rows, L))  # (R, L): enough for a row even if each is written once
    times = rng.integers(RUN_TIMES[0], RUN_TIMES[1] + 1, (n_rows, L))  # (R, L)
    flat = np.repeat(tokens.ravel(), times.ravel())  # every row's runs, one row after another
    starts = np.concatenate([[0], np.cumsum(times.sum(axis=1))[:-1]])  # (R,): where each row's runs begin
    return flat[starts[:, None] + np.arange(L)]  # (R, L): each row's first L ids


def copy_mask(rows: np.ndarray, n_vocab: int) -> np.ndarray:
    """(R, L) uint8 for rows (R, L) of ids below n_vocab: 1 on id j (j >= 1) where copying predicts
    it, the id after the latest occurrence of id j - 1 before position j - 1 being id j; else 0
    (id 0, with no input before it, is never a target)."""
    R, L = rows.shape
    mask = np.zeros((R, L), dtype=MASK_DTYPE)
    latest = np.full((R, n_vocab), -1)  # (R, V): each token's latest position so far, -1 for none
    r = np.arange(R)
    for t in range(L - 1):  # t: an input's position; its target is the id at t + 1
        p = latest[r, rows[:, t]]  # (R,): the latest earlier occurrence of the input's token
        mask[:, t + 1] = (p >= 0) & (rows[r, p + 1] == rows[:, t + 1])
        latest[r, rows[:, t]] = t
    return mask


def induction_rows(rng: np.random.Generator, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(n_rows, INDUCTION_CTX + 1) ids and their mask: runs rows at even places, copies rows at odd
    ones (half each, as the model's batches were), both of INDUCTION_VOCAB tokens."""
    n_runs = (n_rows + 1) // 2
    rows = np.empty((n_rows, INDUCTION_CTX + 1), dtype=np.int64)
    rows[0::2] = runs_rows(rng, n_runs, INDUCTION_CTX, INDUCTION_VOCAB)
    rows[1::2] = copies_rows(rng, n_rows - n_runs, INDUCTION_CTX, INDUCTION_VOCAB)
    return rows, copy_mask(rows, INDUCTION_VOCAB)


def prepare_synthetic(
    out: str | os.PathLike,
    kind: str = "induction",
    rows: int = DEFAULT_ROWS,
    val_fraction: float = 0.1,
    *,
    seed: int = 0,
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Write `rows` rows of synthetic data of `kind` (SYNTHETIC; the module's docstring says what
    each holds) into `out` as prepared data: train.bin and val.bin (the rows one after another;
    the last round(val_fraction * rows) validate, at least one) with train.mask.bin and
    val.mask.bin beside them (1 on each id the loss counts), and meta.json (with "row" and
    "mask": training draws whole rows and scores the marked ids). The rows come from
    `seed` alone: the same seed, the same bytes. No tokenizer: the ids are the tokens.
    Returns the meta written."""
    if kind not in SYNTHETIC:
        raise InvalidArgumentError(
            f"kind must be one of {', '.join(SYNTHETIC)} (the synthetic data gpt2 makes), got {kind!r}", "kind"
        )
    rows = int_between("rows", rows, 2, None, "a whole number")  # each split needs a row
    val_fraction = real_between("val_fraction", val_fraction, 0, 1, open_low=True, open_high=True)
    seed = int_between("seed", seed, 0, None, "a whole number")
    n_val = min(max(round(val_fraction * rows), 1), rows - 1)
    out = Path(out)
    with scratch_in(out, overwrite) as scratch:
        marked = _write_rows(scratch, rows, seed, progress)
        L = INDUCTION_CTX + 1
        split = Split([(0, (rows - n_val) * L)], [((rows - n_val) * L, rows * L)], "rows", n_val)
        mask_tokens = {"train": int(marked[: rows - n_val].sum()), "val": int(marked[rows - n_val :].sum())}
        for name, count in mask_tokens.items():
            if count == 0:
                raise DataError(f"the {name} rows mark no target: the loss would count nothing; give more rows", "rows")
        write_split_files(out, scratch, split, {"": ids_dtype(INDUCTION_VOCAB), ".mask": MASK_DTYPE})
    meta = _meta(kind, rows, n_val, val_fraction, seed, mask_tokens)
    if overwrite:
        _remove_other_files(out)
    atomic_write_text(out / "meta.json", json.dumps(meta, indent=2) + "\n")  # last: it vouches for the rest
    return meta


def _write_rows(scratch: Path, rows: int, seed: int, progress: bool) -> np.ndarray:
    """scratch/all.bin and scratch/all.mask.bin: the rows, drawn CHUNK_ROWS at a time from one
    generator seeded by `seed`. Returns the targets each row marks, (rows,)."""
    from tqdm.auto import tqdm

    rng = np.random.default_rng(seed)
    marked = np.zeros(rows, dtype=np.int64)
    with (
        open(scratch / "all.bin", "wb") as ids_file,
        open(scratch / "all.mask.bin", "wb") as mask_file,
        tqdm(total=rows, unit="row", desc="drawing", disable=not progress) as bar,
    ):
        for start in range(0, rows, CHUNK_ROWS):
            ids, mask = induction_rows(rng, min(CHUNK_ROWS, rows - start))
            ids_file.write(ids.astype(ids_dtype(INDUCTION_VOCAB)).tobytes())
            mask_file.write(mask.tobytes())
            marked[start : start + len(ids)] = mask.sum(axis=1)
            bar.update(len(ids))
    return marked


def _meta(
    kind: str, rows: int, n_val: int, val_fraction: float, seed: int, mask_tokens: dict[str, int]
) -> dict[str, Any]:
    """meta.json's entries: "row", the ids a row (training draws whole rows), and "mask", what the
    masks mark and how many by split (gpt2/data/files.py reads both)."""
    L = INDUCTION_CTX + 1
    return {
        "format": FORMAT,
        "version": 1,
        "tokenizer": None,
        "vocab_size": INDUCTION_VOCAB,
        "dtype": ids_dtype(INDUCTION_VOCAB).name,
        "train_tokens": (rows - n_val) * L,
        "val_tokens": n_val * L,
        "split": {"val_fraction": val_fraction, "method": "rows", "actual_val_fraction": n_val / rows},
        "row": L,
        "mask": {"marks": COPY_MARKS, "tokens": mask_tokens},
        "synthetic": {
            "kind": kind,
            "seed": seed,
            "rows": {"train": rows - n_val, "val": n_val},
            "copy_lengths": list(COPY_LENGTHS),
            "run_times": list(RUN_TIMES),
            "order": "runs and copies rows alternately, runs first",
        },
    }


def _remove_other_files(out: Path) -> None:
    """An overwrite leaves no stale file that would be read with these ids: a tokenizer's, or llm.c's shards."""
    stale = [out / name for name in ("encoder.json", "vocab.bpe", CHARS_FILE)]
    stale += [p for p in out.glob("*.bin") if SHARD_NAME.fullmatch(p.name)]
    for path in stale:
        path.unlink(missing_ok=True)
