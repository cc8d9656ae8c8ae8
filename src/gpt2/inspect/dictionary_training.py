"""Training SAEs and transcoders on a model's activations, streamed from the model as it reads a
prepared dataset (`gpt2 train-sae`).

    run = train_dictionaries(model, "data/shakespeare", [("h.1.resid_mid", "h.1.resid_mid")],
                             DictionaryConfig("topk", d_in=384, d_dict=3072, k=16), steps=2000)
    run.metrics[-1]     # {"step", "l0", "explained_variance", "ce_recovered", "dead", ...} per dictionary
    run.save("out")     # SAELens's directories (and circuit-tracer's set, for transcoders)

Activations: random windows of the dataset's train split (`get_batch`, seeded), run through the
model once for every site at once (`trace`), position 0 left out (its vectors are outliers, and an
attribution graph leaves it out), into an in-memory buffer that is shuffled and half spent before it
is refilled (SAELens's mixing buffer): nothing is written to disk. A transcoder set trains every
block's transcoder from the same passes.

Each step is SAELens's (training/sae_trainer.py): the losses (gpt2.inspect.dictionaries), their
sum's gradient clipped to norm 1 per dictionary, Adam (betas 0.9, 0.999) at a constant learning
rate, JumpReLU thresholds projected to >= 0, each feature's steps since it last fired counted (dead
after dead_feature_window). At each evaluation, on fixed windows of the val split, the numbers
people compare:

    l0                   features firing a position, mean
    explained_variance   1 - sum |y - out|^2 / sum |y - mean(y)|^2 over the positions
    ce_recovered         (ce_zero - ce_spliced) / (ce_zero - ce_clean): the model's next-token loss with
                         the dictionary's output spliced in at its site (an SAE's reconstruction for the
                         site, a transcoder's output for its MLP's), against the site zeroed and untouched
    dead                 features that have not fired for dead_feature_window steps
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from gpt2._checks import positive_int, positive_real
from gpt2._files import atomic_directory, atomic_write_text
from gpt2.data.batches import IGNORE, get_batch
from gpt2.data.files import TokenData, open_data
from gpt2.errors import InvalidArgumentError
from gpt2.inspect.dictionaries import Dictionary, DictionaryConfig, save_circuit_tracer, save_saelens
from gpt2.inspect.names import canonical, canonical_to_tl, check_names
from gpt2.inspect.tracing import trace
from gpt2.inspect.transcoders import SITE_STEPS
from gpt2.model.model import GPT2


@dataclass
class TrainingSettings:
    """How the dictionaries are trained (SAELens's names where it has them)."""

    steps: int = 2000
    batch_size: int = 4096  # positions a step
    lr: float = 3e-4
    context: int = 128  # a window's positions
    windows: int = 16  # windows run through the model at once
    buffer_batches: int = 8  # the mixing buffer holds this many steps' positions
    dead_feature_window: int = 1000
    eval_interval: int = 500
    eval_windows: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "context", "windows", "buffer_batches", "dead_feature_window"):
            positive_int(name, getattr(self, name))
        for name in ("eval_interval", "eval_windows"):
            positive_int(name, getattr(self, name))
        positive_real("lr", self.lr)


