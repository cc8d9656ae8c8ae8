"""`gpt2 export`: a model written as ONNX or GGUF (gpt2.export)."""

from __future__ import annotations

import argparse
import sys
import time

from gpt2.cli.common import HelpFormatter, UsageError
from gpt2.cli.options import add_model_flag

EXAMPLES = """\
examples:
  gpt2 export --format onnx --model out-char --out out-char-onnx     # model.onnx with the KV cache, for ONNX Runtime
  gpt2 export --format onnx --model gpt2 --out gpt2-onnx-int8 --quantize int8
  gpt2 export --format gguf --model gpt2 --out gpt2.gguf --dtype q8_0  # for llama.cpp
"""


def add_parser(commands) -> None:
    export = commands.add_parser(
        "export",
        help="write a model as ONNX (ONNX Runtime, transformers.js) or GGUF (llama.cpp)",
        description=(
            "Write a model where GPT-2 is deployed: ONNX with the KV cache (optimum's names), or GGUF "
            "(llama.cpp's gpt2)."
        ),
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    export.add_argument("--format", required=True, choices=["onnx", "gguf"], help="onnx: a directory; gguf: one file")
    add_model_flag(export, "a released name or a model directory")
    export.add_argument("--out", required=True, metavar="PATH", help="onnx: a new directory; gguf: a .gguf file")
    export.add_argument(
        "--quantize", choices=["int8"], help="onnx: ONNX Runtime's dynamic int8 quantization (default: none)"
    )
    export.add_argument("--dtype", choices=["f32", "f16", "q8_0"], help="gguf: the weights' type (default: f32)")
    export.set_defaults(func=cmd, engine="torch", device="cpu", cuda_graphs=False)


def cmd(args: argparse.Namespace) -> int:
    if args.format == "onnx" and args.dtype is not None:
        raise UsageError(
            f"--dtype {args.dtype} is a GGUF type: an ONNX export is float32, or int8 with --quantize int8"
        )
    if args.format == "gguf" and args.quantize is not None:
        raise UsageError("--quantize is ONNX Runtime's: a GGUF export takes --dtype f32, f16 or q8_0")
    from gpt2.model.model import GPT2

    model = GPT2.from_pretrained(args.model, device="cpu", dtype="float32")
    started = time.perf_counter()
    if args.format == "onnx":
        from gpt2.export.onnx import export_onnx

        out = export_onnx(model, args.out, quantize=args.quantize)
    else:
        from gpt2.export.gguf import export_gguf

        out = export_gguf(model, args.out, dtype=args.dtype or "f32")
    print(f"gpt2: wrote {out} ({args.format}) in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0
