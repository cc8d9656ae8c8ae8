"""Feature dashboards (gpt2.inspect.dashboards): a transcoder feature's top contexts against a reference
written here on transformers' GPT2LMHeadModel (the MLP's input read by a forward hook on ln_2, the
features by circuit-tracer's encode written out in tests/helpers.py), and windows of prepared data
against the token files read with NumPy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import (
    VOCAB,
    circuit_tracer_forward,
    circuit_tracer_layer,
    hf_and_ours,
    tiktoken_from_files,
    write_circuit_tracer,
)

from gpt2 import DataError, GPT2Error
from gpt2.inspect import load_transcoders, read_windows, top_contexts

CONFIG = dict(n_positions=32, n_embd=32, n_layer=2, n_head=4)
N, T = 6, 16
SILENT = 5  # a feature of layer 1 that never fires: its encoder bias far below 0


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(transformers' model, gpt2's, the transcoders' weights by layer, the loaded set, windows (N, T))."""
    hf, model = hf_and_ours(tmp_path_factory.mktemp("dashboards-model"), seed=3, vocab_size=50257, **CONFIG)
    layers = {i: circuit_tracer_layer(20 + i, jumprelu=i == 1, skip=False, b_enc=-0.6) for i in range(2)}
    layers[1]["b_enc"][SILENT] = -100.0
    directory = tmp_path_factory.mktemp("dashboards-transcoders")
    write_circuit_tracer(directory, layers)
    windows = torch.randint(0, 50257, (N, T), generator=torch.Generator().manual_seed(0))
    return hf, model, layers, load_transcoders(directory), windows


def reference_activations(hf, weights: dict, windows: torch.Tensor, layer: int, feature: int) -> torch.Tensor:
    """(N, T): the feature's activations, transformers' ln_2 output of block `layer` through circuit-tracer's encode."""
    seen = []
    handle = hf.transformer.h[layer].ln_2.register_forward_hook(lambda m, args, out: seen.append(out))
    with torch.no_grad():
        hf(windows)
    handle.remove()
    acts, _ = circuit_tracer_forward(seen[0], weights)  # (N, T, d_transcoder)
    return acts[..., feature]


def reference_top(acts: torch.Tensor, windows: torch.Tensor, k: int, context: int) -> list[dict]:
    """The k highest nonzero activations, highest first, ties by row then position; each context written out."""
    cells = [(acts[r, p].item(), r, p) for r in range(acts.size(0)) for p in range(acts.size(1)) if acts[r, p] != 0]
    top = sorted(cells, key=lambda c: (-c[0], c[1], c[2]))[:k]
    return [
        {
            "row": r,
            "position": p,
            "activation": a,
            "ids": windows[r, max(0, p - context) : p + 1].tolist(),
            "activations": acts[r, max(0, p - context) : p + 1].tolist(),
        }
        for a, r, p in top
    ]


def assert_same(found: list[dict], expected: list[dict]) -> None:
    assert [(c["row"], c["position"], c["ids"]) for c in found] == [
        (e["row"], e["position"], e["ids"]) for e in expected
    ]
    for c, e in zip(found, expected):
        assert c["activation"] == pytest.approx(e["activation"], abs=1e-5)
        assert c["activations"] == pytest.approx(e["activations"], abs=1e-5)
        assert c["activation"] == c["activations"][-1]


@pytest.mark.parametrize("layer, feature", [(0, 7), (1, 11), (1, 30)])
def test_top_contexts_equal_transformers_through_circuit_tracers_encode(setup, layer, feature):
    hf, model, layers, tcs, windows = setup
    acts = reference_activations(hf, layers[layer], windows, layer, feature)
    assert 10 < int((acts != 0).sum()) < N * T  # the feature fires here and there: ranking and filtering both matter
    expected = reference_top(acts, windows, 10, 8)
    found = top_contexts(model, tcs, windows, layer, feature)
    assert len(found) == 10
    assert_same(found, expected)
    assert [c["activation"] for c in found] == sorted((c["activation"] for c in found), reverse=True)
    assert any(len(c["ids"]) < 9 for c in found) or all(c["position"] >= 8 for c in found)
    enc = tiktoken_from_files(VOCAB / "encoder.json", VOCAB / "vocab.bpe")
    for c in found:
        assert c["tokens"] == [enc.decode([i]) for i in c["ids"]]
    # another batching, context and k: the same ranking
    assert_same(
        top_contexts(model, tcs, windows, layer, feature, k=3, context=2, batch_size=1),
        reference_top(acts, windows, 3, 2),
    )
    assert_same(
        top_contexts(model, tcs, windows, layer, feature, k=500, context=0, batch_size=4),
        reference_top(acts, windows, 500, 0),
    )


