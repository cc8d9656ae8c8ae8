"""gpt2.tokenizer.chat against transformers' apply_chat_template (which renders with jinja2 too): the same
text, the same ids and the same assistant mask, for gpt2's default template and others."""

from __future__ import annotations

import json

import pytest

from gpt2.errors import ChatTemplateError, InvalidArgumentError
from gpt2.tokenizer import Tokenizer, load_tokenizer
from gpt2.tokenizer.chat import DEFAULT_TEMPLATE, ChatTemplate, check_messages

transformers = pytest.importorskip("transformers")

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "Paris."}],
    [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Capital of Spain?"},
        {"role": "assistant", "content": "Madrid."},
        {"role": "user", "content": "And of Japan, 日本?"},
        {"role": "assistant", "content": "Tōkyō 東京 — surely.\n\nYes."},
    ],
    [
        {"role": "user", "content": "  spaces  and\ttabs "},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "again"},
    ],
]
# A ChatML-like template written as many on the Hub are: special tokens through {{ eos_token }},
# {% generation %} around the reply, a loop variable, and tojson.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}"
    "{% else %}{{ message['content'] | tojson }}{% endif %}"
    "{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory):
    """transformers' tokenizer for GPT-2's vocabulary, read from the files our save_pretrained writes,
    with the default template."""
    directory = tmp_path_factory.mktemp("tokenizer")
    Tokenizer.gpt2().with_chat_template(DEFAULT_TEMPLATE).save_pretrained(directory)
    return transformers.AutoTokenizer.from_pretrained(directory)


