"""gpt2.data.chat: prepare_chat's ids and masks against transformers' apply_chat_template, conversations split whole,
and the errors of a line, a template or the arguments."""

from __future__ import annotations

import io
import json
import sys

import numpy as np
import pytest
from data_helpers import QA, read_ids
from helpers import write_conversations

from gpt2 import DataError, InvalidArgumentError, Tokenizer
from gpt2.data.chat import prepare_chat
from gpt2.data.files import open_data

# A template as many on the Hub are written, over several lines of a file: its own markers, the
# tokenizer's eos_token, {% generation %} around the reply.
CHATML_FILE = """{% for message in messages %}
{{ '<|im_start|>' + message['role'] + '\\n' }}
{% if message['role'] == 'assistant' %}
{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}
{% else %}
{{ message['content'] + '<|im_end|>' }}
{% endif %}
{{ '\\n' }}
{% endfor %}
{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}
"""


def hf_chat_tokenizer(directory, tokenizer, template: str):
    """transformers' tokenizer of our vocabulary, read from the files save_pretrained writes, carrying `template`."""
    import transformers

    tokenizer.with_chat_template(template).save_pretrained(directory)
    return transformers.AutoTokenizer.from_pretrained(directory)


def hf_encodings(hf, conversations) -> list[tuple[list[int], list[int]]]:
    """(ids, assistant mask) of each conversation, as transformers' apply_chat_template gives them."""
    encoded = [hf.apply_chat_template(m, return_dict=True, return_assistant_tokens_mask=True) for m in conversations]
    return [(list(e["input_ids"]), list(e["assistant_masks"])) for e in encoded]


def cut_at_conversations(out, expected: list[tuple[list[int], list[int]]]) -> list[str]:
    """The split each conversation went to, the files read back with numpy and cut where each one's
    expected ids lie; fails unless train.bin and val.bin (and their masks) hold exactly these
    conversations, whole and in order, with these masks."""
    ids = {split: read_ids(out / f"{split}.bin") for split in ("train", "val")}
    masks = {split: np.fromfile(out / f"{split}.mask.bin", dtype=np.uint8).tolist() for split in ("train", "val")}
    at, went = {"train": 0, "val": 0}, []
    for expected_ids, expected_mask in expected:
        found = [
            split for split in ("train", "val") if ids[split][at[split] : at[split] + len(expected_ids)] == expected_ids
        ]
        assert found, f"conversation {len(went)} is neither next in train.bin nor in val.bin"
        split = found[0]
        assert masks[split][at[split] : at[split] + len(expected_ids)] == expected_mask
        at[split] += len(expected_ids)
        went.append(split)
    assert at == {split: len(ids[split]) for split in at} == {split: len(masks[split]) for split in at}
    return went


@pytest.mark.parametrize("template_file", [None, "chatml.jinja"], ids=["default", "file"])
def test_chat_data_equals_transformers_apply_chat_template(tmp_path, template_file):
    from gpt2.tokenizer.chat import DEFAULT_TEMPLATE

    write_conversations(tmp_path / "chat.jsonl", QA)
    source = DEFAULT_TEMPLATE
    if template_file:
        (tmp_path / template_file).write_text(source := CHATML_FILE, encoding="utf-8")
    meta = prepare_chat(
        [tmp_path / "chat.jsonl"],
        tmp_path / "out",
        val_fraction=0.25,
        progress=False,
        chat_template=template_file and tmp_path / template_file,
    )
    expected = hf_encodings(hf_chat_tokenizer(tmp_path / "hf", Tokenizer.gpt2(), source), QA)
    went = cut_at_conversations(tmp_path / "out", expected)
    assert went.count("val") == round(0.25 * len(QA)) == 3
    lengths = [len(ids) for ids, _ in expected]
    assert meta["chat"] == {
        "template": source,
        "conversations": {"train": len(QA) - 3, "val": 3},
        "mask_tokens": {
            split: sum(sum(mask) for (_, mask), s in zip(expected, went) if s == split) for split in ("train", "val")
        },
        "longest": max(lengths),
        "longest_at": f"{tmp_path / 'chat.jsonl'}, line {lengths.index(max(lengths)) + 1}",
    }
    assert json.loads((tmp_path / "out" / "meta.json").read_text()) == meta
    assert meta["split"]["method"] == "conversations" and meta["split"]["val_conversations"] == 3
    assert (meta["train_tokens"], meta["val_tokens"]) == tuple(
        sum(n for n, s in zip(lengths, went) if s == split) for split in ("train", "val")
    )
    assert meta["sources"] == {"inputs": [str(tmp_path / "chat.jsonl")], "files": 1}
    data = open_data(tmp_path / "out")  # the ids are ordinary prepared data to what reads them
    assert data.vocab_size == 50257 and len(data.train) == meta["train_tokens"]


