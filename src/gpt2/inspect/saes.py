"""Sparse autoencoders saved by SAELens, read at the sites of a trace.

    sae = gpt2.inspect.load_sae("my-sae")            # cfg.json + sae_weights.safetensors
    features = gpt2.inspect.sae_features(model, sae, "The dog chased the")   # (T, d_sae)
    sae.decode(features)                              # (T, C): the reconstruction

An SAE directory, as SAELens's `SAE.save_model` writes it: `cfg.json` (d_in, d_sae,
architecture, apply_b_dec_to_input, normalize_activations, and the hook name, at the top in
SAELens before 6.0 and under "metadata" since) and `sae_weights.safetensors` (W_enc (d_in, d_sae),
b_enc (d_sae,), W_dec (d_sae, d_in), b_dec (d_in,), and threshold (d_sae,) for JumpReLU). The
encoder is SAELens's (sae_lens/saes/sae.py `process_sae_in`, standard_sae.py, jumprelu_sae.py,
topk_sae.py, batchtopk_sae.py):

    x' = normalise(x) - b_dec          (b_dec only where apply_b_dec_to_input)
    pre = x' @ W_enc + b_enc
    f = relu(pre)                      standard
    f = relu(pre) * (pre > threshold)  jumprelu
    f = relu(pre), all but its k largest zeroed                       topk (k in cfg.json)
    x_hat = f @ W_dec + b_dec, the normalisation undone

A topk SAE with rescale_acts_by_decoder_norm (cfg.json) ranks pre * |W_dec row| and decodes
f / |W_dec row|, as though its decoder rows had norm 1. A batchtopk SAE keeps the k largest over a
whole training batch; SAELens saves it for inference (`save_inference_model`) as the jumprelu whose
threshold is its learnt `topk_threshold` for every feature. A batchtopk training save (architecture
"batchtopk", the tensor topk_threshold) is read as that jumprelu, its decoder norms folded into the
encoder where rescale_acts_by_decoder_norm, as SAELens's inference save does. cfg.json keys that
contradict each other or the tensors are errors naming both, never ignored.

The hook names are TransformerLens's (as SAELens writes them) or gpt2's, of any step whose
vectors are per position (`gpt2.inspect.names`): most often blocks.L.hook_resid_pre (the stream
entering block L, `h.L.resid_pre`), hook_resid_mid (after its attention is added), hook_resid_post
(leaving it, `h.L`), hook_attn_out (`h.L.attn.c_proj`), hook_mlp_out (`h.L.mlp.c_proj`), and
attn.hook_z (`h.L.attn.z`, read with its heads side by side, (T, H * d), as SAELens reads it).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from gpt2._files import read_json_object
from gpt2.checkpoints.weights import read_safetensors
from gpt2.errors import CheckpointError, CheckpointNotFoundError, InputTypeError, InvalidArgumentError
from gpt2.inspect.names import canonical, step_of
from gpt2.inspect.tracing import PER_HEAD, SQUARE, Splice, Trace, trace
from gpt2.model.model import GPT2

CFG, WEIGHTS = "cfg.json", "sae_weights.safetensors"
ARCHITECTURES = ("standard", "jumprelu", "topk", "batchtopk")
HOOKS = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_out")
# SAELens's normalize_activations: "expected_average_only_in" scales nothing at run time (SAELens
# folds its factor into the weights when it downloads a release; a saved directory holds them so).
NORMALISATIONS = ("none", "expected_average_only_in", "constant_norm_rescale", "layer_norm")
# The tensors of sae_weights.safetensors, each architecture's (SAELens's state_dict).
TENSORS = {
    "standard": ("W_enc", "b_enc", "W_dec", "b_dec"),
    "jumprelu": ("W_enc", "b_enc", "W_dec", "b_dec", "threshold"),
    "topk": ("W_enc", "b_enc", "W_dec", "b_dec"),
    "batchtopk": ("W_enc", "b_enc", "W_dec", "b_dec", "topk_threshold"),
}


@dataclass
class SAE:
    """One sparse autoencoder: its weights, its hook (`hook_name`, read as `layer` and `hook`), and
    how it encodes. `path` is the directory it was read from."""

    W_enc: torch.Tensor  # (d_in, d_sae)
    b_enc: torch.Tensor  # (d_sae,)
    W_dec: torch.Tensor  # (d_sae, d_in)
    b_dec: torch.Tensor  # (d_in,)
    threshold: torch.Tensor | None  # (d_sae,): JumpReLU's (and batchtopk's), None for standard, topk
    hook_name: str
    layer: int | None  # the block of its site; None outside the blocks (wte, ln_f, ...)
    site: str  # gpt2's name of the step it reads (h.3.resid_pre)
    architecture: str = "standard"
    apply_b_dec_to_input: bool = True
    normalize_activations: str = "none"
    path: Path | None = None
    k: int | None = None  # topk's: how many features each vector keeps
    rescale_acts_by_decoder_norm: bool = False  # topk's: rank and decode as though |W_dec rows| = 1

    @property
    def d_in(self) -> int:
        return self.W_enc.shape[0]

    @property
    def d_sae(self) -> int:
        return self.W_enc.shape[1]

    def _normalise(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """SAELens's run-time normalisation of the input, and what undoes it (scale, shift)."""
        if self.normalize_activations == "constant_norm_rescale":  # every vector to norm sqrt(d_in)
            coeff = math.sqrt(self.d_in) / x.norm(dim=-1, keepdim=True)
            return x * coeff, (1 / coeff, torch.zeros_like(coeff))
        if self.normalize_activations == "layer_norm":  # SAELens's: x.std unbiased, eps added to it
            mu = x.mean(dim=-1, keepdim=True)
            std = (x - mu).std(dim=-1, keepdim=True)
            return (x - mu) / (std + 1e-5), (std, mu)
        return x, None

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """(..., d_in) activations -> (..., d_sae) feature activations, as SAELens's `SAE.encode`."""
        x, _ = self._normalise(x.to(self.W_enc.device, self.W_enc.dtype))
        pre = (x - self.b_dec * self.apply_b_dec_to_input) @ self.W_enc + self.b_enc  # (..., d_sae)
        if self.k is not None:
            if self.rescale_acts_by_decoder_norm:
                pre = pre * self.W_dec.norm(dim=-1)
            top = pre.topk(self.k, dim=-1, sorted=False)
            return torch.zeros_like(pre).scatter(-1, top.indices, torch.relu(top.values))
        acts = torch.relu(pre)
        return acts if self.threshold is None else acts * (pre > self.threshold).to(acts.dtype)

    def splices(self) -> list[Splice]:
        """How `trace(..., saes=[sae])` splices it in: its reconstruction in place of its site."""
        return [Splice(self.site, self.site, self.encode, self.decode)]

    def decode(self, features: torch.Tensor, x: torch.Tensor | None = None) -> torch.Tensor:
        """(..., d_sae) features -> (..., d_in), the reconstruction. An SAE that normalises its
        input (constant_norm_rescale, layer_norm) needs that input, `x`, to undo it."""
        features = features.to(self.W_dec.device, self.W_dec.dtype)
        if self.k is not None and self.rescale_acts_by_decoder_norm:
            features = features / self.W_dec.norm(dim=-1)
        out = features @ self.W_dec + self.b_dec
        if self.normalize_activations in ("constant_norm_rescale", "layer_norm"):
            if x is None:
                raise InvalidArgumentError(
                    f"this SAE normalises its input ({self.normalize_activations}): give decode "
                    f"the activations x that were encoded, to undo it",
                    "x",
                )
            scale, shift = self._normalise(x.to(self.W_enc.device, self.W_enc.dtype))[1]
            out = out * scale + shift
        return out

    def check_fits(self, model: GPT2) -> None:
        """Raise unless the SAE reads a site `model` has, of its width."""
        where = self.path / CFG if self.path is not None else "the SAE"
        n_layer = model.config.n_layer
        if self.layer is not None and not 0 <= self.layer < n_layer:
            raise InvalidArgumentError(
                f"{where}: hook {self.hook_name!r} is at block {self.layer}, but the model has "
                f"blocks 0..{n_layer - 1} (n_layer={n_layer})",
                "sae",
            )
        width = site_width(self.site, model.config)
        if self.d_in != width:
            raise InvalidArgumentError(
                f"{where}: the SAE reads vectors of d_in={self.d_in}, but the model's {self.site} "
                f"has {width} (n_embd={model.config.n_embd}): it was trained on another model",
                "sae",
            )

    def names(self) -> list[str]:
        """The trace's activations the SAE's input is made of: its site."""
        return [self.site]

    def input_of(self, t: Trace) -> torch.Tensor:
        """(T, d_in): the SAE's input, read from a trace that recorded its site (the residual
        stream entering or inside a block may be read from the steps it is the sum of); per-head
        steps with their heads side by side, (H, T, d) -> (T, H * d), as SAELens reads hook_z."""
        step, value = step_of(self.site), t.activations.get(self.site)
        if value is None and step == "resid_pre":
            value = t.residual(self.layer)
        elif value is None and step == "resid_mid" and f"h.{self.layer}.attn.c_proj" in t.activations:
            value = t.residual(self.layer) + t.activations[f"h.{self.layer}.attn.c_proj"]
        if value is None:
            raise InvalidArgumentError(
                f"the SAE's hook {self.hook_name!r} needs {self.site}, which this trace "
                f"did not record: trace with names including it",
                "trace",
            )
        return value.transpose(-3, -2).flatten(-2) if step in PER_HEAD else value


