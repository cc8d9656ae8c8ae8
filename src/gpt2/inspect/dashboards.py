"""Feature dashboards: where in a data set a transcoder feature fires most, with the tokens around it.

    windows = gpt2.inspect.read_windows("data/shakespeare", n=64, T=64)   # (64, 64) ids, a prepared data set's
    tcs = gpt2.inspect.load_transcoders("gpt2-transcoders")
    top = gpt2.inspect.top_contexts(model, tcs, windows, layer=3, feature=1234, k=10)
    top[0]   # {"row", "position", "activation", "ids", "tokens", "activations"}: its strongest firing

A context is the up-to-`context` ids before the position and the token itself, with the
feature's activation at each of them: what a feature's dashboard shows (Anthropic's, Neuronpedia's),
read over the windows of one's own data.
"""

from __future__ import annotations

import os

import torch

from gpt2._checks import int_between, positive_int
from gpt2.data.files import open_data
from gpt2.errors import DataError, InvalidArgumentError
from gpt2.inspect.tracing import trace
from gpt2.inspect.transcoders import TranscoderSet, check_transcoder_set
from gpt2.model.model import GPT2


def read_windows(data_dir: str | os.PathLike, n: int, T: int, model: GPT2 | None = None) -> torch.Tensor:
    """The first n windows of T ids (one after another, none overlapping) of the prepared data in
    `data_dir` (`gpt2.data.files.open_data`): its train split, or its val split where train holds
    no window -> (n', T) int64, n' = n or as many as the split holds. With `model`, the data must be
    of its vocabulary (`TokenData.check_vocabulary`) and T within its context."""
    n, T = positive_int("n", n), positive_int("T", T)
    data = open_data(data_dir)
    if model is not None:
        data.check_vocabulary(model.tokenizer, model.config.n_vocab, "given")
        int_between("T", T, 1, model.config.n_ctx, "a window's length")
    split = next((name for name in ("train", "val") if len(getattr(data, name)) >= T), None)
    if split is None:
        raise DataError(
            f"the data in {data.directory} holds {len(data.train)} train and {len(data.val)} val ids, "
            f"too few for a window of T={T}: give more text, or a smaller T",
            "T",
        )
    ids = getattr(data, split)
    count = min(n, len(ids) // T)
    return torch.from_numpy(ids[: count * T].astype("int64")).view(count, T)


def top_contexts(
    model: GPT2,
    transcoders: TranscoderSet,
    windows: torch.Tensor,
    layer: int,
    feature: int,
    k: int = 10,
    context: int = 8,
    batch_size: int = 8,
) -> list[dict]:
    """The k highest activations of `feature` of layer `layer`'s transcoder over every (row,
    position) of `windows` (N, T) ids where it fires (is not 0), highest first (ties: the earlier
    row and position first), each as {"row", "position", "activation", "ids": the up-to-`context`
    ids before it and its own, "tokens": their text (None without a tokenizer), "activations": the
    feature's activation at each of them}. The model runs over `batch_size` windows at a time."""
    check_transcoder_set(transcoders, model)
    layer = int_between("layer", layer, 0, len(transcoders) - 1, "a block's number (an integer)")
    feature = int_between("feature", feature, 0, transcoders.d_transcoder - 1, "a feature's index (an integer)")
    k, batch_size = positive_int("k", k), positive_int("batch_size", batch_size)
    context = int_between("context", context, 0, None, "a number of ids (an integer)")
    _check_windows(windows)
    acts = feature_activations(model, transcoders, windows, layer, feature, batch_size)  # (N, T)
    values, order = torch.sort(acts.flatten(), descending=True, stable=True)
    order = order[values != 0][:k]
    tokenizer = model.tokenizer
    found = []
    for index in order.tolist():
        row, position = divmod(index, windows.size(1))
        start = max(0, position - context)
        ids = windows[row, start : position + 1].tolist()
        found.append(
            {
                "row": row,
                "position": position,
                "activation": acts[row, position].item(),
                "ids": ids,
                "tokens": None if tokenizer is None else [tokenizer.decode([i]) for i in ids],
                "activations": acts[row, start : position + 1].tolist(),
            }
        )
    return found


def _check_windows(windows: object) -> None:
    """Raise unless `windows` is a non-empty (N, T) tensor of integers (the model checks the ids)."""
    if isinstance(windows, torch.Tensor) and windows.dim() == 2 and windows.numel():
        if not windows.dtype.is_floating_point and windows.dtype != torch.bool:
            return
    what = (
        f"a {windows.dtype} tensor of shape {list(windows.shape)}"
        if isinstance(windows, torch.Tensor)
        else type(windows).__name__
    )
    raise InvalidArgumentError(f"windows must be a non-empty (N, T) tensor of token ids, got {what}", "windows")


def feature_activations(
    model: GPT2, transcoders: TranscoderSet, windows: torch.Tensor, layer: int, feature: int, batch_size: int
) -> torch.Tensor:
    """(N, T) float32 on the CPU: the feature's activation at each id of `windows`."""
    site = transcoders[layer].input_site  # h.{layer}.{input_step}
    rows = []
    with torch.no_grad():
        for batch in windows.split(batch_size):
            x = trace(model, batch, names=[site]).activations[site]  # (B, T, C)
            rows.append(transcoders[layer].encode(x)[..., feature].float().cpu())
    return torch.cat(rows)
