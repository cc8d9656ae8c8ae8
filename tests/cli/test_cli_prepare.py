"""`gpt2 prepare` (gpt2.cli.prepare): text and conversations prepared into a directory, and what it says of them."""

from __future__ import annotations

import pytest
from cli_helpers import run
from helpers import write_conversations

from gpt2.cli import main


def test_prepare_writes_data_and_says_what(tmp_path, capsys):
    (tmp_path / "in.txt").write_text(
        "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 20, encoding="utf-8"
    )
    assert (
        main(
            ["prepare", str(tmp_path / "in.txt"), "--out", str(tmp_path / "d"), "--tokenizer", "char", "--no-progress"]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "training and" in err and "(char)" in err
    assert {p.name for p in (tmp_path / "d").iterdir()} == {"train.bin", "val.bin", "meta.json", "chars.json"}


@pytest.mark.parametrize(
    "args, message",
    [
        (["nowhere.txt"], "input 'nowhere.txt' does not exist"),
        (["IN", "--tokenizer", "bpe:12"], "unknown tokenizer (--tokenizer) 'bpe:12'"),
        (["IN", "--val-fraction", "2"], r"--val-fraction must be a number in (0, 1), got 2.0"),
        (["IN", "--val-fraction", "x"], "argument --val-fraction: invalid float value: 'x'"),
        (["IN", "--workers", "0"], "--workers must be a positive integer, got 0"),
        (["IN", "--workers", "-2"], "--workers must be a positive integer, got -2"),
        (["IN", "--workers", "two"], "argument --workers: expected a whole number, got 'two'"),
        (["--synthetic", "induction", "--workers", "2"], "--workers does not apply"),
    ],
)
def test_prepare_errors_are_one_line(tmp_path, capsys, args, message):
    (tmp_path / "in.txt").write_text("some text here", encoding="utf-8")
    args = [str(tmp_path / "in.txt") if a == "IN" else a for a in args]
    assert main(["prepare", *args, "--out", str(tmp_path / "d"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpt2: error: ") and err.count("\n") == 1 and message in err


def test_prepare_from_stdin_refuses_to_overwrite_and_shows_examples(tmp_path, capsys, monkeypatch):
    import numpy as np

    text = "Hello world. " * 50
    code, out, err = run(
        capsys,
        "prepare",
        "-",
        "--out",
        str(tmp_path / "d"),
        "--no-progress",
        stdin=text.encode(),
        monkeypatch=monkeypatch,
    )
    ids = np.concatenate([np.fromfile(tmp_path / "d" / f, dtype="<u2") for f in ("train.bin", "val.bin")]).tolist()
    assert code == 0 and out == "" and ids[:3] == [15496, 995, 13] and ids[-1] == 50256  # "Hello", " world", "."
    train = int(len(ids) * 0.9)  # one document: nanoGPT's split
    assert err == (
        f"gpt2: {train:,} training and {len(ids) - train:,} validation tokens ({(len(ids) - train) / len(ids):.2%} for "
        f"validation) of a 50,257-token vocabulary (gpt2) in {tmp_path / 'd'}\n"
    )
    code, _, err = run(capsys, "prepare", "-", "--out", str(tmp_path / "d"), stdin=b"more", monkeypatch=monkeypatch)
    assert (
        code == 2
        and err.count("\n") == 1
        and "already holds prepared data" in err
        and "pass --overwrite to replace it" in err
    )
    with pytest.raises(SystemExit):
        main(["prepare", "--help"])
    assert (
        "\nexamples:\n  gpt2 prepare shakespeare --out data/shakespeare_char --tokenizer char   "
        "# tinyshakespeare, shipped in gpt2\n" in capsys.readouterr().out
    )


def test_prepare_says_how_several_documents_split(tmp_path, capsys):
    import json

    for name, size in (("a.txt", 3000), ("b.txt", 900), ("c.txt", 40)):  # drawn: c, a, b
        (tmp_path / "in" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "in" / name).write_text(("All the world's a stage. " * 200)[:size], encoding="utf-8")
    code, _, err = run(
        capsys, "prepare", str(tmp_path / "in"), "--out", str(tmp_path / "d"), "--val-fraction", "0.2", "--no-progress"
    )
    meta = json.loads((tmp_path / "d" / "meta.json").read_text())
    train, val, split = meta["train_tokens"], meta["val_tokens"], meta["split"]
    assert code == 0 and split["val_documents"] == 1 and split["cut"] is not None  # one whole, the tail of another
    assert err == (
        f"gpt2: {train:,} training and {val:,} validation tokens ({val / (train + val):.2%} for validation: 1 whole "
        f"document and the last {split['cut']['val_tokens']} tokens of {split['cut']['document']}) of a 50,257-token "
        f"vocabulary (gpt2) in {tmp_path / 'd'}\n"
    )
    assert abs(val - 0.2 * (train + val)) <= 0.5


QA = [
    [{"role": "user", "content": f"What is {i} plus {i}?"}, {"role": "assistant", "content": f"{2 * i}."}]
    for i in range(10)
]


def test_prepare_chat_writes_conversations_and_says_what(tmp_path, capsys, monkeypatch):
    import json

    import numpy as np

    write_conversations(tmp_path / "qa.jsonl", QA)
    code, out, err = run(
        capsys,
        "prepare",
        "--chat",
        str(tmp_path / "qa.jsonl"),
        "--out",
        str(tmp_path / "d"),
        "--val-fraction",
        "0.2",
        "--no-progress",
    )
    meta = json.loads((tmp_path / "d" / "meta.json").read_text())
    masks = [np.fromfile(tmp_path / "d" / f"{split}.mask.bin", dtype=np.uint8) for split in ("train", "val")]
    train, val = meta["train_tokens"], meta["val_tokens"]
    assert code == 0 and out == "" and meta["chat"]["conversations"] == {"train": 8, "val": 2}
    assert err == (
        f"gpt2: 8 training and 2 validation conversations ({train:,} and {val:,} tokens, {int(masks[0].sum())} and "
        f"{int(masks[1].sum())} of them in replies; {val / (train + val):.2%} for validation; the longest "
        f"{meta['chat']['longest']} tokens) of a 50,257-token vocabulary (gpt2) in {tmp_path / 'd'}\n"
    )
    text = "".join(json.dumps({"messages": m}) + "\n" for m in QA)  # standard input, another template
    (tmp_path / "t.jinja").write_text(
        "{% for m in messages %}{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}"
    )
    code, _, err = run(
        capsys,
        "prepare",
        "--chat",
        "-",
        "--out",
        str(tmp_path / "d"),
        "--chat-template",
        str(tmp_path / "t.jinja"),
        "--overwrite",
        "--no-progress",
        stdin=text.encode(),
        monkeypatch=monkeypatch,
    )
    assert code == 0 and "9 training and 1 validation conversations" in err
    assert (
        json.loads((tmp_path / "d" / "meta.json").read_text())["chat"]["template"] == (tmp_path / "t.jinja").read_text()
    )


@pytest.mark.parametrize(
    "line, args, message",
    [
        ("not json", [], "IN, line 2: not a JSON object (Expecting value: line 1 column 1 (char 0))"),
        (
            '{"text": "hi"}',
            [],
            'IN, line 2: a conversation is an object {"messages": [...]}, got an object with the keys text',
        ),
        (
            '{"messages": [{"role": "user", "content": "hi"}]}',
            [],
            "IN, line 2: the conversation has no assistant message",
        ),
        (
            '{"messages": [{"role": "robot", "content": "hi"}]}',
            [],
            "IN, line 2: messages[0].role must be one of system, user, assistant, got 'robot'",
        ),
        (
            '{"messages": [{"role": "user", "content": 7}]}',
            [],
            "IN, line 2: messages[0].content must be a string, got 7",
        ),
        (
            '{"messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]}',
            ["--chat-template", "T"],
            "IN, line 2: T failed to render (line 2): no system messages (--chat-template)",
        ),
        (None, ["--chat-template", "NOWHERE"], "cannot read the chat template NOWHERE: no such file (--chat-template)"),
        ("", [], "IN holds no conversations"),  # blank lines only
        (None, ["--val-fraction", "0.5"], "1 conversation cannot be split whole into training and validation"),
        (None, ["--tokenizer", "char"], "the char tokenizer (--tokenizer) cannot hold a conversation"),
        (
            None,
            ["--shard-tokens", "100"],
            "--chat reads JSON Lines files of conversations into train.bin and val.bin: --shard-tokens does not apply",
        ),
        (None, ["--text-field", "body", "--split", "test"], "--text-field, --split do not apply"),
        (None, ["--workers", "2"], "--workers does not apply"),
    ],
)
def test_prepare_chat_errors_are_one_line(tmp_path, capsys, line, args, message):
    write_conversations(tmp_path / "in.jsonl", QA[:1] if line != "" else [])
    if line is not None:
        with open(tmp_path / "in.jsonl", "a") as f:
            f.write(line + "\n")
    (tmp_path / "t.jinja").write_text(
        "{% for m in messages %}\n{% if m['role'] == 'system' %}{{ raise_exception('no system messages') }}"
        "{% endif %}{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}"
    )
    names = {"IN": tmp_path / "in.jsonl", "T": tmp_path / "t.jinja", "NOWHERE": tmp_path / "nowhere.jinja"}
    args = [str(names.get(a, a)) for a in args]
    code, out, err = run(
        capsys, "prepare", "--chat", str(tmp_path / "in.jsonl"), *args, "--out", str(tmp_path / "d"), "--no-progress"
    )
    for name, path in names.items():
        message = message.replace(name, str(path))
    assert code == 2 and out == "" and err.startswith("gpt2: error: ") and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["IN", "--chat-template", "t.jinja"], "--chat-template is the template of conversations: add --chat"),
        (["--chat"], 'give JSON Lines files of conversations ({"messages": [...]} a line), or - for standard input'),
    ],
)
def test_prepare_chat_flags_that_do_not_go_together(tmp_path, capsys, args, message):
    (tmp_path / "in.txt").write_text("some text here", encoding="utf-8")
    args = [str(tmp_path / "in.txt") if a == "IN" else a for a in args]
    code, _, err = run(capsys, "prepare", *args, "--out", str(tmp_path / "d"), "--no-progress")
    assert code == 2 and err == f"gpt2: error: {message}\n" and not (tmp_path / "d").exists()


def test_prepare_encodes_on_the_workers_asked_for(tmp_path, capsys, monkeypatch, tiktoken_gpt2):
    import numpy as np

    import gpt2.data.text as text_module

    asked = []

    def encode_stream(encode, shares, num_workers):  # the pool's, noting how many processes it was given
        asked.append(num_workers)
        return stream(encode, shares, num_workers)

    stream = text_module.encode_stream
    monkeypatch.setattr(text_module, "encode_stream", encode_stream)
    monkeypatch.setattr(text_module, "CHUNK_BYTES", 2000)  # shares enough to start the workers
    text = "".join(f"Line {i}: all the world's a stage.\n" for i in range(2000))
    (tmp_path / "in.txt").write_text(text, encoding="utf-8")
    for workers in ("3", "1"):
        code, _, err = run(
            capsys,
            "prepare",
            str(tmp_path / "in.txt"),
            "--out",
            str(tmp_path / workers),
            "--workers",
            workers,
            "--no-progress",
        )
        ids = np.concatenate([np.fromfile(tmp_path / workers / f"{s}.bin", dtype="<u2") for s in ("train", "val")])
        assert code == 0 and ids.tolist() == tiktoken_gpt2.encode_ordinary(text) + [50256], err
    assert asked == [3, 1]