@pytest.mark.parametrize("source", [DEFAULT_TEMPLATE, CHATML], ids=["default", "chatml"])
@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_text_and_ids_equal_transformers(hf_tokenizer, source, index, add_generation_prompt):
    messages, template = CONVERSATIONS[index], ChatTemplate(source)
    variables = {"eos_token": "<|endoftext|>"}  # what transformers passes from the tokenizer's special tokens
    expected_text = hf_tokenizer.apply_chat_template(
        messages, chat_template=source, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert template.render(messages, add_generation_prompt, **variables) == expected_text
    expected_ids = hf_tokenizer.apply_chat_template(
        messages, chat_template=source, add_generation_prompt=add_generation_prompt, return_dict=False
    )
    assert template.encode(Tokenizer.gpt2(), messages, add_generation_prompt) == list(expected_ids)


@pytest.mark.parametrize("source", [DEFAULT_TEMPLATE, CHATML], ids=["default", "chatml"])
@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
def test_assistant_mask_equals_transformers(hf_tokenizer, source, index):
    messages, template = CONVERSATIONS[index], ChatTemplate(source)
    expected = hf_tokenizer.apply_chat_template(
        messages, chat_template=source, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = template.encode_with_mask(Tokenizer.gpt2(), messages)
    assert ids == list(expected["input_ids"])
    assert mask == list(expected["assistant_masks"])
    assert sum(mask) > 0 or all(m["content"] == "" for m in messages if m["role"] == "assistant")


def test_default_template_ends_each_reply_with_endoftext_and_masks_it():
    gpt2 = Tokenizer.gpt2()
    ids, mask = ChatTemplate(DEFAULT_TEMPLATE).encode_with_mask(gpt2, CONVERSATIONS[1])
    replies = [gpt2.decode([i for i, m in zip(ids, mask) if m])]
    assert replies == [" Madrid.<|endoftext|> Tōkyō 東京 — surely.\n\nYes.<|endoftext|>"]
    assert ids.count(gpt2.eot_token) == 2 and all(mask[k] for k, i in enumerate(ids) if i == gpt2.eot_token)


def test_the_template_travels_with_the_tokenizer(tmp_path, hf_tokenizer):
    gpt2 = Tokenizer.gpt2()
    carrying = gpt2.with_chat_template(DEFAULT_TEMPLATE)
    assert (
        gpt2.chat_template is None and carrying.chat_template == DEFAULT_TEMPLATE
    )  # a copy: the shared one is untouched
    assert carrying.encode("Hello world") == gpt2.encode("Hello world")
    carrying.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["chat_template"] == DEFAULT_TEMPLATE
    assert load_tokenizer(tmp_path).chat_template == DEFAULT_TEMPLATE
    assert hf_tokenizer.chat_template == DEFAULT_TEMPLATE
    gpt2.save_pretrained(tmp_path)  # saved without one: none is left behind
    assert "chat_template" not in json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert load_tokenizer(tmp_path).chat_template is None


def test_a_chat_template_jinja_file_is_read(tmp_path):
    """Newer transformers save the template as chat_template.jinja beside tokenizer_config.json."""
    Tokenizer.gpt2().save_pretrained(tmp_path)
    (tmp_path / "chat_template.jinja").write_text(CHATML)
    assert load_tokenizer(tmp_path).chat_template == CHATML


def test_pickling_keeps_the_template():
    import pickle

    carrying = Tokenizer.gpt2().with_chat_template(CHATML)
    assert pickle.loads(pickle.dumps(carrying)).chat_template == CHATML


@pytest.mark.parametrize(
    "messages, fragment",
    [
        ("hello", "messages must be a non-empty list"),
        ([], "messages must be a non-empty list"),
        (["hi"], "messages[0] must be an object"),
        ([{"role": "robot", "content": "hi"}], "messages[0].role must be one of system, user, assistant, got 'robot'"),
        (
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": 3}],
            "messages[1].content must be a string, got 3",
        ),
        ([{"role": "user", "content": None}], "messages[0].content must be a string, got None"),
    ],
)
def test_bad_messages_are_named(messages, fragment):
    with pytest.raises(InvalidArgumentError, match=None) as e:
        check_messages(messages)
    assert fragment in str(e.value) and e.value.param == "messages"


def test_training_needs_a_reply():
    with pytest.raises(InvalidArgumentError, match="no assistant message"):
        check_messages([{"role": "user", "content": "hi"}], training=True)


def test_template_errors_give_the_line(tmp_path):
    with pytest.raises(ChatTemplateError, match=r"not a valid template: .* \(line 2\)"):
        ChatTemplate("hello\n{% for %}")
    with pytest.raises(ChatTemplateError, match=r"failed to render \(line 3\): no system prompt allowed"):
        ChatTemplate("a\nb\n{{ raise_exception('no system prompt allowed') }}").render(CONVERSATIONS[0])
    with pytest.raises(ChatTemplateError, match=r"failed to render \(line 2\): can only concatenate str"):
        ChatTemplate("a\n{{ messages[0]['content'] + 1 }}").render(CONVERSATIONS[0])
    with pytest.raises(ChatTemplateError, match="cannot read the chat template .*missing.jinja: no such file"):
        ChatTemplate.from_file(tmp_path / "missing.jinja")
    with pytest.raises(InvalidArgumentError, match="a chat template is Jinja2 text"):
        ChatTemplate("  ")


def test_the_sandbox_refuses_python_internals():
    with pytest.raises(ChatTemplateError, match="failed to render"):
        ChatTemplate("{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}").render(CONVERSATIONS[0])


def test_read_conversations_gives_line_numbers_and_checked_messages(tmp_path):
    from gpt2.errors import DataError
    from gpt2.tokenizer.chat import read_conversations

    lines = [
        json.dumps({"messages": CONVERSATIONS[0], "id": 7}),
        "",
        "  ",
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": "Hi", "name": "ana"},
                    {"role": "assistant", "content": "Hello.", "weight": 1},
                ]
            }
        ),
    ]
    (tmp_path / "chat.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert list(read_conversations(tmp_path / "chat.jsonl", "chat.jsonl")) == [
        (1, CONVERSATIONS[0]),
        (4, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]),  # other keys left out
    ]
    (tmp_path / "bad.jsonl").write_text(
        lines[0] + '\n{"messages": [{"role": "user", "content": "Hi"}]}\n', encoding="utf-8"
    )
    with pytest.raises(DataError, match=r"^bad.jsonl, line 2: the conversation has no assistant message"):
        list(read_conversations(tmp_path / "bad.jsonl", "bad.jsonl"))
    (tmp_path / "empty.jsonl").write_text("\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"^{tmp_path / 'empty.jsonl'} holds no conversations"):
        list(read_conversations(tmp_path / "empty.jsonl"))


@pytest.mark.parametrize(
    "source, prefix",
    [(DEFAULT_TEMPLATE, " "), (CHATML, ""), ("{{ raise_exception('no') }}", "")],
    ids=["default", "chatml", "failing"],
)
def test_the_reply_prefix_is_what_the_template_writes_between_the_generation_prompt_and_a_reply(source, prefix):
    assert ChatTemplate(source).reply_prefix(Tokenizer.gpt2()) == prefix


def test_a_reply_streamed_loses_the_prefix_once_it_is_known_to_be_there():
    from gpt2.tokenizer.chat import ReplyText

    def streamed(prefix, pieces):
        reply = ReplyText(prefix)
        out = [reply.add(piece) for piece in pieces]
        return out + [reply.add("", ended=True)]

    assert streamed(" ", [" Par", "is"]) == ["Par", "is", ""]
    assert streamed(" ", ["", " ", "Paris"]) == [
        "",
        "",
        "Paris",
        "",
    ]  # a half character, then the space alone: held back
    assert streamed(" ", ["Paris", " is"]) == ["Paris", " is", ""]  # no prefix: the text as it is
    assert streamed("\n\n", ["\n", "\nHi"]) == ["", "Hi", ""]
    assert streamed(" ", [" "]) == ["", ""]  # a reply of the prefix alone is empty
    assert streamed("\n\n", ["\n"]) == ["", "\n"]  # the prefix's start, and then the end: what was held back
    assert streamed("", ["Hi"]) == ["Hi", ""]
