"""Transcoders: each block's MLP read as sparse features, loaded from circuit-tracer's and SAELens's files.

    tcs = gpt2.inspect.load_transcoders("gpt2-transcoders")   # config.yaml + layer_{i}.safetensors
    tcs.check_fits(model)                                     # one per block, of the model's width
    t = trace(model, text, names=tcs.names())                 # each block's input site, h.L.ln_2
    features = tcs[3].encode(t.activations["h.3.ln_2"])       # (T, d_transcoder)
    tcs[3](t.activations["h.3.ln_2"])                         # (T, C): block 3's MLP output, as the transcoder has it

A transcoder reads a block's vectors at one site (its input) and writes another's (its output):

    pre = x @ W_enc + b_enc                          W_enc (d_in, d_transcoder)
    f = relu(pre)                                    relu
    f = pre * (pre > threshold)                      jumprelu (circuit-tracer's JumpReLU)
    f = relu(pre) * (pre > threshold)                relu_jumprelu (SAELens's; the same where threshold >= 0)
    out = f @ W_dec + b_dec (+ x @ W_skip.T)         W_dec (d_transcoder, d_out); W_skip (d_out, d_in), skip transcoders

Two layouts are read:

  circuit-tracer's transcoder set: a directory holding config.yaml (model_kind: transcoder_set,
  feature_input_hook, feature_output_hook, and optionally `transcoders`, the list of its files,
  layer i's the i-th) and layer_{i}.safetensors: W_enc (d_transcoder, d_model), W_dec
  (d_transcoder, d_model), b_enc (d_transcoder,), b_dec (d_model,), activation_function.threshold
  for JumpReLU, W_skip (d_model, d_model) for a skip transcoder. Its hooks are named inside a
  block: mlp.hook_in, the MLP's input (gpt2's h.L.ln_2), mlp.hook_out, its output (h.L.mlp.c_proj),
  or TransformerLens's (hook_resid_mid, ...).

  SAELens's saves (`Transcoder.save_model`): a directory of cfg.json (architecture transcoder,
  skip_transcoder, jumprelu_transcoder or jumprelu_skip_transcoder; d_in, d_sae, d_out; the hooks
  hook_name and hook_name_out under "metadata" since SAELens 6, at the top before) and
  sae_weights.safetensors (W_enc (d_in, d_sae), b_enc, W_dec (d_sae, d_out), b_dec, threshold,
  W_skip (d_out, d_in)). A set is a directory of such directories, one per block.

Anything that does not fit is a CheckpointError naming the file: a missing layer, a tensor of the
wrong shape or an unknown one, an unknown architecture or activation function, keys that
contradict each other, a hook that is not one of the model's sites.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from gpt2._checks import require_package
from gpt2._files import read_json_object
from gpt2.checkpoints.weights import read_safetensors
from gpt2.errors import CheckpointError, CheckpointNotFoundError, InvalidArgumentError
from gpt2.inspect.names import canonical
from gpt2.inspect.tracing import Splice
from gpt2.model.model import GPT2

CONFIG, CFG, WEIGHTS = "config.yaml", "cfg.json", "sae_weights.safetensors"
# The block's steps a transcoder may read or write: those holding one C-wide vector per position.
SITE_STEPS = (
    "resid_pre",
    "ln_1",
    "ln_1.normalized",
    "attn.c_proj",
    "resid_mid",
    "ln_2",
    "ln_2.normalized",
    "mlp.c_proj",
    "",
)
# Hook names TransformerLens's HookedTransformer lacks but circuit-tracer and SAELens write (within block L).
EXTRA_HOOKS = {"mlp.hook_in": "ln_2", "mlp.hook_out": "mlp.c_proj", "hook_mlp_in": "resid_mid"}
ARCHITECTURES = {  # SAELens's architecture -> (activation, has W_skip)
    "transcoder": ("relu", False),
    "skip_transcoder": ("relu", True),
    "jumprelu_transcoder": ("relu_jumprelu", False),
    "jumprelu_skip_transcoder": ("relu_jumprelu", True),
}


@dataclass
class Transcoder:
    """One block's transcoder: its weights (in SAELens's orientation, whichever file it came from),
    its activation function, and the sites it reads (`input_site`) and writes (`output_site`), as
    gpt2's step names. `path` is the file or directory it was read from."""

    W_enc: torch.Tensor  # (d_in, d_transcoder)
    b_enc: torch.Tensor  # (d_transcoder,)
    W_dec: torch.Tensor  # (d_transcoder, d_out)
    b_dec: torch.Tensor  # (d_out,)
    threshold: torch.Tensor | None  # (d_transcoder,): JumpReLU's, None for relu
    W_skip: torch.Tensor | None  # (d_out, d_in): a skip transcoder's, None otherwise
    layer: int
    input_site: str  # h.L.ln_2
    output_site: str  # h.L.mlp.c_proj
    activation: str = "relu"  # relu, jumprelu or relu_jumprelu (above)
    path: Path | None = None

    @property
    def d_in(self) -> int:
        return self.W_enc.shape[0]

    @property
    def d_transcoder(self) -> int:
        return self.W_enc.shape[1]

    @property
    def d_out(self) -> int:
        return self.W_dec.shape[1]

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """(..., d_in) activations at the input site -> (..., d_transcoder) feature activations."""
        pre = x.to(self.W_enc.device, self.W_enc.dtype) @ self.W_enc + self.b_enc
        if self.activation == "relu":
            return torch.relu(pre)
        kept = (pre > self.threshold).to(pre.dtype)
        return (pre if self.activation == "jumprelu" else torch.relu(pre)) * kept

    def decode(self, features: torch.Tensor) -> torch.Tensor:
        """(..., d_transcoder) features -> (..., d_out): what they write (the skip path not included)."""
        return features.to(self.W_dec.dtype) @ self.W_dec + self.b_dec

    def skip(self, x: torch.Tensor) -> torch.Tensor:
        """(..., d_in) -> (..., d_out): the skip connection's part of the output, x @ W_skip.T (0 without one)."""
        if self.W_skip is None:
            return torch.zeros(*x.shape[:-1], self.d_out, dtype=self.W_dec.dtype, device=self.W_dec.device)
        return x.to(self.W_skip.device, self.W_skip.dtype) @ self.W_skip.T

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., d_in) -> (..., d_out): the transcoder's output, decode(encode(x)) + x @ W_skip.T."""
        return self.decode(self.encode(x)) + self.skip(x)

    __call__ = forward

    def splices(self) -> list[Splice]:
        """How `trace(..., saes=[...])` splices it in: its output in place of its output site's."""
        return [Splice(self.input_site, self.output_site, self.encode, lambda f, x: self.decode(f) + self.skip(x))]