def test_chat_data_of_several_files_and_standard_input(tmp_path, monkeypatch):
    from gpt2.tokenizer.chat import DEFAULT_TEMPLATE

    write_conversations(tmp_path / "a.jsonl", QA[:5])
    text = "\n".join(json.dumps({"messages": m}) for m in QA[5:]) + "\n\n"  # a blank line: skipped
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    meta = prepare_chat([tmp_path / "a.jsonl", "-"], tmp_path / "out", val_fraction=0.5, progress=False)
    went = cut_at_conversations(
        tmp_path / "out", hf_encodings(hf_chat_tokenizer(tmp_path / "hf", Tokenizer.gpt2(), DEFAULT_TEMPLATE), QA)
    )
    assert went.count("val") == 6 and meta["sources"]["files"] == 2


def test_chat_bpe_keeps_endoftext_a_special_token(tmp_path):
    """A vocabulary trained on conversations learns no merge of <|endoftext|>'s text: it is the
    vocabulary's special token."""
    from gpt2.tokenizer import load_tokenizer
    from gpt2.tokenizer.chat import DEFAULT_TEMPLATE

    write_conversations(tmp_path / "chat.jsonl", QA)
    meta = prepare_chat([tmp_path / "chat.jsonl"], tmp_path / "out", "bpe:300", progress=False)
    trained = load_tokenizer(tmp_path / "out")
    assert meta["vocab_size"] == trained.n_vocab == 300 and trained.special_tokens == {"<|endoftext|>": 299}
    assert not any(b"endoftext" in trained.token_bytes(i) or b"<|" in trained.token_bytes(i) for i in range(299))
    expected = hf_encodings(hf_chat_tokenizer(tmp_path / "hf", trained, DEFAULT_TEMPLATE), QA)
    cut_at_conversations(tmp_path / "out", expected)
    replies = [sum(m["role"] == "assistant" for m in messages) for messages in QA]
    assert [[mask[k] for k, i in enumerate(ids) if i == 299] for ids, mask in expected] == [[1] * n for n in replies]


def test_split_conversations_is_whole_conversations():
    from gpt2.data.chat import split_conversations

    counts = [3, 4, 5, 2, 7, 1]
    split = split_conversations(counts, 0.34)  # 2 of 6 validate
    assert split.method == "conversations" and split.val_documents == 2 and split.cut is None
    bounds = [(sum(counts[:c]), sum(counts[: c + 1])) for c in range(6)]

    def within(ranges):
        return [c for c, (s, e) in enumerate(bounds) if any(a <= s and e <= b for a, b in ranges)]

    assert len(within(split.val)) == 2 and sorted(within(split.val) + within(split.train)) == list(range(6))
    assert sum(e - s for s, e in split.train + split.val) == sum(counts)  # no id twice, none left out
    assert split_conversations([1, 1], 0.01).val_documents == 1 == split_conversations([1, 1], 0.99).val_documents


GOOD_LINE = json.dumps({"messages": QA[0]})


CHAT_ERRORS = [  # (the third line of chat.jsonl, after a good one and a blank one; the message)
    ("not json", "chat.jsonl, line 3: not a JSON object (Expecting value"),
    ("[1, 2]", 'chat.jsonl, line 3: a conversation is an object {"messages": [...]}, got a JSON list'),
    (
        '{"text": "hi"}',
        'chat.jsonl, line 3: a conversation is an object {"messages": [...]}, got an object with the keys text',
    ),
    ('{"messages": "hi"}', "chat.jsonl, line 3: messages must be a non-empty list of messages, got 'hi'"),
    (
        '{"messages": [{"role": "user", "content": "hi"}]}',
        "chat.jsonl, line 3: the conversation has no assistant message",
    ),
    (
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "beep"}]}',
        "chat.jsonl, line 3: messages[1].role must be one of system, user, assistant, got 'robot'",
    ),
    (
        '{"messages": [{"role": "user", "content": ["hi"]}, {"role": "assistant", "content": "yes"}]}',
        "chat.jsonl, line 3: messages[0].content must be a string, got ['hi']",
    ),
    (
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "no", "weight": 0}]}',
        "chat.jsonl, line 3: messages[1].weight is 0: every reply is learned (weight 1)",
    ),
]