@dataclass
class TrainingRun:
    """What `train_dictionaries` made: the dictionaries, each reading sites[i][0] and writing
    sites[i][1], and the metrics of each evaluation."""

    dictionaries: list[Dictionary]
    sites: list[tuple[str, str]]
    settings: TrainingSettings
    data: str
    metrics: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def transcoders(self) -> bool:
        return self.dictionaries[0].config.transcoder

    def save(self, directory: str | Path) -> Path:
        """Write `directory` (new): saelens/ (one SAELens directory per dictionary: layer_{i}/ for a
        transcoder set, else the SAE itself), circuit-tracer/ for a relu or JumpReLU transcoder set,
        and training.json (the settings, the data, every evaluation's metrics)."""
        with atomic_directory(directory) as scratch:
            meta = {"training_data": self.data}
            if self.transcoders:
                for d, (i, _) in zip(self.dictionaries, self.sites):
                    layer = int(i.split(".")[1])
                    hooks = (f"blocks.{layer}.mlp.hook_in", f"blocks.{layer}.hook_mlp_out")
                    save_saelens(d, scratch / "saelens" / f"layer_{layer}", *hooks, meta)
                if self.dictionaries[0].config.architecture != "topk":
                    save_circuit_tracer(self.dictionaries, scratch / "circuit-tracer", scan=Path(directory).name)
            else:
                save_saelens(self.dictionaries[0], scratch / "saelens", canonical_to_tl(self.sites[0][0]), None, meta)
            record = {
                "sites": self.sites,
                "config": asdict(self.dictionaries[0].config),
                "settings": asdict(self.settings),
                "data": self.data,
                "seconds": self.seconds,
                "metrics": self.metrics,
            }
            atomic_write_text(scratch / "training.json", json.dumps(record, indent=2))
        return Path(directory)


def trained_on(directory: str | Path) -> str | None:
    """The prepared data the dictionaries in `directory` were trained on, where `gpt2 train-sae` wrote
    them (its training.json, in the directory or the one above: saelens/ and circuit-tracer/ are in
    it), and that data is still there; else None."""
    for place in (Path(directory), Path(directory).parent):
        record = place / "training.json"
        if record.is_file():
            try:
                data = json.loads(record.read_text(encoding="utf-8")).get("data")
            except (OSError, ValueError, AttributeError):
                return None
            return data if isinstance(data, str) and Path(data).is_dir() else None
    return None


def transcoder_sites(n_layer: int) -> list[tuple[str, str]]:
    """A transcoder set's sites: each block's MLP input (ln_2's output) to its output."""
    return [(f"h.{i}.ln_2", f"h.{i}.mlp.c_proj") for i in range(n_layer)]


def check_site(model: GPT2, name: str) -> str:
    """An SAE's site as gpt2's step name (gpt2's or TransformerLens's hook names), one holding a
    vector of n_embd per position."""
    n_layer = model.config.n_layer
    site = canonical(name, n_layer)
    step = None if site is None else (site.split(".", 2)[2] if site.count(".") >= 2 else "")
    if site is None or not site.startswith("h.") or step not in SITE_STEPS:
        check_names("site", n_layer, [name])  # an unknown name: its own message
        raise InvalidArgumentError(
            f"site {name!r} is not one an SAE reads here: a block's step holding one vector per position "
            f"(h.L.resid_pre, h.L.resid_mid, h.L, h.L.attn.c_proj, h.L.mlp.c_proj, h.L.ln_1, h.L.ln_2, or "
            f"TransformerLens's blocks.L.hook_resid_pre, ...)",
            "site",
        )
    return site


# ------------------------------------------------------------------ activations, streamed


