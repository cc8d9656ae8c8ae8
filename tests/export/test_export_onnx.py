"""ONNX export with the KV cache: ONNX Runtime's logits equal transformers', greedy text through its cache
equals gpt2 generate's, int8 agrees on the top token; bad input is one line."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from helpers import hf_and_ours, logits_of

from gpt2 import Tokenizer
from gpt2.cli import main
from gpt2.errors import GPT2Error, UnwritablePathError
from gpt2.examples import corpus_text, model_directory
from gpt2.export.onnx import export_onnx
from gpt2.generation.generate import TextGeneration
from gpt2.model.model import GPT2

ENC = Tokenizer.gpt2()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A small model of GPT-2's vocabulary, ours, and its ONNX export's session; transformers' model last."""
    directory = tmp_path_factory.mktemp("model")
    hf, model = hf_and_ours(directory, seed=2, vocab_size=50257, n_positions=64, n_embd=48, n_layer=3, n_head=3)
    out = export_onnx(model, tmp_path_factory.mktemp("export") / "onnx")
    return model, ort.InferenceSession(str(out / "model.onnx")), directory, out, hf


def empty_past(model: GPT2, batch: int) -> dict[str, np.ndarray]:
    c = model.config
    shape = (batch, c.n_head, 0, c.n_embd // c.n_head)
    return {
        f"past_key_values.{i}.{kind}": np.zeros(shape, np.float32)
        for i in range(c.n_layer)
        for kind in ("key", "value")
    }


def run(
    session, ids: np.ndarray, mask: np.ndarray, past: dict[str, np.ndarray]
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """One call, as optimum's loaders make it: position ids from the mask; returns logits and the next past."""
    positions = np.clip(mask.cumsum(-1) - 1, 0, None)[:, -ids.shape[1] :]
    outputs = session.run(None, {"input_ids": ids, "attention_mask": mask, "position_ids": positions, **past})
    names = [o.name for o in session.get_outputs()]
    return outputs[0], {
        name.replace("present", "past_key_values"): value for name, value in zip(names[1:], outputs[1:])
    }


def test_the_graph_has_optimums_names_and_its_files_are_beside_it(exported):
    model, session, _, out, _ = exported
    inputs = [i.name for i in session.get_inputs()]
    assert inputs[:3] == ["input_ids", "attention_mask", "position_ids"] and inputs[3:5] == [
        "past_key_values.0.key",
        "past_key_values.0.value",
    ]
    assert [o.name for o in session.get_outputs()][:3] == ["logits", "present.0.key", "present.0.value"] and len(
        inputs
    ) == 3 + 2 * 3
    assert {p.name for p in out.iterdir()} == {
        "model.onnx",
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.json",
        "merges.txt",
    }


@pytest.mark.parametrize("length", [1, 7, 64])
def test_logits_equal_transformers(exported, length):
    """ONNX Runtime's logits of the export equal transformers' on the weights it was made from."""
    model, session, _, _, hf = exported
    ids = torch.randint(0, 50257, (2, length), generator=torch.Generator().manual_seed(length))
    logits, _ = run(session, ids.numpy(), np.ones((2, length), np.int64), empty_past(model, 2))
    assert np.abs(logits - logits_of(hf, ids).numpy()).max() < 1e-4


def test_a_left_padded_batch_and_its_next_step_equal_each_row_alone(exported):
    """Prompts of 5 and 9 tokens, the shorter left-padded (attention_mask 0): each row's logits, and
    those of one more token through the returned cache, equal ours on the row alone."""
    model, session, _, _, _ = exported
    prompts = [ENC.encode("The cat sat."), ENC.encode("Once upon a time there was a dog")]
    width = max(map(len, prompts))
    ids = np.array([[0] * (width - len(p)) + p for p in prompts])
    mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    logits, past = run(session, ids, mask, empty_past(model, 2))
    after = np.array([[11], [13]])
    step, _ = run(session, after, np.concatenate([mask, np.ones((2, 1), np.int64)], 1), past)
    for b, prompt in enumerate(prompts):
        with torch.no_grad():
            alone = model(torch.tensor([prompt + [int(after[b, 0])]])).numpy()[0]
        assert np.abs(logits[b, width - len(prompt) :] - alone[:-1]).max() < 1e-4
        assert np.abs(step[b, 0] - alone[-1]).max() < 1e-4


def test_greedy_text_through_onnx_runtimes_cache_is_gpt2_generates(exported, capsys):
    model, session, directory, _, _ = exported
    prompt = ENC.encode("The meaning of life is")
    ids, past, new = np.array([prompt]), empty_past(model, 1), []
    mask = np.ones((1, len(prompt)), np.int64)
    for _ in range(24):
        logits, past = run(session, ids, mask, past)
        new.append(int(logits[0, -1].argmax()))
        ids, mask = np.array([[new[-1]]]), np.ones((1, mask.shape[1] + 1), np.int64)
    generation = TextGeneration(model, ENC, "The meaning of life is", max_new_tokens=24, temperature=0)
    list(generation)
    assert new == generation.rows[0].tokens
    capsys.readouterr()
    argv = [
        "generate",
        "The meaning of life is",
        "--model",
        str(directory),
        "--max-new-tokens",
        "24",
        "--temperature",
        "0",
        "--no-stream",
    ]
    assert main(argv) == 0 and capsys.readouterr().out == ENC.decode(new) + "\n"


def test_int8_agrees_with_ours_on_the_top_token_of_the_shipped_trained_model(tmp_path):
    """shakespeare_char (trained here): its int8 export's next character is ours at >= 99% of the
    positions of 32 windows of Shakespeare's text, from a file under half the size."""
    model = GPT2.from_pretrained(model_directory("shakespeare_char"), device="cpu")
    out = export_onnx(model, tmp_path / "int8", quantize="int8")
    session = ort.InferenceSession(str(out / "model.onnx"))
    text = corpus_text("shakespeare")
    ids = np.array([model.tokenizer.encode(text[i * 5000 : i * 5000 + 64]) for i in range(32)])
    logits, _ = run(session, ids, np.ones(ids.shape, np.int64), empty_past(model, 32))
    with torch.no_grad():
        ours = model(torch.tensor(ids)).numpy()
    agreement = (logits.argmax(-1) == ours.argmax(-1)).mean()
    assert agreement >= 0.99 and (out / "model.onnx").stat().st_size < 0.5 * (model.num_parameters() * 4)


def test_bad_exports_are_one_line_and_leave_nothing(exported, tmp_path, capsys, monkeypatch):
    model, _, directory, _, _ = exported
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    for flags, message in [
        (
            ["--format", "onnx", "--out", str(tmp_path / "taken")],
            f"{tmp_path / 'taken'} already exists: give a new directory",
        ),
        (["--format", "onnx", "--out", str(tmp_path / "x"), "--dtype", "q8_0"], "--dtype q8_0 is a GGUF type"),
        (["--format", "gguf", "--out", str(tmp_path / "x.gguf"), "--quantize", "int8"], "--quantize is ONNX Runtime's"),
        (["--format", "tflite", "--out", str(tmp_path / "x")], "argument --format: invalid choice: 'tflite'"),
        (["--format", "onnx", "--out", "/proc/gpt2-export"], "cannot write into /proc"),
    ]:
        assert main(["export", "--model", str(directory), *flags]) == 2
        err = capsys.readouterr().err
        assert err.startswith("gpt2: error: ") and message in err and err.count("\n") == 1, err
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == [
        "taken"
    ]
    with pytest.raises(GPT2Error, match="quantize must be one of int8"):
        export_onnx(model, tmp_path / "y", quantize="int4")
    monkeypatch.setattr(GPT2, "num_parameters", lambda self: 774_030_080)  # gpt2-large's
    with pytest.raises(
        GPT2Error, match=r"this model's float32 weights are 2.9 GiB, and an ONNX file holds at most 2 GiB"
    ):
        export_onnx(model, tmp_path / "y")
    monkeypatch.undo()
    with pytest.raises(GPT2Error, match="ONNX export takes a float32 model; this one's weights are bfloat16"):
        export_onnx(GPT2.from_pretrained(directory, device="cpu", dtype="bfloat16"), tmp_path / "y")


def test_a_failed_export_leaves_no_directory(exported, tmp_path, monkeypatch):
    model = exported[0]
    monkeypatch.setattr(torch.onnx, "export", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("the exporter broke")))
    with pytest.raises(RuntimeError, match="the exporter broke"):
        export_onnx(model, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []
    assert isinstance(UnwritablePathError("x"), GPT2Error)
