"""A run's loggers: Weights & Biases (offline) and TensorBoard get what log.jsonl gets, read back
from the files each wrote (W&B's transaction log, TensorBoard's event files), across a resume."""

from __future__ import annotations

import json
import shutil
import struct
import time
from pathlib import Path

import pytest

from gpt2 import InvalidArgumentError
from gpt2.training.loggers import read_log
from gpt2.training.train import train

pytestmark = pytest.mark.filterwarnings("ignore::gpt2.training.optim.WarmupWarning")

TINY = dict(
    n_layer=1,
    n_head=2,
    n_embd=16,
    block_size=16,
    batch_size=2,
    grad_accum=1,
    eval_interval=2,
    eval_iters=1,
    log_interval=1,
    device="cpu",
    progress=False,
)


@pytest.fixture
def wandb_settings(monkeypatch):
    """W&B reads its settings (WANDB_MODE, WANDB_DIR, ...) once a process: a test's own, then forgotten."""
    import wandb

    wandb.teardown()
    monkeypatch.setenv("WANDB_SILENT", "true")
    yield monkeypatch
    wandb.teardown()


@pytest.fixture
def offline_wandb(tmp_path, wandb_settings) -> Path:
    """W&B in its offline mode, writing under a directory of the test's."""
    wandb_settings.setenv("WANDB_MODE", "offline")
    wandb_settings.setenv("WANDB_DIR", str(tmp_path))
    return tmp_path / "wandb"


def wandb_records(path: Path) -> list:
    """The records of a .wandb file: W&B's header (":W&B", 0xBEE1, version 0), then LevelDB's log
    format (blocks of 32 KiB; each chunk a 4-byte checksum, a 2-byte length and a type: 1 whole,
    2 first, 3 middle, 4 last), each record a protobuf `Record` of wandb's own."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:7] == b":W&B\xe1\xbe\x00", data[:7]
    records, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's last bytes, too few for a header: zeros
            pos += block - pos % block
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            records.append(wandb_internal_pb2.Record.FromString(pending))
            pending = b""
    return records


def wandb_run(directory: Path) -> tuple[str, dict, list[dict]]:
    """An offline run's id, its config (with the updates after the start) and its history rows,
    once W&B's service has written them all (its exit record: wandb.finish() does not wait)."""
    [path] = directory.glob("run-*.wandb")
    deadline = time.monotonic() + 120  # a bound for a hang: a busy machine's service is slow to write
    while (
        not ((records := wandb_records(path)) and records[-1].WhichOneof("record_type") == "exit")
        and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    run_id, config, history = None, {}, []
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id = record.run.run_id
            config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
        elif kind == "config":
            config.update({item.key: json.loads(item.value_json) for item in record.config.update})
        elif kind == "history":
            history.append(
                {item.key or ".".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
    return run_id, config, history


def tensorboard_scalars(directory: Path) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} as TensorBoard shows them (a purge_step drops the points a resume redoes)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory))
    events.Reload()
    scalars = {}
    for tag in events.Tags()["scalars"]:
        points = events.Scalars(tag)
        assert len({p.step for p in points}) == len(points), f"{tag}: a step twice"
        scalars[tag] = {p.step: p.value for p in points}
    return scalars


def logged(out: Path, key: str) -> dict[int, float]:
    return {r["iter"]: r[key] for r in read_log(out / "log.jsonl") if key in r}


