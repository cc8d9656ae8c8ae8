"""Interventions on transcoder features: test what an attribution graph says by changing a feature
and running the model again; and a feature's decoder direction as a steering vector.

    result = gpt2.inspect.feature_intervention(model, ids, tcs, [(1, 5, 123, 0.0)])  # zero feature 123 of block 1 at 5
    result.top_changes(5)        # the top logits at the last position, before and after
    steer = gpt2.inspect.steering_vector(tcs, 123, 8.0, layer=1)   # {1: 8 * W_dec[123]}
    gpt2.generate_text(model, tokenizer, "The", steer=steer)         # generation steered by it

circuit-tracer's `feature_intervention`: the model itself runs (its real MLPs, not the
transcoders), and at each intervened block the MLP's output gets (value - a) * W_dec[f] at the
position, a the feature's activation there in this run (earlier interventions change it). With
`freeze_attention` (the default), every attention pattern keeps its value on the unchanged prompt,
as the graph's linear model has them; without, the change reaches later positions through
attention too. The activations returned are every block's transcoder features in the changed run
(at an intervened block, the ones before its change). As in a graph, position 0 has no features:
they read 0 there (setting one at position 0 adds value * W_dec[f]).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gpt2._checks import boolean, int_between, is_real
from gpt2.errors import InputTypeError, InvalidArgumentError
from gpt2.inspect.saes import SAE
from gpt2.inspect.tracing import token_ids, trace
from gpt2.inspect.transcoders import TranscoderSet, check_transcoder_set
from gpt2.model.model import GPT2

Intervention = tuple[int, "int | slice", int, float]  # (layer, position, feature, value)


@dataclass
class InterventionResult:
    """A run with features changed: `logits` (T, V) and `activations` (n_layer, T, d_transcoder),
    the unchanged run's `clean_logits`, and the prompt's `ids` and `tokens`."""

    ids: list[int]
    tokens: list[str] | None
    logits: torch.Tensor
    clean_logits: torch.Tensor
    activations: torch.Tensor
    decode: object = None  # the model's tokenizer's decode, for the report's tokens

    def top_changes(self, k: int = 5, position: int = -1) -> list[dict]:
        """The k most probable next tokens at `position` before the change and after, each
        {"id", "token", "before", "after"} (probabilities), the unchanged run's first, then any new."""
        before = self.clean_logits[position].float().softmax(-1)
        after = self.logits[position].float().softmax(-1)
        ids = before.topk(k).indices.tolist()
        ids += [i for i in after.topk(k).indices.tolist() if i not in ids]
        return [
            {
                "id": i,
                "token": str(i) if self.decode is None else self.decode([i]),
                "before": before[i].item(),
                "after": after[i].item(),
            }
            for i in ids
        ]


def feature_intervention(
    model: GPT2,
    ids: str | Sequence[int] | torch.Tensor,
    transcoders: TranscoderSet,
    interventions: Sequence[Intervention],
    *,
    freeze_attention: bool = True,
    prepend_bos: bool = False,
) -> InterventionResult:
    """Run `model` on `ids` with each (layer, position, feature, value) of `interventions` set: the
    feature's activation at that position (an int, or a slice of positions) made `value` (0 zeroes
    it; value = s * its activation scales it), its block's MLP output moved by the difference times
    its decoder row (the module's docstring). Graph prompts start with <|endoftext|>: give the
    graph's `ids` to change the run the graph describes."""
    check_transcoder_set(transcoders, model)
    ids, tokens = token_ids(model, ids, boolean("prepend_bos", prepend_bos))
    by_layer = check_interventions(interventions, model.config.n_layer, len(ids), transcoders.d_transcoder)
    freeze_attention = boolean("freeze_attention", freeze_attention)
    n_layer = model.config.n_layer
    patterns = [f"h.{i}.attn.pattern" for i in range(n_layer)]
    clean = trace(model, ids, names=patterns if freeze_attention else [])
    features: list[torch.Tensor | None] = [None] * n_layer

    def encode(layer: int):
        def read(x: torch.Tensor) -> torch.Tensor:  # (T, C): the transcoder's input, unchanged
            features[layer] = transcoders[layer].encode(x)
            features[layer][0] = 0  # position 0 is no node of a graph (circuit-tracer's): read as 0
            return x

        return read

    def change(layer: int):
        def add(out: torch.Tensor) -> torch.Tensor:  # (T, C): the MLP's output
            acts = features[layer]  # (T, F): this run's
            deltas = torch.zeros_like(acts)
            for position, feature, value in by_layer[layer]:  # a later one of the same feature wins
                deltas[position, feature] = value - acts[position, feature]
            return out + (deltas @ transcoders[layer].W_dec).to(out.dtype)

        return add

    step = transcoders.input_step
    patch = {f"h.{i}.{step}": encode(i) for i in range(n_layer)}
    patch |= {f"h.{i}.mlp.c_proj": change(i) for i in by_layer}
    if freeze_attention:
        patch |= {name: (lambda value: lambda _: value)(clean.activations[name]) for name in patterns}
    with torch.no_grad():
        changed = trace(model, ids, patch=patch, names=[])
    decode = None if model.tokenizer is None else model.tokenizer.decode
    return InterventionResult(ids, tokens, changed.logits, clean.logits, torch.stack(features), decode)