@pytest.mark.parametrize("line, message", CHAT_ERRORS, ids=range(len(CHAT_ERRORS)))
def test_bad_conversations_are_named_by_file_and_line(tmp_path, line, message):
    (tmp_path / "chat.jsonl").write_text("\n".join([GOOD_LINE, "", line, GOOD_LINE]) + "\n", encoding="utf-8")
    with pytest.raises(DataError) as e:
        prepare_chat([tmp_path / "chat.jsonl"], tmp_path / "out", progress=False)
    assert message in str(e.value) and str(e.value).startswith(str(tmp_path / "chat.jsonl"))
    assert not (tmp_path / "out").exists()  # made by this prepare, removed by it


NO_SYSTEM = (
    "{% for m in messages %}\n{% if m['role'] == 'system' %}{{ raise_exception('no system messages here') }}{% endif %}"
    "{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}"
)


def chat_error_cases(tmp_path) -> list[tuple[dict, type, str]]:
    """(prepare_chat's arguments, the error, its message) of each error but a line's own, the files made in tmp_path."""
    from gpt2.errors import ChatTemplateError, InputTypeError

    write_conversations(tmp_path / "chat.jsonl", QA[:3])
    write_conversations(tmp_path / "one.jsonl", QA[:1])
    (tmp_path / "empty.jsonl").write_text("\n\n", encoding="utf-8")
    (tmp_path / "no-system.jinja").write_text(NO_SYSTEM, encoding="utf-8")
    (tmp_path / "no-replies.jinja").write_text(
        "{% for m in messages %}{{ m['content'] }}{% endfor %}", encoding="utf-8"
    )
    (tmp_path / "broken.jinja").write_text("hello\n{% for %}", encoding="utf-8")
    chat, jinja = str(tmp_path / "chat.jsonl"), lambda name: str(tmp_path / name)
    return [
        (
            dict(inputs=[chat], chat_template=jinja("no-system.jinja")),
            ChatTemplateError,
            f"{chat}, line 2: {jinja('no-system.jinja')} failed to render (line 2): no system messages here",
        ),
        (
            dict(inputs=[chat], chat_template=jinja("broken.jinja")),
            ChatTemplateError,
            f"{jinja('broken.jinja')} is not a valid template: ",
        ),
        (
            dict(inputs=[chat], chat_template=jinja("missing.jinja")),
            ChatTemplateError,
            f"cannot read the chat template {jinja('missing.jinja')}: no such file",
        ),
        (
            dict(inputs=[chat], chat_template=jinja("no-replies.jinja")),
            DataError,
            f"{jinja('no-replies.jinja')} marks no reply in 3 conversations: "
            "the tokens to learn are those inside {% generation %}",
        ),
        (
            dict(inputs=[chat, str(tmp_path / "empty.jsonl")]),
            DataError,
            f"{tmp_path / 'empty.jsonl'} holds no conversations",
        ),
        (
            dict(inputs=[str(tmp_path / "one.jsonl")]),
            DataError,
            "1 conversation cannot be split whole into training and validation: "
            "each split needs one (val_fraction 0.1 of them validates, at least 1); give 2 or more",
        ),
        (dict(inputs=[chat], tokenizer="char"), InvalidArgumentError, "the char tokenizer cannot hold a conversation"),
        (
            dict(inputs=[chat], chat_template=3),
            InputTypeError,
            "chat_template is the path of a Jinja2 file or a ChatTemplate, got 3",
        ),
        (
            dict(inputs=[chat, str(tmp_path / "nowhere.jsonl")]),
            DataError,
            f"input {str(tmp_path / 'nowhere.jsonl')!r} does not exist",
        ),
    ]


def test_chat_errors_say_what_and_where_and_leave_nothing(tmp_path):
    for args, error, message in chat_error_cases(tmp_path):
        with pytest.raises(error) as e:
            prepare_chat(out=tmp_path / "out", progress=False, **args)
        assert message in str(e.value), (message, str(e.value))
        assert not (tmp_path / "out").exists()
