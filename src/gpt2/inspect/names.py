"""The names of a traced pass's steps: gpt2's own, and TransformerLens's, understood as aliases.

gpt2 names each step after the checkpoint's weights, as transformers and the seeds do
(`h.3.attn.pattern`); a researcher coming from TransformerLens writes `blocks.3.attn.hook_pattern`,
or `cache["pattern", 3]`. Every function that takes a step's name (trace's names and patch, the
patching sites, an SAE's hook) reads both; what gpt2 shows is always its own name.

    TransformerLens                      gpt2                   gpt2's shape (TransformerLens's)
    hook_embed                           wte                    (T, C)
    hook_pos_embed                       wpe                    (T, C)
    blocks.L.hook_resid_pre              h.L.resid_pre          (T, C)
    blocks.L.ln1.hook_scale              h.L.ln_1.scale         (T, 1)
    blocks.L.ln1.hook_normalized         h.L.ln_1.normalized    (T, C)        (x - mean) / scale, before g and b
    (TransformerLens: the LayerNorm's output; the same after fold_ln)  h.L.ln_1  (T, C)
    blocks.L.attn.hook_q / _k / _v       h.L.attn.q / .k / .v   (H, T, d)     ((T, H, d))
    blocks.L.attn.hook_attn_scores       h.L.attn.scores        (H, T, T)
    blocks.L.attn.hook_pattern           h.L.attn.pattern       (H, T, T)
    blocks.L.attn.hook_z                 h.L.attn.z             (H, T, d)     ((T, H, d))
    blocks.L.attn.hook_result            h.L.attn.result        (H, T, C)     ((T, H, C))
    blocks.L.hook_attn_out               h.L.attn.c_proj        (T, C)
    blocks.L.hook_resid_mid              h.L.resid_mid          (T, C)
    blocks.L.ln2.hook_scale              h.L.ln_2.scale         (T, 1)
    blocks.L.ln2.hook_normalized         h.L.ln_2.normalized    (T, C)
    blocks.L.mlp.hook_pre                h.L.mlp.c_fc           (T, 4C)
    blocks.L.mlp.hook_post               h.L.mlp.gelu           (T, 4C)
    blocks.L.hook_mlp_out                h.L.mlp.c_proj         (T, C)
    blocks.L.hook_resid_post             h.L                    (T, C)
    ln_final.hook_scale                  ln_f.scale             (T, 1)
    ln_final.hook_normalized             ln_f.normalized        (T, C)

Shapes drop the batch dimension of a single sequence; a batch puts B first. Per-head steps keep
gpt2's heads-first layout (the model's own), which TransformerLens writes positions-first.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from gpt2.errors import InputTypeError, InvalidArgumentError

# Each block's steps, in the order the pass takes them ("" is the block's output, h.{i}).
BLOCK_STEPS = (
    "resid_pre",
    "ln_1.scale",
    "ln_1.normalized",
    "ln_1",
    "attn.c_attn",
    "attn.q",
    "attn.k",
    "attn.v",
    "attn.scores",
    "attn.pattern",
    "attn.z",
    "attn.result",
    "attn.c_proj",
    "resid_mid",
    "ln_2.scale",
    "ln_2.normalized",
    "ln_2",
    "mlp.c_fc",
    "mlp.gelu",
    "mlp.c_proj",
    "",
)
# Steps recorded only when asked for by name: large (per head), or the same numbers as another step.
ON_REQUEST = frozenset(
    {
        "resid_pre",
        "ln_1.scale",
        "ln_1.normalized",
        "attn.q",
        "attn.k",
        "attn.v",
        "attn.scores",
        "attn.z",
        "attn.result",
        "resid_mid",
        "ln_2.scale",
        "ln_2.normalized",
        "ln_f.scale",
        "ln_f.normalized",
    }
)

# TransformerLens's hook names, blocks.L.<key> (or <key> outside the blocks) -> gpt2's step.
TL_BLOCK = {
    "hook_resid_pre": "resid_pre",
    "ln1.hook_scale": "ln_1.scale",
    "ln1.hook_normalized": "ln_1.normalized",
    "attn.hook_q": "attn.q",
    "attn.hook_k": "attn.k",
    "attn.hook_v": "attn.v",
    "attn.hook_attn_scores": "attn.scores",
    "attn.hook_pattern": "attn.pattern",
    "attn.hook_z": "attn.z",
    "attn.hook_result": "attn.result",
    "hook_attn_out": "attn.c_proj",
    "hook_resid_mid": "resid_mid",
    "ln2.hook_scale": "ln_2.scale",
    "ln2.hook_normalized": "ln_2.normalized",
    "mlp.hook_pre": "mlp.c_fc",
    "mlp.hook_post": "mlp.gelu",
    "hook_mlp_out": "mlp.c_proj",
    "hook_resid_post": "",
}
TL_GLOBAL = {
    "hook_embed": "wte",
    "hook_pos_embed": "wpe",
    "ln_final.hook_scale": "ln_f.scale",
    "ln_final.hook_normalized": "ln_f.normalized",
}
# cache["pattern", 3]: TransformerLens's short names (utils.get_act_name's, its aliases too).
SHORT = {
    **{key.rsplit("hook_", 1)[1]: step for key, step in TL_BLOCK.items() if "ln" not in key},
    "attn": "attn.pattern",
    "attn_logits": "attn.scores",
    "query": "attn.q",
    "key": "attn.k",
    "value": "attn.v",
    "mlp_pre": "mlp.c_fc",
    "mlp_post": "mlp.gelu",
}
SHORT_GLOBAL = {"embed": "wte", "pos_embed": "wpe", "scale": "ln_f.scale", "normalized": "ln_f.normalized"}
LN_KINDS = {"ln1": "ln_1", "ln2": "ln_2", "ln_1": "ln_1", "ln_2": "ln_2"}


def activation_names(n_layer: int, *, on_request: bool = True) -> list[str]:
    """The names of a model's steps, in the order of its forward pass; on_request=False leaves
    out those recorded only when asked for (ON_REQUEST: q, k, v, scores, z, ...)."""
    names = ["wte", "wpe"]
    for i in range(n_layer):
        names += [f"h.{i}.{step}" if step else f"h.{i}" for step in BLOCK_STEPS if on_request or step not in ON_REQUEST]
    return names + (["ln_f.scale", "ln_f.normalized", "ln_f"] if on_request else ["ln_f"])


def step_of(name: str) -> str:
    """A name's step within its block ("attn.pattern" of h.3.attn.pattern, "" of h.3), or the name
    itself outside the blocks (wte, wpe, ln_f.scale, ln_f)."""
    match = re.fullmatch(r"h\.\d+(?:\.(.+))?", name)
    return name if match is None else match[1] or ""


def canonical(name: str, n_layer: int) -> str | None:
    """gpt2's name for `name` (its own, or TransformerLens's hook name), None where it names no step."""
    if not isinstance(name, str):
        return None
    match = re.fullmatch(r"blocks\.(\d+)\.(.+)", name)
    if match is not None and match[2] in TL_BLOCK:
        step = TL_BLOCK[match[2]]
        name = f"h.{match[1]}.{step}" if step else f"h.{match[1]}"
    name = TL_GLOBAL.get(name, name)
    return name if name in set(activation_names(n_layer)) else None


def short_name(kind: str, layer: int | None = None, ln: str | None = None) -> str:
    """gpt2's name for a TransformerLens-style short name: ("pattern", 3) -> h.3.attn.pattern,
    ("scale", 3, "ln1") -> h.3.ln_1.scale, ("resid_post", 3) -> h.3, ("embed",) -> wte; gpt2's own
    block steps work too (("mlp.c_fc", 3))."""
    if not isinstance(kind, str):
        raise InputTypeError(f"a short name's kind must be a string, got {type(kind).__name__}", "name")
    if layer is None:
        if kind in SHORT_GLOBAL:
            return SHORT_GLOBAL[kind]
        raise InvalidArgumentError(
            f"{kind!r} needs a layer: cache[{kind!r}, L]; the names without one are {', '.join(SHORT_GLOBAL)}", "name"
        )
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise InvalidArgumentError(f"a short name's layer must be a whole number, got {layer!r}", "layer")
    if kind in ("scale", "normalized"):
        if ln not in LN_KINDS:
            raise InvalidArgumentError(f"({kind!r}, {layer}) needs which LayerNorm: 'ln1' or 'ln2', got {ln!r}", "name")
        return f"h.{layer}.{LN_KINDS[ln]}.{kind}"
    step = SHORT.get(kind, kind if kind in BLOCK_STEPS else None)
    if step is None:
        known = ", ".join(sorted({*SHORT, *(s for s in BLOCK_STEPS if s)}))
        raise InvalidArgumentError(f"unknown short name {kind!r}: the names are {known}, scale, normalized", "name")
    return f"h.{layer}.{step}" if step else f"h.{layer}"


def check_names(param: str, n_layer: int, names: Iterable[str] | Callable[[str], bool]) -> list[str]:
    """gpt2's names of `names` (each gpt2's or TransformerLens's), or of the steps a filter
    function of the name picks (it sees gpt2's names, then TransformerLens's where one exists)."""
    every = activation_names(n_layer)
    if callable(names):
        return [name for name in every if names(name) or names(canonical_to_tl(name))]
    if isinstance(names, str):
        raise InputTypeError(f"{param} must be a collection of activation names, got the string {names!r}", param)
    out = []
    for name in names:
        ours = canonical(name, n_layer)
        if ours is None:
            blocks = ", ".join(f"h.{{i}}.{step}" if step else "h.{i}" for step in BLOCK_STEPS)
            raise InvalidArgumentError(
                f"{param}: unknown activation {name!r}; the names are wte, wpe, {blocks} "
                f"(i in 0..{n_layer - 1}), ln_f.scale, ln_f, or TransformerLens's "
                "(blocks.{i}.attn.hook_pattern, ...)",
                param,
            )
        out.append(ours)
    return list(dict.fromkeys(out))


def canonical_to_tl(name: str) -> str:
    """TransformerLens's hook name for gpt2's `name` (h.3.attn.pattern -> blocks.3.attn.hook_pattern);
    the name itself where TransformerLens has none (h.3.attn.c_attn)."""
    for tl, ours in TL_GLOBAL.items():
        if ours == name:
            return tl
    match = re.fullmatch(r"h\.(\d+)(?:\.(.+))?", name)
    if match is not None:
        for key, step in TL_BLOCK.items():
            if step == (match[2] or ""):
                return f"blocks.{match[1]}.{key}"
    return name
