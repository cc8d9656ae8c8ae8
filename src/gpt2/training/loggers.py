"""Where a training run's records go: log.jsonl always, and Weights & Biases (`wandb`) and
TensorBoard (`tensorboard`) where the settings ask, each the same records.

A record is a dict with an "iter": a step's numbers ({"iter", "loss", "lr", "ms", ...}), an
evaluation's ({"iter", "train_loss", "val_loss", "best", "sample"?}), or the run's settings
from that iteration on ({"iter", "settings": {...}}, at the start and at each resume). The
loggers pass on what they are given, so a key added to a record reaches all of them.

A resumed run goes on in the same W&B run (its id is kept in OUT/wandb-run-id) and the same
TensorBoard directory, from the resumed iteration: TensorBoard drops the points a crashed run
wrote past it (purge_step), and W&B keeps those it has (a resume repeats the same losses).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from gpt2._checks import require_package
from gpt2._files import atomic_write_text
from gpt2.errors import InvalidArgumentError
from gpt2.settings import TrainSettings

LOG = "log.jsonl"  # in OUT: every record of the run, a line each
WANDB_ID = "wandb-run-id"  # in OUT: the W&B run a resume goes on with


class Logger(Protocol):
    def log(self, record: dict[str, Any]) -> None: ...

    def probe(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class JsonlLogger:
    """One JSON object a line, appended (and the file closed) at each record: a crash loses none."""

    def __init__(self, path: Path):
        self.path = path

    def log(self, record: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def probe(self, record: dict[str, Any]) -> None:
        pass  # probes.jsonl is gpt2/training/probes.py's

    def close(self) -> None:
        pass


class WandbLogger:
    """A W&B run (online, or offline with WANDB_MODE=offline): the settings as its config, each
    record's values at step "iter"."""

    def __init__(self, s: TrainSettings, out: Path, resumed: bool):
        wandb = _package("wandb", "wandb")
        id_file = out / WANDB_ID
        run_id = (
            id_file.read_text(encoding="utf-8").strip() if resumed and id_file.is_file() else None
        )  # None: a new run
        try:
            self.run = wandb.init(project=s.wandb, name=s.wandb_run_name, id=run_id, resume="allow", config=s.to_dict())
        except wandb.errors.Error as e:  # not logged in, no network, ...: W&B's own words
            raise InvalidArgumentError(
                f"wandb: Weights & Biases could not start the run: {' '.join(str(e).split())}", "wandb"
            ) from None
        atomic_write_text(id_file, self.run.id + "\n")

    def log(self, record: dict[str, Any]) -> None:
        step = record["iter"]
        if "settings" in record:
            self.run.config.update(record["settings"], allow_val_change=True)  # a resume's changes (max_iters)
        elif step >= self.run.step:  # below: logged by the run a crash stopped; the resume repeats its losses
            self.run.log({k: v for k, v in record.items() if k != "iter"}, step=step)

    def probe(self, record: dict[str, Any]) -> None:
        """A probe (gpt2/training/probes.py) as W&B media: each head score's heat map, and the sample."""
        wandb = _package("wandb", "wandb")
        media = {f"probe/{kind}": wandb.Image(head_scores_image(record, kind)) for kind in record["head_scores"]}
        if record["sample"] is not None:
            media["probe/sample"] = wandb.Html(f"<pre>{html.escape(record['sample'])}</pre>")
        if record["iter"] >= self.run.step:  # below: logged by the run a crash stopped
            self.run.log(media, step=record["iter"])

    def close(self) -> None:
        self.run.finish()


class TensorBoardLogger:
    """torch.utils.tensorboard's event files: numbers as scalars, text (a sample, the settings) as text."""

    def __init__(self, s: TrainSettings, start: int, kept: list[dict[str, Any]] | None):
        """kept: on resume, the records of log.jsonl from `start` on (the checkpoint's evaluation),
        written again after TensorBoard's purge of everything from `start` on."""
        _package("tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(s.tensorboard, purge_step=None if kept is None else start)
        self.written: tuple[int, set[str]] = (-1, set())  # the last step, and its tags: "lr" comes in two records
        for record in kept or []:
            self.log(record)

    def log(self, record: dict[str, Any]) -> None:
        step = record["iter"]
        if self.written[0] != step:
            self.written = (step, set())
        for key, value in record.items():
            if key in self.written[1]:
                continue
            self.written[1].add(key)
            if key == "settings":
                self.writer.add_text(key, "```\n" + json.dumps(value, indent=1) + "\n```", step)  # markdown: as written
            elif isinstance(value, str):
                self.writer.add_text(key, value, step)
            elif key != "iter":
                self.writer.add_scalar(key, float(value), step)

    def probe(self, record: dict[str, Any]) -> None:
        """A probe (gpt2/training/probes.py) as TensorBoard images, each head score's heat map, and text."""
        step = record["iter"]
        for kind in record["head_scores"]:
            self.writer.add_image(f"probe/{kind}", head_scores_image(record, kind), step, dataformats="HWC")
        if record["sample"] is not None:
            self.writer.add_text("probe/sample", record["sample"], step)

    def close(self) -> None:
        self.writer.close()


class Loggers:
    """All of a run's loggers as one: each record to each."""

    def __init__(self, loggers: list[Logger]):
        self.loggers = loggers

    def log(self, record: dict[str, Any]) -> None:
        for logger in self.loggers:
            logger.log(record)

    def probe(self, record: dict[str, Any]) -> None:
        for logger in self.loggers:
            logger.probe(record)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()


def check_loggers(s: TrainSettings) -> None:
    """Raise MissingPackageError, before a run starts, where a logger's package is not installed."""
    if s.wandb is not None:
        _package("wandb", "wandb")
    if s.tensorboard is not None:
        _package("tensorboard", "tensorboard")


def open_loggers(s: TrainSettings, log: Path, start: int, resumed: bool) -> Loggers:
    """The loggers of a run writing `log` (OUT/log.jsonl, cut back to the checkpoint's records)
    from iteration `start` on (rank 0's)."""
    loggers: list[Logger] = [JsonlLogger(log)]
    try:
        if s.wandb is not None:
            loggers.append(WandbLogger(s, log.parent, resumed))
        if s.tensorboard is not None:
            kept = [r for r in read_log(log) if r["iter"] >= start] if resumed else None
            loggers.append(TensorBoardLogger(s, start, kept))
    except BaseException:
        Loggers(loggers).close()
        raise
    return Loggers(loggers)


def read_log(path: Path) -> list[dict[str, Any]]:
    """The records of a run's log.jsonl (a line cut short by a crash is skipped)."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def head_scores_image(record: dict[str, Any], kind: str, cell: int = 24) -> np.ndarray:
    """A probe's head scores of one kind as an RGB picture, (n_layer * cell, n_head * cell, 3) uint8:
    a cell a head, layers down and heads across, white at 0 and dark blue at 1 (the page's colours)."""
    scores = np.clip(np.asarray(record["head_scores"][kind], dtype=np.float64), 0, 1)  # (L, H)
    ink = np.array([8, 48, 107], dtype=np.float64)
    rgb = 255 - (255 - ink) * scores[..., None]  # (L, H, 3)
    return np.kron(rgb, np.ones((cell, cell, 1))).round().astype(np.uint8)


def _package(name: str, setting: str) -> Any:
    return require_package(name, name, f"{setting} needs", setting)