def test_a_feature_that_never_fires_has_no_context(setup):
    hf, model, layers, tcs, windows = setup
    assert not reference_activations(hf, layers[1], windows, 1, SILENT).any()
    assert top_contexts(model, tcs, windows, 1, SILENT) == []


def test_without_a_tokenizer_the_tokens_are_none(tmp_path):
    _, model = hf_and_ours(tmp_path / "model", seed=4, vocab_size=101, **CONFIG)
    assert model.tokenizer is None
    layers = {i: circuit_tracer_layer(i, jumprelu=False, skip=False, b_enc=-0.3) for i in range(2)}
    write_circuit_tracer(tmp_path / "set", layers)
    windows = torch.randint(0, 101, (3, 8), generator=torch.Generator().manual_seed(1))
    found = top_contexts(model, load_transcoders(tmp_path / "set"), windows, 0, 2, k=4)
    assert found and all(c["tokens"] is None for c in found)


@pytest.mark.parametrize(
    "change, param, message",
    [
        ({"layer": 2}, "layer", "layer must be a block's number (an integer) from 0 to 1, got 2"),
        ({"layer": -1}, "layer", "from 0 to 1, got -1"),
        ({"feature": 48}, "feature", "feature must be a feature's index (an integer) from 0 to 47, got 48"),
        ({"feature": 1.5}, "feature", "got 1.5"),
        ({"k": 0}, "k", "k must be a positive"),
        ({"context": -1}, "context", "context must be a number of ids (an integer) from 0 up, got -1"),
        ({"windows": torch.zeros(3, dtype=torch.long)}, "windows", "windows must be a non-empty (N, T) tensor"),
        ({"windows": torch.zeros(2, 3)}, "windows", "tensor of token ids, got a torch.float32 tensor of shape [2, 3]"),
        ({"transcoders": "set"}, "transcoders", "transcoders must be a TranscoderSet"),
    ],
)
def test_bad_arguments_are_errors_naming_them(setup, change, param, message):
    _, model, _, tcs, windows = setup
    arguments = {"transcoders": tcs, "windows": windows, "layer": 0, "feature": 1, **change}
    with pytest.raises(GPT2Error) as e:
        top_contexts(model, **arguments)
    assert e.value.param == param and message in str(e.value)


def write_token_files(directory, train: np.ndarray, val: np.ndarray):
    """nanoGPT's train.bin and val.bin (GPT-2's ids, uint16), written by hand."""
    directory.mkdir()
    train.astype("<u2").tofile(directory / "train.bin")
    val.astype("<u2").tofile(directory / "val.bin")
    return directory


def test_read_windows_takes_the_first_windows_of_the_train_split(tmp_path):
    rng = np.random.default_rng(0)
    train, val = rng.integers(0, 50257, 100), rng.integers(0, 50257, 40)
    data = write_token_files(tmp_path / "data", train, val)
    windows = read_windows(data, 3, 16)
    assert windows.dtype == torch.int64 and windows.tolist() == train[:48].reshape(3, 16).tolist()
    assert read_windows(data, 64, 16).tolist() == train[:96].reshape(6, 16).tolist()  # as many as the split holds
    short = write_token_files(tmp_path / "short", train[:10], val)  # no window of 16 in train: val's
    assert read_windows(short, 64, 16).tolist() == val[:32].reshape(2, 16).tolist()
    with pytest.raises(DataError, match="holds 10 train and 40 val ids, too few for a window of T=64") as e:
        read_windows(short, 2, 64)
    assert e.value.param == "T"


def test_read_windows_checks_the_data_against_a_model(setup, tmp_path):
    _, model = hf_and_ours(tmp_path / "model", seed=4, vocab_size=101, **CONFIG)
    data = write_token_files(tmp_path / "data", np.arange(200), np.arange(50))  # GPT-2's ids (nanoGPT's files)
    with pytest.raises(GPT2Error, match="a vocabulary of 50257 ids, more than the 101"):
        read_windows(data, 2, 16, model=model)
    gpt2_vocabulary = setup[1]  # n_ctx 32
    assert read_windows(data, 2, 32, model=gpt2_vocabulary).tolist() == np.arange(64).reshape(2, 32).tolist()
    with pytest.raises(GPT2Error, match="T must be a window's length from 1 to 32, got 33"):
        read_windows(data, 2, 33, model=gpt2_vocabulary)
    with pytest.raises(GPT2Error, match="n must be a positive integer, got 0"):
        read_windows(data, 0, 16)
