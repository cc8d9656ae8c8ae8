"""Synthetic data (gpt2.data.synthetic, `gpt2 prepare --synthetic`): the induction rows read back from the files
and checked against their stated distribution, with a brute-force reference for the mask; drawn from the seed
alone; read by training; bad input refused in one line."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from gpt2.cli import main
from gpt2.data.batches import IGNORE, get_batch
from gpt2.data.files import open_data
from gpt2.data.synthetic import prepare_synthetic
from gpt2.errors import DataError, InvalidArgumentError

ROW = 65  # ids a row: a window of 64 inputs and its next id
N_VOCAB = 64
FILES = ("train.bin", "val.bin", "train.mask.bin", "val.mask.bin", "meta.json")


@pytest.fixture(scope="module")
def induction(tmp_path_factory):
    """2,000 rows of seed 0, and the rows and masks read back from the files with numpy alone, (2000, 65) each."""
    out = tmp_path_factory.mktemp("synthetic") / "induction"
    meta = prepare_synthetic(out, "induction", rows=2000, seed=0, progress=False)
    ids = np.concatenate([np.fromfile(out / f"{s}.bin", dtype="<u2") for s in ("train", "val")]).reshape(-1, ROW)
    mask = np.concatenate([np.fromfile(out / f"{s}.mask.bin", dtype="u1") for s in ("train", "val")]).reshape(-1, ROW)
    return out, meta, ids.tolist(), mask.tolist()


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """`gpt2 ARGV...` in this process: its exit status, stdout and stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def copying_predicts(row: list[int]) -> list[int]:
    """The reference mask, by brute force: id j is scored where, scanning back from j - 2, the first id equal to
    id j - 1 is followed by id j itself."""
    mask = [0] * len(row)
    for j in range(1, len(row)):
        for p in range(j - 2, -1, -1):
            if row[p] == row[j - 1]:
                mask[j] = int(row[p + 1] == row[j])
                break
    return mask


def doubled_stretches(row: list[int], shortest: int = 6) -> set[int]:
    """The lengths n >= shortest of every stretch of the row written twice in a row (row[s:s+n] == row[s+n:s+2n])."""
    return {
        n
        for n in range(shortest, len(row) // 2 + 1)
        for s in range(len(row) - 2 * n + 1)
        if row[s : s + n] == row[s + n : s + 2 * n]
    }


def repeat_share(row: list[int]) -> float:
    """The share of the row's ids equal to the id before them."""
    return sum(a == b for a, b in zip(row, row[1:])) / (len(row) - 1)


def test_the_files_hold_the_rows_meta_json_says(induction):
    out, meta, ids, mask = induction
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)  # no tokenizer: the ids are the tokens
    assert (meta["train_tokens"], meta["val_tokens"], meta["vocab_size"]) == (1800 * ROW, 200 * ROW, N_VOCAB)
    assert meta == json.loads((out / "meta.json").read_text())
    scored = {"train": sum(map(sum, mask[:1800])), "val": sum(map(sum, mask[1800:]))}
    assert meta["mask"] == {"marks": "the ids copying predicts", "tokens": scored} and meta["row"] == ROW
    assert "chat" not in meta  # not conversations: no template
    assert min(map(min, ids)) == 0 and max(map(max, ids)) == N_VOCAB - 1


def test_runs_and_copies_rows_alternate(induction):
    """Even rows are runs (about 60% of their ids repeat the one before: 1.5 more of each token's 2.5 on average),
    odd rows random tokens (1/64 of them repeat by chance, and some of the doubled stretch)."""
    _, _, ids, _ = induction
    runs, copies = [repeat_share(row) for row in ids[0::2]], [repeat_share(row) for row in ids[1::2]]
    assert min(runs) > 0.3 > 0.2 > max(copies)
    assert abs(np.mean(runs) - (1.5 + 1 / N_VOCAB) / 2.5) < 0.02
    assert np.mean(copies) < 0.05


def test_a_runs_row_writes_each_token_1_to_4_times(induction):
    """The lengths of the runs inside a row (the first and last may be cut) are 1 to 4 times, each about a quarter
    of them; longer ones only where two drawn tokens happen to be the same (1 in 64)."""
    _, _, ids, _ = induction
    lengths = Counter()
    for row in ids[0::2]:
        starts = [0] + [i for i in range(1, ROW) if row[i] != row[i - 1]] + [ROW]
        lengths.update(b - a for a, b in zip(starts[1:-2], starts[2:-1]))  # the inner runs
    total = sum(lengths.values())
    for times in (1, 2, 3, 4):
        assert abs(lengths[times] / total - 0.25) < 0.02, lengths
    assert sum(v for k, v in lengths.items() if k > 4) / total < 0.03


def test_a_copies_row_writes_one_stretch_of_6_to_24_tokens_twice(induction):
    _, _, ids, _ = induction
    found = [doubled_stretches(row) for row in ids[1::2]]
    assert all(len(lengths) == 1 for lengths in found)  # one length a row
    lengths = Counter(n for (n,) in found)
    assert set(lengths) == set(range(6, 25)), lengths  # every length from 6 to 24, none else
    assert min(lengths.values()) > 0.5 * len(found) / 19  # drawn evenly: about 53 rows each


def test_the_mask_marks_exactly_what_copying_predicts(induction):
    _, _, ids, mask = induction
    assert mask == [copying_predicts(row) for row in ids]
    assert 0.15 < np.mean(mask) < 0.35  # about a quarter of the ids carry the loss