@dataclass
class TranscoderSet:
    """A transcoder for every block, layer i's at index i, all reading one step and writing
    another (`input_step`, `output_step`: ln_2 and mlp.c_proj for circuit-tracer's MLP transcoders)."""

    transcoders: list[Transcoder]
    path: Path | None = None

    def __len__(self) -> int:
        return len(self.transcoders)

    def __getitem__(self, layer: int) -> Transcoder:
        return self.transcoders[layer]

    def __iter__(self):
        return iter(self.transcoders)

    @property
    def d_transcoder(self) -> int:
        return self.transcoders[0].d_transcoder

    @property
    def input_step(self) -> str:
        return _step(self.transcoders[0].input_site)

    @property
    def output_step(self) -> str:
        return _step(self.transcoders[0].output_site)

    def splices(self) -> list[Splice]:
        """Every block's transcoder spliced in (`trace(..., saes=[tcs])`): the model with its MLPs replaced."""
        return [s for t in self.transcoders for s in t.splices()]

    def names(self) -> list[str]:
        """The sites the transcoders read and write, every block's: the names to trace."""
        return [name for t in self.transcoders for name in (t.input_site, t.output_site)]

    def check_fits(self, model: GPT2) -> None:
        """Raise unless there is one transcoder per block of `model`, each as wide as its n_embd."""
        n_layer, n_embd = model.config.n_layer, model.config.n_embd
        where = self.path if self.path is not None else "the transcoder set"
        if len(self) != n_layer:
            what = (
                f"has no transcoder for layers {', '.join(map(str, range(len(self), n_layer)))}"
                if len(self) < n_layer
                else f"has transcoders for layers {n_layer}..{len(self) - 1} too"
            )
            raise InvalidArgumentError(
                f"{where}: {what}; the model has {n_layer} blocks (n_layer={n_layer}) and needs one per block",
                "transcoders",
            )
        for t in self.transcoders:
            if t.d_in != n_embd or t.d_out != n_embd:
                raise InvalidArgumentError(
                    f"{t.path or where}: the transcoder of layer {t.layer} reads d_model={t.d_in} and writes "
                    f"{t.d_out}, but the model's n_embd={n_embd}: it was trained on another model",
                    "transcoders",
                )


