"""From a base model to a chat model, end to end: conversations prepared with the default
template, a fine-tune with the loss on the replies, the model served, and held-out questions
asked through the openai client's chat.completions.create.

The questions are about three digits ("What is the middle digit of 4 0 7?"); the held-out ones
are about digits no training question uses, so answering them takes the task, not a memory.
The base model is a small one with random weights: it cannot answer in the template's format.
"""

from __future__ import annotations

import pytest
import torch
from helpers import Running, conversation, digit_questions, write_conversations

from gpt2.checkpoints.config import GPT2Config
from gpt2.data.chat import prepare_chat
from gpt2.model.model import GPT2
from gpt2.tokenizer import load_tokenizer
from gpt2.tokenizer.chat import DEFAULT_TEMPLATE
from gpt2.training.train import train

N_CTX = 64
HELD_OUT = digit_questions(60, seed=1, held_out=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The prepared conversations, the base model (random weights) and the fine-tuned one."""
    root = tmp_path_factory.mktemp("chat")
    conversations = [conversation(q, a) for q, a in digit_questions(2000, seed=0, held_out=False)]
    prepare_chat(
        [write_conversations(root / "qa.jsonl", conversations)], root / "data", tokenizer="bpe:310", progress=False
    )
    torch.manual_seed(0)  # the base model's weights: the same whatever ran before in the session
    base = GPT2(GPT2Config(n_layer=2, n_head=4, n_embd=128, n_ctx=N_CTX, n_vocab=load_tokenizer(root / "data").n_vocab))
    base.tokenizer = load_tokenizer(root / "data")
    base.save_pretrained(root / "base")
    # Muon: as far in 400 iterations as AdamW in 800 (60% against 60%; seeds 1-3 of the base
    # model 53-65% against AdamW's 38-60%), in half the time
    train(
        root / "tuned",
        progress=False,
        data=str(root / "data"),
        init=str(root / "base"),
        block_size=N_CTX,
        batch_size=16,
        grad_accum=1,
        max_iters=400,
        optimizer="muon",
        lr=3e-3,
        min_lr=3e-4,
        warmup_iters=20,
        weight_decay=0.0,
        eval_interval=400,
        eval_iters=2,
        device="cpu",
        dtype="float32",
        compile="off",
    )
    return root


def ask(client, question: str, **options):
    return client.chat.completions.create(
        model="tiny", messages=conversation(question), temperature=0, max_tokens=8, **options
    )


def accuracy(directory, chat_template: str | None = None, questions: int = len(HELD_OUT)) -> tuple[float, list]:
    """The share of the first `questions` held-out ones answered right, served with the model's own
    template or `chat_template`."""
    model = GPT2.from_pretrained(directory, device="cpu")
    server = Running(lambda: (model, model.tokenizer), chat_template=chat_template)
    try:
        client = server.client()
        answers = [ask(client, q) for q, _ in HELD_OUT[:questions]]
        streamed = [
            "".join(chunk.choices[0].delta.content or "" for chunk in ask(client, q, stream=True) if chunk.choices)
            for q, _ in HELD_OUT[:4]
        ]
    finally:
        server.stop()
    assert streamed == [a.choices[0].message.content for a in answers[:4]]  # streamed and plain answers are the same
    right = sum(a.choices[0].message.content == expected for a, (_, expected) in zip(answers, HELD_OUT))
    return right / len(answers), answers


def test_fine_tuning_teaches_held_out_questions_in_the_templates_format(runs):
    assert GPT2.from_pretrained(runs / "base").tokenizer.chat_template is None
    assert GPT2.from_pretrained(runs / "tuned").tokenizer.chat_template == DEFAULT_TEMPLATE  # kept from the data
    before, _ = accuracy(runs / "base", chat_template=DEFAULT_TEMPLATE, questions=20)
    after, answers = accuracy(runs / "tuned")
    print(f"held-out accuracy: {before:.0%} before fine-tuning, {after:.0%} after")
    assert before <= 0.1
    # 60% here; 53-65% with the base model's weights drawn from seeds 0-3 (another machine rounds
    # differently, as another seed would); a model that learned the format alone scores about 20%
    assert after >= 0.35
    assert all(a.choices[0].finish_reason == "stop" for a in answers if a.choices[0].message.content.isdigit())
