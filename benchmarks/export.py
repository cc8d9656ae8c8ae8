"""gpt2's CPU decoding against ONNX Runtime's, on the same weights (issue 40).

    .venv/bin/python benchmarks/export.py [--quick] [--rounds 3] [--tokens 128]

The 124M shape (random weights, transformers' initialisation, seed 0) is exported with `gpt2
export --format onnx` (float32, and --quantize int8: weight-only, blocks of 32) and, for a
second int8 peer, with ONNX Runtime's own dynamic quantization (int8 weights and activations).
Each configuration runs in a fresh process, batch 1: a 16-token prompt, then 128 greedy tokens,
each step one token through the KV cache; ONNX Runtime's loop keeps the cache in its own
OrtValues through I/O binding (no copy into NumPy per step, which its docs say costs GPT-2 much).
Rounds alternate the configurations; reported: tokens/s of the decode steps (median of the
rounds), the prompt's time, and the process's peak resident memory above its memory before it
loaded anything but the libraries (VmHWM). Greedy tokens of every configuration are compared
with gpt2's float32 ones.

--quick: a 2-layer model of GPT-2's vocabulary, 16 tokens, one round: a smoke run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = [
    "gpt2 float32",
    "gpt2 bfloat16",
    "gpt2 int8",
    "onnxruntime float32",
    "onnxruntime int8 (gpt2 export)",
    "onnxruntime int8 (dynamic)",
]
PROMPT = list(range(1000, 1016))  # 16 token ids


def peak_mb() -> float:
    """VmHWM, the process's peak resident memory so far, in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak() -> None:
    """Start VmHWM again from the present resident size (Linux: writing 5 to clear_refs)."""
    Path("/proc/self/clear_refs").write_text("5")


def ours(directory: str, dtype: str, new: int) -> tuple[list[int], float, float]:
    import torch

    from gpt2.generation.decoding import Decoder, Row
    from gpt2.generation.sampling import Sampling
    from gpt2.model.model import GPT2

    model = GPT2.from_pretrained(directory, device="cpu", dtype=dtype)
    times = []
    for _ in range(2):  # the first run warms up (the kernels' first calls, each shape's first pass), untimed
        decoder, row, times = Decoder(model.engine(1, len(PROMPT) + new)), Row(PROMPT, new, Sampling(0)), []
        decoder.add(row)
        with torch.inference_mode():
            while decoder.busy:
                start = time.perf_counter()
                decoder.step()  # the first: the prompt and the first token; then one token each
                times.append(time.perf_counter() - start)
    return row.tokens, (new - 1) / sum(times[1:new]), times[0]


def onnxruntime_loop(path: str, new: int) -> tuple[list[int], float, float]:
    import onnxruntime as ort

    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for _ in range(2):  # the first run warms up, untimed
        tokens, rate, prompt_s = _onnxruntime_run(session, new)
    return tokens, rate, prompt_s


def _onnxruntime_run(session, new: int) -> tuple[list[int], float, float]:
    import numpy as np
    import onnxruntime as ort

    inputs = [i for i in session.get_inputs() if i.name.startswith("past_key_values")]
    outputs = [o.name for o in session.get_outputs()]
    heads, head_size = inputs[0].shape[1], inputs[0].shape[3]
    past = {i.name: ort.OrtValue.ortvalue_from_numpy(np.zeros((1, heads, 0, head_size), np.float32)) for i in inputs}
    ids, tokens, times = np.array([PROMPT]), [], []
    for step in range(new):
        start = time.perf_counter()
        length = len(PROMPT) + step
        binding = session.io_binding()
        binding.bind_cpu_input("input_ids", ids)
        binding.bind_cpu_input("attention_mask", np.ones((1, length), np.int64))
        binding.bind_cpu_input("position_ids", np.arange(length - ids.shape[1], length)[None])
        for name, value in past.items():
            binding.bind_ortvalue_input(name, value)
        for name in outputs:
            binding.bind_output(name, "cpu")
        session.run_with_iobinding(binding)
        values = binding.get_outputs()
        tokens.append(int(values[0].numpy()[0, -1].argmax()))
        past = {name.replace("present", "past_key_values"): value for name, value in zip(outputs[1:], values[1:])}
        ids = np.array([[tokens[-1]]])
        times.append(time.perf_counter() - start)
    return tokens, (new - 1) / sum(times[1:]), times[0]