def test_the_rows_come_from_the_seed_alone(induction, tmp_path):
    out, meta, _, _ = induction
    prepare_synthetic(tmp_path / "again", rows=2000, seed=0, progress=False)
    prepare_synthetic(tmp_path / "other", rows=2000, seed=1, progress=False)
    for name in FILES:
        assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes(), name
    assert (tmp_path / "other" / "train.bin").read_bytes() != (out / "train.bin").read_bytes()
    assert json.loads((tmp_path / "other" / "meta.json").read_text())["synthetic"]["seed"] == 1


def test_training_reads_whole_rows_and_scores_the_marked_ids(induction):
    """open_data gives the rows' length and their mask (not conversations': no template), and a batch is whole
    training rows, at the seeded draw of rows: each window's scored ids have their earlier occurrence in it."""
    out, _, ids, mask = induction
    data = open_data(out)
    assert (data.vocab_size, data.tokenizer, data.chat_template) == (N_VOCAB, None, None)
    assert (data.row, data.mask_marks) == (ROW, "the ids copying predicts")
    assert np.array_equal(data.masks["train"], np.asarray(mask[:1800], dtype=np.uint8).ravel())
    rows, marks = np.asarray(ids[:1800]), np.asarray(mask[:1800])
    for micro_step in range(3):
        x, y = get_batch(
            data.train, 64, 8, seed=0, iteration=0, micro_step=micro_step, mask=data.masks["train"], row=data.row
        )
        picked = np.random.default_rng([0, 0, micro_step]).integers(0, 1800, size=8)
        assert x.tolist() == rows[picked, :-1].tolist()
        assert y.tolist() == np.where(marks[picked, 1:] == 1, rows[picked, 1:], IGNORE).tolist()


def test_an_overwrite_leaves_no_tokenizer_beside_the_ids(tmp_path):
    out = tmp_path / "d"
    out.mkdir()
    (out / "chars.json").write_text("[]")
    (out / "train.bin").write_bytes(b"")
    with pytest.raises(DataError, match=r"already holds prepared data \(train.bin\): pass overwrite=True"):
        prepare_synthetic(out, rows=10, progress=False)
    prepare_synthetic(out, rows=10, overwrite=True, progress=False)
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"kind": "copies"}, InvalidArgumentError, "kind must be one of induction (the synthetic data gpt2 makes), "),
        ({"rows": 1}, InvalidArgumentError, "rows must be a whole number from 2 up, got 1"),
        ({"rows": 2.5}, InvalidArgumentError, "rows must be a whole number from 2 up, got 2.5"),
        ({"rows": True}, InvalidArgumentError, "rows must be a whole number from 2 up, got True"),
        ({"seed": -1}, InvalidArgumentError, "seed must be a whole number from 0 up, got -1"),
        ({"val_fraction": 1.0}, InvalidArgumentError, "val_fraction must be a number in (0, 1), got 1.0"),
    ],
)
def test_bad_arguments_are_refused_naming_them(tmp_path, kwargs, error, message):
    with pytest.raises(error) as caught:
        prepare_synthetic(tmp_path / "d", **{"rows": 10, "progress": False, **kwargs})
    assert str(caught.value).startswith(message) and caught.value.param == next(iter(kwargs))
    assert not (tmp_path / "d").exists()


def test_the_command_draws_the_rows_and_says_what(tmp_path, capsys):
    out = tmp_path / "d"
    code, said, err = run(
        capsys, "prepare", "--out", str(out), "--synthetic", "induction", "--rows", "100", "--no-progress"
    )
    meta = json.loads((out / "meta.json").read_text())
    scored = meta["mask"]["tokens"]
    assert (code, said) == (0, "")
    assert err == (
        f"gpt2: 90 training and 10 validation rows of induction data (5,850 and 650 ids, {scored['train']:,} and "
        f"{scored['val']:,} of them scored; seed 0) of a 64-token vocabulary in {out}\n"
    )
    prepare_synthetic(tmp_path / "library", rows=100, progress=False)
    assert (out / "train.bin").read_bytes() == (tmp_path / "library" / "train.bin").read_bytes()


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--synthetic", "copies"],
            "--synthetic must be one of induction (the synthetic data gpt2 makes), got 'copies'",
        ),
        (["--synthetic", "induction", "--rows", "1"], "--rows must be a whole number from 2 up, got 1"),
        (["--synthetic", "induction", "--rows", "x"], "argument --rows: expected a whole number, got 'x'"),
        (["--synthetic", "induction", "--seed", "-1"], "--seed must be a whole number from 0 up, got -1"),
        (["--synthetic", "induction", "--val-fraction", "0"], "--val-fraction must be a number in (0, 1), got 0.0"),
        (
            ["--synthetic", "induction", "in.txt", "--tokenizer", "char", "--chat"],
            "--synthetic draws its own rows of token ids (no text, no tokenizer): INPUT, --chat, --tokenizer do not "
            "apply",
        ),
        (["--synthetic", "induction", "--shard-tokens", "100"], "--shard-tokens does not apply"),
        (["in.txt", "--rows", "5"], "--rows applies to synthetic data only: add --synthetic induction"),
        (["in.txt", "--seed", "1", "--rows", "5"], "--rows and --seed apply to synthetic data only: add --synthetic"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(tmp_path, capsys, args, message):
    code, _, err = run(capsys, "prepare", "--out", str(tmp_path / "d"), "--no-progress", *args)
    assert code == 2 and err.startswith("gpt2: error: ") and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "d").exists()