def site_width(site: str, config) -> int:
    """The width of the vectors a site holds per position (a per-head step's heads side by side)."""
    C, step = config.n_embd, step_of(site)
    if step in SQUARE or step.endswith("scale"):
        raise InvalidArgumentError(f"an SAE cannot read {site}: its vectors are not per position", "sae")
    return {"attn.c_attn": 3 * C, "mlp.c_fc": 4 * C, "mlp.gelu": 4 * C, "attn.result": config.n_head * C}.get(step, C)


def parse_hook(hook_name: object, where: Path | str = "the SAE") -> tuple[int | None, str]:
    """An SAE's hook, TransformerLens's name (blocks.L.hook_resid_pre) or gpt2's (h.L.resid_pre),
    as (L, gpt2's name); L is None outside the blocks."""
    layer = re.match(r"(?:blocks|h)\.(\d+)\b", hook_name) if isinstance(hook_name, str) else None
    site = canonical(hook_name, 1 + int(layer[1]) if layer else 1) if isinstance(hook_name, str) else None
    if site is None:
        raise CheckpointError(
            f"{where}: hook {hook_name!r} is not one gpt2 reads: give one of gpt2's steps (h.L.resid_pre, ...) "
            f"or TransformerLens's hooks (blocks.L.{{{', '.join(HOOKS)}}}, ...)"
        )
    return (None if layer is None else int(layer[1])), site