def test_wandb_offline_and_tensorboard_get_what_log_jsonl_gets_and_a_resume_goes_on(char_data, tmp_path, offline_wandb):
    """A run, then two resumes from its checkpoint at iteration 4, the second as after a crash
    (the first resume's points past 4 are in the files already): one W&B run, one curve."""
    out, board = tmp_path / "out", tmp_path / "board"
    train(out, data=char_data, max_iters=4, wandb="tiny-project", wandb_run_name="first", tensorboard=board, **TINY)
    records = read_log(out / "log.jsonl")
    assert (
        records[0] == {"iter": 0, "settings": records[0]["settings"]}
        and records[0]["settings"]["wandb"] == "tiny-project"
    )
    [first] = offline_wandb.glob("offline-run-*")
    run_id, config, history = wandb_run(first)
    assert run_id == (out / "wandb-run-id").read_text().strip()
    assert config["max_iters"] == 4 and config["wandb_run_name"] == "first" and config["n_embd"] == 16
    # each W&B step holds the records of that iteration: a step's, and an evaluation's where there is one
    rows = {row["_step"]: row for row in history}
    assert sorted(rows) == [0, 1, 2, 3, 4]
    for record in records[1:]:
        assert {k: rows[record["iter"]][k] for k in record if k != "iter"} == {
            k: v for k, v in record.items() if k != "iter"
        }
    for step in (0, 2, 4):  # the probe at each evaluation, as W&B media (its history's keys, nested ones joined by ".")
        for kind in ("previous_token", "duplicate_token", "induction"):  # a picture, a cell a head: 2 heads, 1 layer
            media = {key: rows[step][f"probe/{kind}.{key}"] for key in ("_type", "format", "width", "height")}
            assert media == {"_type": "image-file", "format": "png", "width": 48, "height": 24}
        assert rows[step]["probe/sample._type"] == "html-file"
    scalars = tensorboard_scalars(board)
    for key in ("loss", "lr", "val_loss", "train_loss", "tokens_per_s"):
        assert scalars[key] == pytest.approx(logged(out, key), rel=1e-6), key  # float32 in the event files
    assert sorted(scalars["loss"]) == [0, 1, 2, 3] and sorted(scalars["val_loss"]) == [0, 2, 4]

    shutil.copy(out / "checkpoint.pt", tmp_path / "at-4.pt")
    train(out, resume=True, max_iters=8, progress=False)
    resumed = tensorboard_scalars(board)
    shutil.copy(tmp_path / "at-4.pt", out / "checkpoint.pt")  # a crash after iteration 7, the last checkpoint 4's
    train(out, resume=True, max_iters=8, progress=False)
    scalars = tensorboard_scalars(board)
    assert sorted(scalars["loss"]) == list(range(8)) and sorted(scalars["val_loss"]) == [0, 2, 4, 6, 8]
    assert (
        scalars["loss"] == pytest.approx(logged(out, "loss"), rel=1e-6) == resumed["loss"]
    )  # resumes repeat the losses
    later = [run for run in offline_wandb.glob("offline-run-*") if run != first]
    assert len(later) == 2
    for run in later:
        run_id2, config, history = wandb_run(run)
        assert run_id2 == run_id and config["max_iters"] == 8 and [row["_step"] for row in history] == [4, 5, 6, 7, 8]


def test_a_new_run_over_an_old_one_starts_a_new_wandb_run(char_data, tmp_path, offline_wandb):
    out = tmp_path / "out"
    train(out, data=char_data, max_iters=1, wandb="tiny-project", **TINY)
    old = (out / "wandb-run-id").read_text()
    train(out, data=char_data, max_iters=1, wandb="tiny-project", overwrite=True, **TINY)
    assert (out / "wandb-run-id").read_text() != old
    assert {wandb_run(d)[0] for d in offline_wandb.glob("offline-run-*")} == {
        old.strip(),
        (out / "wandb-run-id").read_text().strip(),
    }


@pytest.mark.parametrize("setting", ["wandb", "tensorboard"])
def test_a_logger_without_its_package_is_refused_before_the_run(char_data, tmp_path, monkeypatch, setting):
    from gpt2 import MissingPackageError

    monkeypatch.setitem(__import__("sys").modules, setting, None)  # import wandb: ImportError
    with pytest.raises(
        MissingPackageError, match=rf"^{setting} needs the {setting} package: pip install 'gpt2\[{setting}\]'$"
    ) as e:
        train(tmp_path / "out", data=char_data, max_iters=2, **{setting: str(tmp_path / "x")}, **TINY)
    assert e.value.param == setting and not (tmp_path / "out").exists()


def test_wandb_that_cannot_start_says_why_and_leaves_no_run(char_data, tmp_path, wandb_settings):
    """Online without an API key (and no terminal to ask for one): W&B's error in one line, OUT left empty."""
    monkeypatch = wandb_settings
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_API_KEY", "")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc with a key
    with pytest.raises(InvalidArgumentError, match="^wandb: Weights & Biases could not start the run: ") as e:
        train(tmp_path / "out", data=char_data, max_iters=2, wandb="tiny-project", **TINY)
    assert e.value.param == "wandb" and "\n" not in str(e.value)
    assert not any(p.name in ("log.jsonl", "checkpoint.pt", "wandb-run-id") for p in (tmp_path / "out").glob("*"))
