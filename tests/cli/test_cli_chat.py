"""`gpt2 chat` (gpt2.cli.chat): replies equal transformers' on the chat template's ids, the oldest turns left out to
fit, and refusals in one line."""

from __future__ import annotations

import re

import pytest
from cli_helpers import run
from helpers import make_hf_model


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    """A tiny model saved with gpt2's default chat template, and transformers' model and tokenizer of it."""
    from transformers import AutoTokenizer

    from gpt2.tokenizer import Tokenizer
    from gpt2.tokenizer.chat import DEFAULT_TEMPLATE

    directory = tmp_path_factory.mktemp("chat")
    hf = make_hf_model(seed=4, vocab_size=50257, n_positions=64, n_embd=48, n_layer=2, n_head=3)
    hf.save_pretrained(directory)
    Tokenizer.gpt2().with_chat_template(DEFAULT_TEMPLATE).save_pretrained(directory)
    return str(directory), hf, AutoTokenizer.from_pretrained(directory)


def transformers_chat_reply(chat_dir, messages, n):
    """transformers' greedy reply of n tokens on apply_chat_template's ids, less the default template's
    space after "Assistant:"."""
    import torch

    _, hf, tokenizer = chat_dir
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=50256, eos_token_id=None)
    text = tokenizer.decode(out[0, len(ids) :])
    return text[1:] if text.startswith(" ") else text


def test_gpt2_chat_streams_replies_that_continue_the_history_and_resets(chat_dir, capsys, monkeypatch):
    stdin = "Hi there\nAnd then?\n/reset\n\nHi there\n"
    code, out, err = run(
        capsys,
        "chat",
        "--model",
        chat_dir[0],
        "--temperature",
        "0",
        "--max-new-tokens",
        "5",
        "--system",
        "Be brief.",
        "--device",
        "cpu",
        stdin=stdin.encode(),
        monkeypatch=monkeypatch,
    )
    assert code == 0, err
    system = {"role": "system", "content": "Be brief."}
    first = transformers_chat_reply(chat_dir, [system, {"role": "user", "content": "Hi there"}], 5)
    second = transformers_chat_reply(
        chat_dir,
        [
            system,
            {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": first},
            {"role": "user", "content": "And then?"},
        ],
        5,
    )
    assert out == f"{first}\n{second}\n{first}\n"  # after /reset, the first turn again; the empty line is no message
    assert err == "gpt2: the conversation starts over\n"


def test_gpt2_chat_leaves_out_the_oldest_turns_and_refuses_a_message_too_long_in_one_line(
    chat_dir, capsys, monkeypatch
):
    stdin = "".join("word " * 11 + f"{turn}\n" for turn in range(4)) + "word " * 60 + "\nHi\n"
    code, out, err = run(
        capsys,
        "chat",
        "--model",
        chat_dir[0],
        "--temperature",
        "0",
        "--max-new-tokens",
        "10",
        "--device",
        "cpu",
        stdin=stdin.encode(),
        monkeypatch=monkeypatch,
    )
    assert code == 0 and len(out.splitlines()) == 5  # four replies, then (the long message refused) the reply to Hi
    lines = err.splitlines()
    assert re.fullmatch(r"gpt2: the \d+ oldest messages are left out, to fit the model's context", lines[0]), err
    assert re.fullmatch(
        r"gpt2: error: the message does not fit: the conversation is \d+ tokens with it alone, and a reply of up to 10 "
        r"tokens makes \d+ more than the model's context of 64: send a shorter message, or give a lower "
        r"--max-new-tokens",
        lines[-1],
    ), err


def test_gpt2_chat_fits_its_default_reply_to_a_small_context(chat_dir, capsys, monkeypatch):
    """A context of 64 tokens: the default reply is half of it, 32 tokens, not 256 (which no message would fit)."""
    code, out, err = run(
        capsys,
        "chat",
        "--model",
        chat_dir[0],
        "--temperature",
        "0",
        "--device",
        "cpu",
        stdin=b"Hi there\n",
        monkeypatch=monkeypatch,
    )
    assert (code, err) == (0, "") and out == transformers_chat_reply(
        chat_dir, [{"role": "user", "content": "Hi there"}], 32
    ) + "\n"


def test_gpt2_chat_refuses_at_once_a_system_message_or_a_reply_that_leaves_no_room(chat_dir, capsys, monkeypatch):
    for flags, message in [
        (
            ["--system", "word " * 40],
            r"--system does not fit: with it and an empty message the conversation is \d+ tokens, and a reply "
            r"of up to 32 tokens makes \d+ more than the model's context of 64: give a shorter system "
            r"message, or a lower --max-new-tokens",
        ),
        (
            ["--max-new-tokens", "64"],
            r"--max-new-tokens must be a number of tokens below the model's context \(64\), i.e. from 1 to 63, "
            r"got 64",
        ),
    ]:  # before: exit 0, and every message refused
        code, out, err = run(
            capsys, "chat", "--model", chat_dir[0], *flags, "--device", "cpu", stdin=b"Hi\n", monkeypatch=monkeypatch
        )
        assert (code, out) == (2, "") and re.fullmatch(f"gpt2: error: {message}\n", err), err


def test_gpt2_chat_refusals_are_one_line(chat_dir, model_dir, capsys, monkeypatch, tmp_path):
    (tmp_path / "bad.jinja").write_text("{% if %}", encoding="utf-8")
    for argv, message in [
        (
            ["--model", model_dir],
            "the model's tokenizer has no chat template, so it cannot hold a conversation: "
            "give one with --chat-template (a Jinja2 file",
        ),
        (
            ["--model", str(tmp_path / "no-model"), "--chat-template", str(tmp_path / "bad.jinja")],
            f"{tmp_path / 'bad.jinja'} is not a valid template: ",
        ),
        (["--model", chat_dir[0], "--temperature", "-1"], "--temperature must be a finite number >= 0"),
    ]:
        code, out, err = run(capsys, "chat", *argv, "--device", "cpu", stdin=b"Hi\n", monkeypatch=monkeypatch)
        assert code == 2 and out == "" and err.startswith(f"gpt2: error: {message}") and err.count("\n") == 1, err