def check_interventions(
    interventions: object, n_layer: int, T: int, d_transcoder: int
) -> dict[int, list[tuple[int | slice, int, float]]]:
    """(layer, position, feature, value) tuples, checked -> {layer: [(position, feature, value)]}."""
    if isinstance(interventions, (str, bytes)) or not isinstance(interventions, Sequence):
        raise InputTypeError(
            "interventions must be a list of (layer, position, feature, value) tuples", "interventions"
        )
    by_layer: dict[int, list] = {}
    for i, item in enumerate(interventions):
        if not isinstance(item, (tuple, list)) or len(item) != 4:
            raise InvalidArgumentError(
                f"interventions[{i}] must be (layer, position, feature, value), got {item!r}", "interventions"
            )
        layer, position, feature, value = item
        layer = int_between(f"interventions[{i}]'s layer", layer, 0, n_layer - 1, "a layer index")
        if not isinstance(position, slice):
            position = int_between(f"interventions[{i}]'s position", position, -T, T - 1, "a position")
        feature = int_between(f"interventions[{i}]'s feature", feature, 0, d_transcoder - 1, "a feature index")
        if not is_real(value):
            raise InvalidArgumentError(f"interventions[{i}]'s value must be a number, got {value!r}", "interventions")
        by_layer.setdefault(layer, []).append((position, feature, float(value)))
    return by_layer


def steering_vector(
    dictionary, feature: int, coefficient: float = 1.0, layer: int | None = None
) -> dict[int, torch.Tensor]:
    """{block: coefficient * W_dec[feature]}: a feature's decoder direction as a steering vector for
    `GPT2.steered` and generation's `steer` (added to the residual stream leaving the block, at every
    position). `dictionary`: an SAE of a site in the stream between blocks (h.L, h.L.mlp.c_proj, whose
    output joins the stream as the block ends, or h.L.resid_pre: block L - 1's), a transcoder, or a
    transcoder set and the `layer` of the feature's transcoder."""
    if isinstance(dictionary, TranscoderSet):
        if layer is None:
            raise InvalidArgumentError("steering_vector: a transcoder set needs the layer of the feature", "layer")
        dictionary = dictionary[int_between("layer", layer, 0, len(dictionary) - 1, "a layer index")]
    if isinstance(dictionary, SAE):
        site, W_dec = dictionary.site, dictionary.W_dec
    elif hasattr(dictionary, "output_site") and hasattr(dictionary, "W_dec"):
        site, W_dec = dictionary.output_site, dictionary.W_dec
    else:
        raise InputTypeError(
            f"steering_vector takes an SAE, a transcoder or a transcoder set, got {type(dictionary).__name__}",
            "dictionary",
        )
    block = _block_leaving(site)
    feature = int_between("feature", feature, 0, W_dec.size(0) - 1, "a feature index")
    if not is_real(coefficient):
        raise InvalidArgumentError(f"coefficient must be a number, got {coefficient!r}", "coefficient")
    return {block: float(coefficient) * W_dec[feature].float()}


def _block_leaving(site: str) -> int:
    """The block whose output stream a vector written at `site` joins (the module's steering sites)."""
    parts = site.split(".")
    if len(parts) == 2:  # h.L: the stream leaving block L
        return int(parts[1])
    step, block = ".".join(parts[2:]), int(parts[1])
    if step == "mlp.c_proj":
        return block
    if step == "resid_pre" and block > 0:
        return block - 1
    raise InvalidArgumentError(
        f"steering_vector: the dictionary's site {site} is not in the stream between blocks; steer an SAE of h.L, "
        "h.L.resid_pre (L > 0) or h.L.mlp.c_proj, or a transcoder",
        "dictionary",
    )
