"""llama.cpp against gpt2 on the same GGUF weights (issue 40): greedy tokens and CPU decode speed.

    .venv/bin/python benchmarks/llama_cpp.py --node-modules DIR [--rounds 3] [--tokens 128]

llama.cpp runs through node-llama-cpp's prebuilt binaries (`npm install node-llama-cpp` in DIR,
with its @node-llama-cpp/linux-x64 package; llama-cpp-python would build llama.cpp from source).
The 124M shape (random weights, transformers' initialisation, seed 0) is exported with `gpt2
export --format gguf` as f32 and q8_0; each file is decoded greedily by llama.cpp (2 threads, an
f32 KV cache) and by gpt2 reading the same file (`GPT2.from_pretrained("model.gguf")`, float32,
and the same file read as `--dtype int8` for q8_0's width), batch 1, a 16-token prompt then 128
tokens, rounds alternating, medians. Greedy tokens are compared with gpt2's float32 ones.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from export import PROMPT, ours  # noqa: E402  gpt2's timed greedy decode, and the prompt

SCRIPT = """
import {getLlama, LlamaLogLevel} from "node-llama-cpp";
const [path, prompt, steps] = [process.argv[2], JSON.parse(process.argv[3]), Number(process.argv[4])];
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath: path});
let result;
for (let run = 0; run < 2; run++) {  // the first run warms up
    const context = await model.createContext({contextSize: 256, sequences: 1, threads: 2, flashAttention: false,
        experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32"});
    const sequence = context.getSequence();
    const tokens = [], times = [];
    let last = performance.now();
    for await (const token of sequence.evaluate(prompt, {temperature: 0})) {
        const now = performance.now();
        times.push(now - last); last = now;
        tokens.push(token);
        if (tokens.length >= steps) break;
    }
    const decode = times.slice(1).reduce((a, b) => a + b, 0) / 1000;
    result = {tokens, rate: (steps - 1) / decode, prompt_s: times[0] / 1000};
    await context.dispose();
}
console.log(JSON.stringify(result));
"""


def llama_cpp(node_modules: Path, path: Path, new: int) -> dict:
    script = node_modules.parent / "gpt2_llama_cpp_bench.mjs"  # beside node_modules, so that its import resolves
    script.write_text(SCRIPT)
    done = subprocess.run(
        ["node", str(script), str(path), json.dumps(PROMPT), str(new)], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--node-modules", required=True, type=Path, help="a node_modules directory holding node-llama-cpp"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    from _common import random_124m

    from gpt2.export.gguf import export_gguf
    from gpt2.model.model import GPT2

    with tempfile.TemporaryDirectory() as tmp:
        model = GPT2.from_pretrained(random_124m()[1], device="cpu")
        files = {dtype: export_gguf(model, Path(tmp) / f"model-{dtype}.gguf", dtype) for dtype in ("f32", "q8_0")}
        runs: dict[str, list] = {}
        for _ in range(args.rounds):
            for dtype, path in files.items():
                for name, run in [
                    (f"llama.cpp {dtype}", lambda path=path: llama_cpp(args.node_modules, path, args.tokens)),
                    (
                        f"gpt2 {dtype} file, {'float32' if dtype == 'f32' else 'int8'}",
                        lambda path=path, dtype=dtype: dict(
                            zip(
                                ("tokens", "rate", "prompt_s"),
                                ours(str(path), "float32" if dtype == "f32" else "int8", args.tokens),
                            )
                        ),
                    ),
                ]:
                    runs.setdefault(name, []).append(run())
    import torch

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"torch {torch.__version__}; "
        f"the 124M shape; batch 1, a 16-token prompt, {args.tokens} greedy tokens; {args.rounds} round(s), medians\n"
    )
    reference = runs["gpt2 f32 file, float32"][0]["tokens"]
    print("| engine, file | decode tokens/s | prompt (ms) | greedy tokens equal gpt2 float32's |")
    print("|---|---|---|---|")
    for name, results in runs.items():
        equal = sum(a == b for a, b in zip(results[0]["tokens"], reference))
        print(
            f"| {name} | {statistics.median(r['rate'] for r in results):.1f} | "
            f"{statistics.median(r['prompt_s'] for r in results) * 1e3:.0f} | "
            f"{equal} of {len(reference)} |"
        )


if __name__ == "__main__":
    main()