def check_transcoder_set(transcoders: object, model: GPT2) -> TranscoderSet:
    """`transcoders`, checked: a TranscoderSet that fits `model` (TranscoderSet.check_fits)."""
    if not isinstance(transcoders, TranscoderSet):
        raise InvalidArgumentError(
            f"transcoders must be a TranscoderSet (gpt2.inspect.load_transcoders), got {type(transcoders).__name__}",
            "transcoders",
        )
    transcoders.check_fits(model)
    return transcoders


def _step(site: str) -> str:
    """h.3.ln_2 -> ln_2; h.3 -> ''."""
    return site.split(".", 2)[2] if site.count(".") >= 2 else ""


def parse_site(hook: object, where: Path | str, layer: int | None = None) -> tuple[int, str]:
    """A transcoder's hook as (its block, gpt2's site): blocks.L.<TransformerLens's hook>, h.L.<gpt2's
    step>, circuit-tracer's mlp.hook_in / mlp.hook_out; a hook without its block (circuit-tracer's
    feature_input_hook) is read in block `layer`."""
    name = f"blocks.{layer}.{hook}" if layer is not None and isinstance(hook, str) else hook
    match = re.fullmatch(r"(?:blocks|h)\.(\d+)(?:\.(.+))?", name) if isinstance(name, str) else None
    site = None
    if match is not None:
        block, rest = int(match[1]), match[2] or ""
        site = f"h.{block}.{EXTRA_HOOKS[rest]}" if rest in EXTRA_HOOKS else canonical(name, block + 1)
    if site is None or _step(site) not in SITE_STEPS:
        steps = ", ".join(f"h.L.{s}" if s else "h.L" for s in SITE_STEPS)
        raise CheckpointError(
            f"{where}: hook {hook!r} is not a site a transcoder reads or writes: one of {steps}, "
            f"TransformerLens's hooks of them (blocks.L.hook_resid_mid, ...) or mlp.hook_in / mlp.hook_out"
        )
    return int(match[1]), site


