"""Fine-tuning a chat model at the 124M shape: accuracy on held-out questions before and after, \
and the time each step takes.

The conversations are tests/helpers.py's questions about three digits ("What is the middle digit
of 4 0 7?"), rendered with gpt2's default template and GPT-2's tokenizer (--quick: the end-to-end test's
model and vocabulary, a BPE vocabulary of 310 ids trained on them and 2 layers of 128). The base model has the
124M shape and random weights (OpenAI's cannot be downloaded here); it is fine-tuned with the loss
on the replies only (`gpt2 prepare --chat`, `gpt2 train --init`), served (`gpt2.serve`), and
asked the held-out questions through the openai client's chat.completions.create, greedy.
A held-out answer is right when the reply's text is the digit. --quick: a small model.

    python benchmarks/chat.py                       # 124M shape
    python benchmarks/chat.py --quick               # tests/test_finetune_chat.py's model: a minute
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from _common import print_table  # (and tests/ on the path)
from helpers import Running, conversation, digit_questions, write_conversations

from gpt2.checkpoints.config import GPT2Config
from gpt2.data.chat import prepare_chat
from gpt2.model.model import GPT2
from gpt2.tokenizer import load_tokenizer
from gpt2.tokenizer.chat import DEFAULT_TEMPLATE
from gpt2.training.train import train

SHAPES = {"124M": {"n_layer": 12, "n_head": 12, "n_embd": 768}, "quick": {"n_layer": 2, "n_head": 4, "n_embd": 128}}


def accuracy(directory: Path, questions: list[tuple[str, str]], chat_template: str | None) -> tuple[float, float]:
    """The share of questions answered right through the server, and the seconds they took."""
    model = GPT2.from_pretrained(directory, device="cpu")
    server = Running(lambda: (model, model.tokenizer), chat_template=chat_template)
    try:
        client, started, right = server.client(), time.perf_counter(), 0
        for question, answer in questions:
            reply = client.chat.completions.create(
                model="tiny", messages=conversation(question), temperature=0, max_tokens=8
            )
            right += reply.choices[0].message.content == answer
        return right / len(questions), time.perf_counter() - started
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model, for a smoke run")
    parser.add_argument("--iters", type=int, default=None, help="fine-tuning iterations (default: 150; --quick 800)")
    parser.add_argument(
        "--batch-size", type=int, default=None, help="conversations' windows per step (default: 8; --quick 16)"
    )
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate (default: 3e-4; --quick 3e-3)")
    args = parser.parse_args()
    shape = "quick" if args.quick else "124M"
    iters = args.iters or (800 if args.quick else 150)
    batch_size = args.batch_size or (16 if args.quick else 8)
    lr = args.lr or (3e-3 if args.quick else 3e-4)
    torch.manual_seed(0)
    held_out = digit_questions(100, seed=1, held_out=True)
    with tempfile.TemporaryDirectory() as root:
        root = Path(root)
        conversations = [conversation(q, a) for q, a in digit_questions(4000, seed=0, held_out=False)]
        started = time.perf_counter()
        tokenizer = "bpe:310" if args.quick else "gpt2"  # the end-to-end test's: a vocabulary of 310 ids
        meta = prepare_chat(
            [write_conversations(root / "qa.jsonl", conversations)], root / "data", tokenizer, progress=False
        )
        prepared = time.perf_counter() - started
        base = GPT2(GPT2Config(**SHAPES[shape], n_ctx=64, n_vocab=meta["vocab_size"]))
        base.tokenizer = load_tokenizer(root / "data")
        base.save_pretrained(root / "base")
        started = time.perf_counter()
        train(
            root / "tuned",
            progress=False,
            data=str(root / "data"),
            init=str(root / "base"),
            block_size=64,
            batch_size=batch_size,
            grad_accum=1,
            max_iters=iters,
            lr=lr,
            min_lr=lr / 10,
            warmup_iters=iters // 10,
            weight_decay=0.0,
            eval_interval=iters,
            eval_iters=4,
            device="cpu",
            dtype="float32",
            compile="off",
        )
        trained = time.perf_counter() - started
        before, _ = accuracy(root / "base", held_out, DEFAULT_TEMPLATE)
        after, asked = accuracy(root / "tuned", held_out, None)
    n_params = sum(p.numel() for p in base.parameters())
    print(
        f"{shape} shape ({n_params / 1e6:.0f}M parameters), {len(conversations):,} conversations "
        f"({meta['train_tokens']:,} training tokens), {iters} iterations of {batch_size} x 64 tokens, lr {lr:g}"
    )
    print_table(
        [
            "held-out accuracy before",
            "after",
            "prepare",
            "fine-tune",
            "s/iteration",
            f"{len(held_out)} questions asked",
        ],
        [
            [
                f"{before:.0%}",
                f"**{after:.0%}**",
                f"{prepared:.1f} s",
                f"{trained:.0f} s",
                f"{trained / iters:.2f}",
                f"{asked:.1f} s",
            ]
        ],
    )


if __name__ == "__main__":
    main()