def one(config: str, model_dir: str, onnx_dir: str, new: int) -> dict:
    """Run one configuration in this process (a fresh one): its tokens, speed and peak memory."""
    import numpy  # noqa: F401  the libraries are loaded before the baseline
    import onnxruntime  # noqa: F401
    import torch  # noqa: F401

    import gpt2.model.model  # noqa: F401

    reset_peak()
    base = peak_mb()
    if config.startswith("gpt2"):
        tokens, rate, prompt_s = ours(model_dir, config.split()[1], new)
    else:
        name = {
            "onnxruntime float32": "float32",
            "onnxruntime int8 (gpt2 export)": "int8",
            "onnxruntime int8 (dynamic)": "dynamic",
        }[config]
        tokens, rate, prompt_s = onnxruntime_loop(str(Path(onnx_dir) / name / "model.onnx"), new)
    return {"tokens": tokens, "rate": rate, "prompt_s": prompt_s, "peak_mb": peak_mb() - base}


def prepare(root: Path, quick: bool) -> tuple[str, str]:
    """The model's directory, and its exports: float32/, int8/ (gpt2 export) and dynamic/ (ONNX Runtime's)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if quick:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from helpers import make_hf_model

        model_dir = str(root / "model")
        make_hf_model(vocab_size=50257, n_positions=256, n_embd=64, n_layer=2, n_head=2).save_pretrained(model_dir)
    else:
        from _common import random_124m

        model_dir = random_124m()[1]
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from gpt2.export.onnx import export_onnx
    from gpt2.model.model import GPT2

    model = GPT2.from_pretrained(model_dir, device="cpu")
    export_onnx(model, root / "onnx" / "float32")
    export_onnx(model, root / "onnx" / "int8", quantize="int8")
    (root / "onnx" / "dynamic").mkdir()
    quantize_dynamic(
        str(root / "onnx" / "float32" / "model.onnx"),
        str(root / "onnx" / "dynamic" / "model.onnx"),
        weight_type=QuantType.QInt8,
    )
    return model_dir, str(root / "onnx")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: a small model, few tokens, one round")
    parser.add_argument("--rounds", type=int, default=None, help="rounds, alternating (default: 3; quick: 1)")
    parser.add_argument("--tokens", type=int, default=None, help="new tokens (default: 128; quick: 16)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # config|model_dir|onnx_dir|tokens: a child process's run
    args = parser.parse_args()
    if args.one:
        config, model_dir, onnx_dir, new = args.one.split("|")
        print(json.dumps(one(config, model_dir, onnx_dir, int(new))))
        return
    new, rounds = args.tokens or (16 if args.quick else 128), args.rounds or (1 if args.quick else 3)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, onnx_dir = prepare(Path(tmp), args.quick)
        results: dict[str, list[dict]] = {config: [] for config in CONFIGS}
        for _ in range(rounds):
            for config in CONFIGS:
                done = subprocess.run(
                    [sys.executable, __file__, "--one", f"{config}|{model_dir}|{onnx_dir}|{new}"],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                results[config].append(json.loads(done.stdout.splitlines()[-1]))
    import torch

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"torch {torch.__version__}, "
        f"onnxruntime {__import__('onnxruntime').__version__}; "
        f"{'quick: a 2-layer model' if args.quick else 'the 124M shape'}; "
        f"batch 1, a 16-token prompt, {new} greedy tokens; {rounds} round(s), medians\n"
    )
    reference = results["gpt2 float32"][0]["tokens"]
    base = statistics.median(r["rate"] for r in results["gpt2 float32"])
    print(
        "| configuration | decode tokens/s | against gpt2 float32 | prompt (ms) | "
        "peak memory above the libraries (MB) | "
        "greedy tokens equal gpt2 float32's |"
    )
    print("|---|---|---|---|---|---|")
    for config, runs in results.items():
        rate = statistics.median(r["rate"] for r in runs)
        equal = sum(a == b for a, b in zip(runs[0]["tokens"], reference))
        print(
            f"| {config} | {rate:.1f} | {rate / base:.2f}x | "
            f"{statistics.median(r['prompt_s'] for r in runs) * 1e3:.0f} | "
            f"{statistics.median(r['peak_mb'] for r in runs):.0f} | {equal} of {len(reference)} |"
        )


if __name__ == "__main__":
    main()