class ActivationStream:
    """Batches of (batch_size, n_sites, C) activations of random train windows, shuffled in a buffer."""

    def __init__(self, model: GPT2, data: TokenData, sites: Sequence[str], settings: TrainingSettings):
        self.model, self.data, self.sites, self.s = model, data, list(dict.fromkeys(sites)), settings
        self.generator = torch.Generator().manual_seed(settings.seed)
        self.buffer = torch.empty(0, len(self.sites), model.config.n_embd)
        self.draws = 0

    def index(self, site: str) -> int:
        return self.sites.index(site)

    def _activations(self) -> torch.Tensor:
        """One draw of windows through the model -> (windows * (context - 1), n_sites, C)."""
        x, _ = get_batch(
            self.data.train,
            self.s.context,
            self.s.windows,
            seed=self.s.seed,
            iteration=self.draws,
            micro_step=0,
            row=self.data.row,
        )
        self.draws += 1
        t = trace(self.model, x.to(self.model.device), names=self.sites)
        acts = torch.stack([t.activations[s][:, 1:] for s in self.sites], 2)  # (W, T - 1, n_sites, C)
        return acts.flatten(0, 1).float().cpu()

    def __iter__(self) -> Iterator[torch.Tensor]:
        size = self.s.batch_size * self.s.buffer_batches
        while True:
            while len(self.buffer) < size:
                self.buffer = torch.cat([self.buffer, self._activations()])
            self.buffer = self.buffer[torch.randperm(len(self.buffer), generator=self.generator)]
            spent, self.buffer = self.buffer[: size // 2], self.buffer[size // 2 :]
            yield from spent.split(self.s.batch_size)


# ------------------------------------------------------------------ training


def train_dictionaries(
    model: GPT2,
    data: str | Path,
    sites: Sequence[tuple[str, str]],
    config: DictionaryConfig,
    settings: TrainingSettings | None = None,
    *,
    progress: bool = False,
    report: Callable[[dict], None] | None = None,
) -> TrainingRun:
    """Train one dictionary per (input site, output site) of `sites` (the same site twice: an SAE;
    `transcoder_sites(n_layer)`: a transcoder set) of `config`'s kind, on `model`'s activations over
    the prepared dataset `data` (the module's docstring). d_in and d_out are set from the model.
    `report` is given each evaluation's metrics as they come (the progress bar, `progress`, is tqdm's)."""
    settings = settings or TrainingSettings()
    if isinstance(sites, (str, bytes)) or not sites:
        raise InvalidArgumentError("sites must be a list of (input site, output site) pairs", "sites")
    sites = [(check_site(model, i), check_site(model, o)) for i, o in sites]
    tokens = open_data(data)
    tokens.check_vocabulary(model.tokenizer, model.config.n_vocab, "being read")
    tokens.check_block_size(settings.context)
    if settings.context > model.config.n_ctx:
        raise InvalidArgumentError(
            f"context {settings.context} is longer than the model's n_ctx={model.config.n_ctx}", "context"
        )
    C = model.config.n_embd
    transcoder = any(i != o for i, o in sites)
    config = DictionaryConfig(**{**asdict(config), "d_in": C, "d_out": C if transcoder else None})
    g = torch.Generator().manual_seed(settings.seed)
    dictionaries = [Dictionary(config, g).to(model.device) for _ in sites]
    stream = ActivationStream(model, tokens, [s for pair in sites for s in pair], settings)
    run = TrainingRun(dictionaries, [tuple(p) for p in sites], settings, str(data))
    trainer = DictionaryTrainer(dictionaries, settings.lr, settings.dead_feature_window)
    evaluation = Evaluation(model, tokens, run, settings)
    start = time.perf_counter()
    batches = iter(stream)
    with tqdm(total=settings.steps, desc="dictionaries", unit="step", disable=not progress) as bar:
        for step in range(1, settings.steps + 1):
            batch = next(batches).to(model.device)
            losses = trainer.step([(batch[:, stream.index(i)], batch[:, stream.index(o)]) for i, o in sites])
            if step % settings.eval_interval == 0 or step == settings.steps:
                run.seconds += time.perf_counter() - start
                run.metrics.append(evaluation(step, trainer.since_fired, losses))
                if report is not None:
                    report(run.metrics[-1])
                start = time.perf_counter()
                bar.set_postfix(
                    l0=f"{_mean(run.metrics[-1], 'l0'):.1f}", ev=f"{_mean(run.metrics[-1], 'explained_variance'):.3f}"
                )
            bar.update(1)
    return run


class DictionaryTrainer:
    """SAELens's training step (training/sae_trainer.py) for several dictionaries at once: each
    one's losses, their gradient clipped to norm 1, one Adam step (betas 0.9, 0.999) for all, the
    JumpReLU thresholds projected, and each feature's steps since it last fired (`since_fired`)."""

    def __init__(self, dictionaries: Sequence[Dictionary], lr: float, dead_feature_window: int):
        self.dictionaries, self.dead_feature_window = list(dictionaries), dead_feature_window
        params = [p for d in self.dictionaries for p in d.parameters()]
        self.optimizer = torch.optim.Adam(params, lr=lr, betas=(0.9, 0.999))
        self.since_fired = [torch.zeros(d.config.d_dict, device=d.W_enc.device) for d in self.dictionaries]

    def step(self, pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
        """One step on each dictionary's (input, target) batch -> the losses, averaged over the dictionaries."""
        losses: dict[str, float] = {}
        for d, (x, y), fired in zip(self.dictionaries, pairs, self.since_fired):
            out = d.losses(x, y, fired > self.dead_feature_window)
            out["loss"].backward()
            torch.nn.utils.clip_grad_norm_(d.parameters(), 1.0)
            fired += 1
            fired[out["fired"]] = 0
            for name, value in out.items():
                if name != "fired":
                    losses[name] = losses.get(name, 0.0) + value.item() / len(self.dictionaries)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        for d in self.dictionaries:
            d.project()
        return losses


def _mean(metrics: dict, key: str) -> float:
    values = [m[key] for m in metrics["dictionaries"]]
    return sum(values) / len(values)


class Evaluation:
    """The metrics of a run's dictionaries on fixed val windows (the module's docstring)."""

    def __init__(self, model: GPT2, data: TokenData, run: TrainingRun, settings: TrainingSettings):
        self.model, self.run, self.settings = model, run, settings
        x, y = get_batch(
            data.val,
            settings.context,
            settings.eval_windows,
            seed=settings.seed + 1,
            iteration=0,
            micro_step=0,
            mask=data.masks.get("val"),  # y: IGNORE where the data's loss mask leaves a position out
            row=data.row,
        )
        self.x, self.y = x.to(model.device), y.to(model.device)
        self.clean = self._ce({})

    def _ce(self, patch: dict) -> float:
        """The next-token loss of the windows' scored positions after position 0 (position 0 is never changed)."""
        logits = trace(self.model, self.x, patch=patch, names=[]).logits  # (W, T, V)
        return F.cross_entropy(logits[:, 1:].flatten(0, 1).float(), self.y[:, 1:].flatten(), ignore_index=IGNORE).item()

    @torch.no_grad()
    def __call__(self, step: int, since_fired: list[torch.Tensor], losses: dict) -> dict:
        names = sorted({s for pair in self.run.sites for s in pair})
        t = trace(self.model, self.x, names=names)
        per = []
        for d, (i, o), fired in zip(self.run.dictionaries, self.run.sites, since_fired):
            x, y = t.activations[i][:, 1:].flatten(0, 1).float(), t.activations[o][:, 1:].flatten(0, 1).float()
            f = d.encode(x)
            out = d.decode(f, x)
            variance = (y - y.mean(0)).pow(2).sum()
            spliced, zeroed = self._ce(self._splice(d, i, o)), self._ce({o: _zero_after_first})
            per.append(
                {
                    "sites": [i, o],
                    "l0": (f != 0).float().sum(-1).mean().item(),
                    "explained_variance": (1 - (y - out).pow(2).sum() / variance).item(),
                    "mse": (y - out).pow(2).sum(-1).mean().item(),
                    "ce_clean": self.clean,
                    "ce_spliced": spliced,
                    "ce_zero": zeroed,
                    "ce_recovered": (zeroed - spliced) / (zeroed - self.clean) if zeroed != self.clean else math.nan,
                    "dead": int((fired > self.settings.dead_feature_window).sum()),
                    "d_dict": d.config.d_dict,
                }
            )
        return {"step": step, "seconds": self.run.seconds, "losses": losses, "dictionaries": per}

    @staticmethod
    def _splice(d: Dictionary, input_site: str, output_site: str) -> dict:
        """The patch putting `d`'s output at output_site, from this run's input_site (positions 1..)."""
        seen = {}

        def read(x: torch.Tensor) -> torch.Tensor:  # (W, T, C), read before the output site is reached
            seen["x"] = x
            return x

        def put(value: torch.Tensor) -> torch.Tensor:
            x = seen.get("x", value)  # an SAE reads the very step it writes
            out = value.clone()
            out[:, 1:] = d(x[:, 1:].float()).to(value.dtype)
            return out

        return {output_site: put} if input_site == output_site else {input_site: read, output_site: put}


def _zero_after_first(value: torch.Tensor) -> torch.Tensor:
    out = value.clone()
    out[:, 1:] = 0
    return out