def load_sae(directory: str | Path, device: str | torch.device = "cpu") -> SAE:
    """The SAE SAELens saved in `directory` (cfg.json + sae_weights.safetensors), on `device`."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointNotFoundError(
            f"{directory} is not a directory: an SAE is a directory holding {CFG} and {WEIGHTS}"
        )
    cfg_path, weights_path = directory / CFG, directory / WEIGHTS
    for path in (cfg_path, weights_path):
        if not path.is_file():
            raise CheckpointNotFoundError(f"{path} does not exist: an SAE saved by SAELens has {CFG} and {WEIGHTS}")
    cfg = read_json_object(cfg_path, CheckpointError)
    hook_name, layer, site = _read_hook(cfg, cfg_path)
    d_in, d_sae = _read_sizes(cfg, cfg_path)
    architecture, k, rescale = _read_architecture(cfg, cfg_path, d_sae)
    norm = cfg.get("normalize_activations", "none")
    norm = ("expected_average_only_in" if norm else "none") if isinstance(norm, bool) else norm  # SAELens before 6.0
    if norm not in NORMALISATIONS:
        raise CheckpointError(f"{cfg_path}: normalize_activations {norm!r} is not one of {', '.join(NORMALISATIONS)}")
    apply_b_dec = cfg.get("apply_b_dec_to_input", True)
    if not isinstance(apply_b_dec, bool):
        raise CheckpointError(f"{cfg_path}: apply_b_dec_to_input must be true or false, got {apply_b_dec!r}")
    weights = _read_weights(weights_path, cfg_path, d_in, d_sae, architecture)
    if architecture == "batchtopk":
        weights = _batchtopk_as_jumprelu(weights, rescale)
    weights = {name: w.to(device, torch.float32) for name, w in weights.items()}
    return SAE(
        weights["W_enc"],
        weights["b_enc"],
        weights["W_dec"],
        weights["b_dec"],
        weights.get("threshold"),
        hook_name,
        layer,
        site,
        architecture,
        apply_b_dec,
        norm,
        directory,
        k,
        rescale and architecture == "topk",  # batchtopk's is folded into its weights
    )


def _read_hook(cfg: dict, cfg_path: Path) -> tuple[str, int | None, str]:
    """The SAE's hook as (hook_name, L, gpt2's name): SAELens 6 keeps it under "metadata", before
    at the top (hook_name or hook_point, with hook_layer); where several are given they must agree."""
    meta = cfg.get("metadata") or cfg.get("meta") or {}
    meta = meta if isinstance(meta, dict) else {}
    given = [(key, value) for key, value in (*cfg.items(), *((f"metadata.{k}", v) for k, v in meta.items()))]
    names = [(key, value) for key, value in given if key in ("hook_name", "hook_point", "metadata.hook_name")]
    for key, value in names[1:]:
        if value != names[0][1]:
            raise CheckpointError(f"{cfg_path}: {names[0][0]} {names[0][1]!r} and {key} {value!r} disagree")
    hook_name = names[0][1] if names else None
    layer, site = parse_hook(hook_name, cfg_path)
    for key, value in given:
        if key in ("hook_layer", "metadata.hook_layer") and layer is not None and value != layer:
            raise CheckpointError(
                f"{cfg_path}: {key} {value!r} disagrees with hook_name {hook_name!r}, at block {layer}"
            )
    reshape = cfg.get("reshape_activations", "none")
    if reshape not in ("none", "hook_z"):
        raise CheckpointError(f"{cfg_path}: reshape_activations {reshape!r} is not one of none, hook_z")
    if reshape == "hook_z" and step_of(site) != "attn.z":
        raise CheckpointError(
            f"{cfg_path}: reshape_activations 'hook_z' is for SAEs of attn.hook_z, but hook_name is {hook_name!r}"
        )
    return hook_name, layer, site


def _read_sizes(cfg: dict, cfg_path: Path) -> tuple[int, int]:
    """cfg.json's d_in and d_sae, each a positive whole number."""
    d_in, d_sae = cfg.get("d_in"), cfg.get("d_sae")
    for name, value in (("d_in", d_in), ("d_sae", d_sae)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"{cfg_path}: {name} must be a positive whole number, got {value!r}")
    return d_in, d_sae