def load_transcoders(path: str | Path, device: str | torch.device = "cpu") -> TranscoderSet:
    """The transcoder set in `path`, on `device`: circuit-tracer's (config.yaml + layer_{i}.safetensors),
    one SAELens transcoder (cfg.json + sae_weights.safetensors), or a directory of SAELens
    transcoders, one per block. The layers must run 0..n-1 with none missing."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointNotFoundError(f"{path} is not a directory: a transcoder set is a directory")
    if (path / CONFIG).is_file():
        transcoders = _read_circuit_tracer(path)
    elif (path / CFG).is_file():
        transcoders = [load_transcoder(path)]
    else:
        found = sorted(p for p in path.iterdir() if (p / CFG).is_file())
        if not found:
            raise CheckpointNotFoundError(
                f"{path} holds neither {CONFIG} (circuit-tracer's transcoder set) nor {CFG} (a SAELens "
                f"transcoder), nor directories holding {CFG}"
            )
        transcoders = [load_transcoder(p) for p in found]
    transcoders = _in_layer_order(transcoders, path)
    for t in transcoders:
        for name in ("W_enc", "b_enc", "W_dec", "b_dec", "threshold", "W_skip"):
            if getattr(t, name) is not None:
                setattr(t, name, getattr(t, name).to(device, torch.float32))
    return TranscoderSet(transcoders, path)


def _in_layer_order(transcoders: list[Transcoder], where: Path) -> list[Transcoder]:
    """The transcoders by layer, checked: one per layer 0..n-1, all of one shape of site and width."""
    by_layer: dict[int, Transcoder] = {}
    for t in transcoders:
        if t.layer in by_layer:
            raise CheckpointError(f"{where}: {by_layer[t.layer].path} and {t.path} are both layer {t.layer}'s")
        by_layer[t.layer] = t
    missing = sorted(set(range(max(by_layer) + 1)) - set(by_layer))
    if missing:
        raise CheckpointError(f"{where}: no transcoder for layers {', '.join(map(str, missing))}")
    ordered = [by_layer[i] for i in range(len(by_layer))]
    first = ordered[0]
    for t in ordered[1:]:
        mine = (_step(t.input_site), _step(t.output_site), t.d_in, t.d_transcoder, t.W_skip is not None)
        theirs = (
            _step(first.input_site),
            _step(first.output_site),
            first.d_in,
            first.d_transcoder,
            first.W_skip is not None,
        )
        if mine != theirs:
            raise CheckpointError(
                f"{t.path}: (input, output, d_in, d_transcoder, skip) is {mine}, but layer 0's ({first.path}) "
                f"is {theirs}: a set's transcoders must agree"
            )
    return ordered


def _read_circuit_tracer(directory: Path) -> list[Transcoder]:
    """circuit-tracer's transcoder set: config.yaml, and each layer's file (its list, or layer_{i}.safetensors)."""
    yaml = require_package("yaml", "inspect", "circuit-tracer's config.yaml needs", "path")
    config_path = directory / CONFIG
    try:
        config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{config_path} is not valid YAML: {e}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_path} must hold a mapping (model_kind, feature_input_hook, ...)")
    kind = config.get("model_kind")
    if kind != "transcoder_set":
        raise CheckpointError(
            f"{config_path}: model_kind {kind!r} is not one gpt2 reads: transcoder_set (one transcoder per "
            "layer; cross-layer transcoders are not read)"
        )
    for key in ("feature_input_hook", "feature_output_hook"):
        if not isinstance(config.get(key), str):
            raise CheckpointError(
                f"{config_path}: {key} must be a hook name (mlp.hook_in, ...), got {config.get(key)!r}"
            )
    files = _layer_files(config, config_path)
    transcoders = []
    for layer, file in sorted(files.items()):
        _, input_site = parse_site(config["feature_input_hook"], config_path, layer)
        _, output_site = parse_site(config["feature_output_hook"], config_path, layer)
        transcoders.append(_read_layer_file(file, layer, input_site, output_site))
    return transcoders


def _layer_files(config: dict, config_path: Path) -> dict[int, Path]:
    """{layer: file}: config.yaml's `transcoders` list (relative to its directory), or the
    directory's layer_{i}.safetensors."""
    directory = config_path.parent
    listed = config.get("transcoders")
    if listed is None:
        files = {int(m[1]): p for p in directory.iterdir() if (m := re.fullmatch(r"layer_(\d+)\.safetensors", p.name))}
        if not files:
            raise CheckpointNotFoundError(f"{directory} has {CONFIG} but no layer_{{i}}.safetensors files")
        missing = sorted(set(range(max(files) + 1)) - set(files))
        if missing:
            raise CheckpointNotFoundError(
                f"{directory} has no {', '.join(f'layer_{i}.safetensors' for i in missing)}: every layer needs its file"
            )
        return files
    if not isinstance(listed, list) or not listed or not all(isinstance(p, str) for p in listed):
        raise CheckpointError(f"{config_path}: transcoders must be a list of file paths, got {listed!r}")
    files = {}
    for layer, entry in enumerate(listed):
        if "://" in entry:
            raise CheckpointError(
                f"{config_path}: layer {layer}'s transcoder is {entry!r}; gpt2 downloads nothing: "
                "download the files and list their local paths"
            )
        file = directory / entry
        if not file.is_file():
            raise CheckpointNotFoundError(f"{config_path}: layer {layer}'s file {file} does not exist")
        if file.suffix != ".safetensors":
            raise CheckpointError(f"{config_path}: layer {layer}'s file {file} is not a .safetensors file")
        files[layer] = file
    return files


def _read_layer_file(file: Path, layer: int, input_site: str, output_site: str) -> Transcoder:
    """One layer_{i}.safetensors of circuit-tracer's, its tensors' shapes checked against each other."""
    weights = dict(read_safetensors(file, "pt"))
    for name in weights:
        if name.startswith("activation_function.") and name != "activation_function.threshold":
            raise CheckpointError(
                f"{file}: tensor {name!r} is of an activation function gpt2 does not read: relu (no "
                "activation_function tensor) or JumpReLU (activation_function.threshold)"
            )
    known = ("W_enc", "W_dec", "b_enc", "b_dec", "activation_function.threshold", "W_skip")
    unknown = sorted(set(weights) - set(known))
    if unknown:
        raise CheckpointError(f"{file}: unknown tensors {', '.join(unknown)}; a transcoder's are {', '.join(known)}")
    for name in known[:4]:
        if name not in weights:
            raise CheckpointError(f"{file} has no tensor {name!r} (a transcoder has W_enc, W_dec, b_enc, b_dec)")
    d_transcoder, d_model = weights["b_enc"].shape[0], weights["b_dec"].shape[0]
    shapes = {"W_enc": [d_transcoder, d_model], "W_dec": [d_transcoder, d_model], "b_enc": [d_transcoder]}
    shapes |= {"b_dec": [d_model], "W_skip": [d_model, d_model], "activation_function.threshold": [d_transcoder]}
    _check_shapes(file, weights, shapes, f"b_enc and b_dec make d_transcoder={d_transcoder}, d_model={d_model}")
    threshold = weights.get("activation_function.threshold")
    return Transcoder(
        weights["W_enc"].T.contiguous(),
        weights["b_enc"],
        weights["W_dec"],
        weights["b_dec"],
        threshold,
        weights.get("W_skip"),
        layer,
        input_site,
        output_site,
        "relu" if threshold is None else "jumprelu",
        file,
    )


def _check_shapes(file: Path, weights: dict, shapes: dict[str, list[int]], why: str) -> None:
    """Raise unless each tensor present in `weights` has its shape in `shapes`."""
    for name, shape in shapes.items():
        if name in weights and list(weights[name].shape) != shape:
            raise CheckpointError(
                f"{file}: {name} has shape {list(weights[name].shape)}, but {why}: it must be {shape}"
            )