def _read_architecture(cfg: dict, cfg_path: Path, d_sae: int) -> tuple[str, int | None, bool]:
    """(architecture, topk's k, rescale_acts_by_decoder_norm). Before SAELens 6.0 a topk SAE was a
    standard one whose activation_fn was "topk", its k in activation_fn_kwargs."""
    architecture, k = cfg.get("architecture", "standard"), cfg.get("k")
    activation = cfg.get("activation_fn", cfg.get("activation_fn_str"))
    if activation == "topk":
        if architecture not in ("standard", "topk"):
            raise CheckpointError(f"{cfg_path}: activation_fn 'topk' and architecture {architecture!r} disagree")
        kwargs = cfg.get("activation_fn_kwargs")
        kwarg_k = kwargs.get("k") if isinstance(kwargs, dict) else None
        if k is not None and kwarg_k is not None and k != kwarg_k:
            raise CheckpointError(f"{cfg_path}: k {k!r} and activation_fn_kwargs.k {kwarg_k!r} disagree")
        architecture, k = "topk", kwarg_k if k is None else k
    elif activation not in (None, "relu"):
        raise CheckpointError(f"{cfg_path}: activation_fn {activation!r} is not one gpt2 reads: relu, topk")
    if architecture not in ARCHITECTURES:
        raise CheckpointError(
            f"{cfg_path}: architecture {architecture!r} is not one gpt2 reads: {', '.join(ARCHITECTURES)}"
        )
    rescale = cfg.get("rescale_acts_by_decoder_norm", False)
    if not isinstance(rescale, bool):
        raise CheckpointError(f"{cfg_path}: rescale_acts_by_decoder_norm must be true or false, got {rescale!r}")
    if rescale and architecture in ("standard", "jumprelu"):
        raise CheckpointError(
            f"{cfg_path}: rescale_acts_by_decoder_norm is true, but a {architecture} SAE does not rescale "
            f"(topk and batchtopk do)"
        )
    if architecture == "topk" and (isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= d_sae):
        raise CheckpointError(f"{cfg_path}: a topk SAE's k must be a whole number in 1..d_sae={d_sae}, got {k!r}")
    if architecture in ("standard", "jumprelu") and k is not None:
        raise CheckpointError(f"{cfg_path}: k is {k!r}, but a {architecture} SAE has no k (topk's)")
    return architecture, (k if architecture == "topk" else None), rescale


def _read_weights(path: Path, cfg_path: Path, d_in: int, d_sae: int, architecture: str) -> dict[str, torch.Tensor]:
    """The tensors of sae_weights.safetensors: those of the architecture, each of the shape cfg.json's
    d_in and d_sae make it; another tensor is an error (SAELens's all-ones scaling_factor aside)."""
    weights = dict(read_safetensors(path, "pt"))  # a truncated or corrupt file: CheckpointError naming it
    shapes = {"W_enc": [d_in, d_sae], "b_enc": [d_sae], "W_dec": [d_sae, d_in], "b_dec": [d_in]}
    shapes |= {"threshold": [d_sae], "topk_threshold": []}
    names = TENSORS[architecture]
    for name in names:
        if name not in weights:
            raise CheckpointError(f"{path} has no tensor {name!r} (a {architecture} SAE has {', '.join(names)})")
        if list(weights[name].shape) != shapes[name]:
            raise CheckpointError(
                f"{path}: {name} has shape {list(weights[name].shape)}, but {cfg_path.name}'s "
                f"d_in={d_in} and d_sae={d_sae} make it {shapes[name]}"
            )
    for name, w in weights.items():
        if name not in names and not (name == "scaling_factor" and bool((w == 1).all())):
            raise CheckpointError(
                f"{path} has a tensor {name!r}, which a {architecture} SAE ({cfg_path.name}'s architecture) "
                f"does not have: it has {', '.join(names)}"
            )
    return {name: weights[name] for name in names}


def _batchtopk_as_jumprelu(weights: dict[str, torch.Tensor], rescale: bool) -> dict[str, torch.Tensor]:
    """A batchtopk SAE's training tensors as SAELens saves it for inference: a jumprelu whose every
    threshold is topk_threshold, the decoder's row norms folded into the encoder where it ranked
    pre * |W_dec row| (rescale_acts_by_decoder_norm), so that pre itself is what the threshold meets."""
    W_enc, b_enc, W_dec = (weights[name].float() for name in ("W_enc", "b_enc", "W_dec"))
    threshold = torch.full_like(b_enc, weights["topk_threshold"].item())  # (d_sae,)
    if rescale:
        norm = W_dec.norm(dim=-1).clamp(min=1e-8)  # (d_sae,)
        W_enc, b_enc, W_dec = W_enc * norm, b_enc * norm, W_dec / norm[:, None]
    return {"W_enc": W_enc, "b_enc": b_enc, "W_dec": W_dec, "b_dec": weights["b_dec"], "threshold": threshold}


@torch.no_grad()
def sae_features(
    source: Trace | GPT2, sae: SAE, text: str | list[int] | None = None, *, prepend_bos: bool = False
) -> torch.Tensor:
    """(T, d_sae): each token's feature activations ((B, T, d_sae) of a batch). `source` a trace
    that recorded the SAE's site (`sae.names()`; a default trace records the residual stream's and
    the blocks' outputs), or a model with the text (or ids, or a batch: as `trace` takes them) to
    trace, recording only those; prepend_bos as `trace` takes it."""
    if not isinstance(sae, SAE):
        raise InputTypeError(f"sae must be an SAE (gpt2.inspect.load_sae), got {type(sae).__name__}", "sae")
    if isinstance(source, GPT2):
        if text is None:
            raise InvalidArgumentError("give the text (or token ids) to trace the model on", "text")
        sae.check_fits(source)
        source = trace(source, text, names=sae.names(), prepend_bos=prepend_bos)
    elif not isinstance(source, Trace):
        raise InputTypeError(f"sae_features takes a Trace or a GPT2 model, got {type(source).__name__}", "source")
    else:
        sae.check_fits(source.model)
    return sae.encode(sae.input_of(source))


def top_features(features: torch.Tensor, k: int = 5) -> list[list[tuple[int, float]]]:
    """Per position, its k most active features as (id, value), largest first: those above 0 only."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidArgumentError(f"k must be a positive whole number, got {k!r}", "k")
    best = features.float().topk(min(k, features.size(-1)), dim=-1)
    return [
        [(i, v) for i, v in zip(ids, values) if v > 0]
        for ids, values in zip(best.indices.tolist(), best.values.tolist())
    ]