def load_transcoder(directory: str | Path) -> Transcoder:
    """One transcoder SAELens saved in `directory` (cfg.json + sae_weights.safetensors), on the CPU."""
    directory = Path(directory)
    cfg_path, weights_path = directory / CFG, directory / WEIGHTS
    for path in (cfg_path, weights_path):
        if not path.is_file():
            raise CheckpointNotFoundError(f"{path} does not exist: a SAELens transcoder has {CFG} and {WEIGHTS}")
    cfg = read_json_object(cfg_path, CheckpointError)
    architecture = cfg.get("architecture")
    if architecture not in ARCHITECTURES:
        hint = " (an SAE's: read it with gpt2.inspect.load_sae)" if architecture in ("standard", "jumprelu") else ""
        raise CheckpointError(
            f"{cfg_path}: architecture {architecture!r}{hint} is not a transcoder gpt2 reads: "
            f"{', '.join(ARCHITECTURES)}"
        )
    activation, has_skip = ARCHITECTURES[architecture]
    _check_saelens_settings(cfg, cfg_path)
    layer, input_site = parse_site(_one_value(cfg, "hook_name", cfg_path), cfg_path)
    layer_out, output_site = parse_site(_one_value(cfg, "hook_name_out", cfg_path), cfg_path)
    for key, block in (("hook_layer", layer), ("hook_layer_out", layer_out)):
        value = _one_value(cfg, key, cfg_path, required=False)
        if value is not None and value != block:
            raise CheckpointError(f"{cfg_path}: {key}={value!r} contradicts its hook, which is in block {block}")
    if layer_out != layer:
        raise CheckpointError(
            f"{cfg_path}: it reads block {layer} ({input_site}) but writes block {layer_out} ({output_site}): "
            "a transcoder set's transcoders each stand in for one block's MLP"
        )
    sizes = {}
    for key in ("d_in", "d_sae", "d_out"):
        value = cfg.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"{cfg_path}: {key} must be a positive whole number, got {value!r}")
        sizes[key] = value
    d_in, d_sae, d_out = sizes.values()
    weights = dict(read_safetensors(weights_path, "pt"))
    shapes = {"W_enc": [d_in, d_sae], "b_enc": [d_sae], "W_dec": [d_sae, d_out], "b_dec": [d_out]}
    shapes |= {"threshold": [d_sae]} if activation != "relu" else {}
    shapes |= {"W_skip": [d_out, d_in]} if has_skip else {}
    for name in shapes:
        if name not in weights:
            raise CheckpointError(f"{weights_path} has no tensor {name!r} (a {architecture} has {', '.join(shapes)})")
    unknown = sorted(set(weights) - set(shapes))
    if unknown:
        raise CheckpointError(
            f"{weights_path}: tensors {', '.join(unknown)} are not a {architecture}'s ({', '.join(shapes)})"
        )
    _check_shapes(weights_path, weights, shapes, f"{CFG}'s d_in={d_in}, d_sae={d_sae}, d_out={d_out}")
    w = {name: weights.get(name) for name in ("W_enc", "b_enc", "W_dec", "b_dec", "threshold", "W_skip")}
    return Transcoder(*w.values(), layer, input_site, output_site, activation, directory)


def _one_value(cfg: dict, key: str, cfg_path: Path, required: bool = True):
    """cfg.json's `key`, at the top (SAELens before 6.0) or under "metadata" (since): both, if they differ, an error."""
    meta = cfg.get("metadata") or {}
    if not isinstance(meta, dict):
        raise CheckpointError(f"{cfg_path}: metadata must be an object, got {meta!r}")
    values = [place[key] for place in (cfg, meta) if place.get(key) is not None]
    if len(values) == 2 and values[0] != values[1]:
        raise CheckpointError(f"{cfg_path}: {key} is {values[0]!r} at the top but {values[1]!r} under metadata")
    if not values and required:
        raise CheckpointError(
            f"{cfg_path} has no {key}: a transcoder's input and output hooks are hook_name, hook_name_out"
        )
    return values[0] if values else None


def _check_saelens_settings(cfg: dict, cfg_path: Path) -> None:
    """Raise on SAELens settings gpt2's encoder does not apply (it would compute something else)."""
    settings = (
        ("apply_b_dec_to_input", (False, None)),
        ("normalize_activations", ("none", "expected_average_only_in", None)),  # the latter: nothing at run time
        ("reshape_activations", ("none", None)),
        ("activation_fn", ("relu", None)),
        ("activation_fn_str", ("relu", None)),
    )
    for key, allowed in settings:
        if cfg.get(key) not in allowed:
            raise CheckpointError(
                f"{cfg_path}: {key}={cfg.get(key)!r} is not read by gpt2's transcoders "
                f"(it reads {', '.join(repr(a) for a in allowed if a is not None)})"
            )
