"""Structured outputs and the bending of scores: a constraint holds each row's text to it, byte
for byte; logit bias and penalties equal transformers' logits processors token for token; rows of
different constraints decode side by side as they do alone; bad input is named."""

from __future__ import annotations

import json
import re
import sys

import pytest
import torch
from helpers import PenaltiesWrittenOut, hf_and_ours, make_hf_model, perturbed
from transformers import LogitsProcessorList

from gpt2 import Tokenizer
from gpt2.errors import GPT2Error, MissingPackageError, TokenIdError
from gpt2.generation.decoding import LENGTH, STOP, Decoder, Row
from gpt2.generation.engines import TorchEngine
from gpt2.generation.generate import TextGeneration, generate_text
from gpt2.generation.processors import (
    Constraint,
    Penalties,
    Processing,
    compile_constraint,
    one_constraint,
    processing_of,
)
from gpt2.generation.sampling import Sampling
from gpt2.model.model import GPT2
from gpt2.tokenizer.char import CharTokenizer

ENC = Tokenizer.gpt2()


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """transformers' model and ours, on the same random weights of GPT-2's vocabulary."""
    return hf_and_ours(
        tmp_path_factory.mktemp("processors"), seed=5, vocab_size=50257, n_positions=128, n_embd=48, n_layer=2, n_head=3
    )


def rows_of(model, prompt: str, **options) -> TextGeneration:
    """A TextGeneration run to its end: its rows hold the tokens, its texts the text."""
    generation = TextGeneration(model, ENC, prompt, **options)
    generation.texts_out = [""] * len(generation.rows)
    for b, piece in generation:
        generation.texts_out[b] += piece
    return generation


# ------------------------------------------------------------------ constraints hold the text


@pytest.mark.parametrize(
    "text",
    ["hello world", "two\nlines\n", "naïve café, 日本語", "party 🎉🎈 time", "  spaced  out "],
    ids=["spaces", "newlines", "non-ascii", "emoji", "edge-spaces"],
)
def test_a_choice_of_one_string_yields_exactly_that_string(small, text):
    """The vocabulary is byte-level: llguidance must see each token's bytes exactly, or a string
    that splits a character across tokens could not be written. Greedy and sampled (hot), 3 rows."""
    _, model = small
    for options in ({"temperature": 0}, {"temperature": 1.5, "seed": 7, "num_samples": 3}):
        generation = rows_of(model, "Say it:", max_new_tokens=40, constraint=Constraint.choice([text]), **options)
        assert generation.texts_out == [text] * len(generation.rows)
        assert generation.finish_reasons == [STOP] * len(generation.rows)
        assert all(ENC.decode(row.tokens) == text for row in generation.rows)


SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "age", "tags", "ok"],
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]{1,6}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "bb"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
}
# The longest document SCHEMA allows, written as the constraint writes JSON (json.dumps' separators, no other
# whitespace): a token is at least a byte, so no document needs more tokens than this has bytes.
LONGEST = json.dumps({"name": "abcdef", "age": 120, "tags": ["bb", "bb", "bb"], "ok": False})


def valid(document: dict) -> bool:
    """SCHEMA's rules, written out."""
    return (
        list(document) == ["name", "age", "tags", "ok"]
        and re.fullmatch("[a-z]{1,6}", document["name"]) is not None
        and type(document["age"]) is int
        and 0 <= document["age"] <= 120
        and isinstance(document["ok"], bool)
        and len(document["tags"]) <= 3
        and set(document["tags"]) <= {"a", "bb"}
    )


def test_json_schema_documents_are_valid_and_end_within_the_longest_documents_bytes(small):
    """24 hot samples of a bounded schema, each allowed as many tokens as the longest document has
    bytes (66): every one is valid JSON of the schema and ends "stop", never cut."""
    _, model = small
    generation = rows_of(
        model,
        "A person:",
        max_new_tokens=len(LONGEST.encode()),
        temperature=1.5,
        seed=0,
        num_samples=24,
        constraint=Constraint.json_schema(SCHEMA),
    )
    documents = [json.loads(text) for text in generation.texts_out]
    assert all(map(valid, documents)) and generation.finish_reasons == [STOP] * 24
    assert len({json.dumps(d) for d in documents}) > 12  # sampled, not one document
    assert max(len(text.encode()) for text in generation.texts_out) <= len(LONGEST.encode())


def test_a_document_cut_by_max_new_tokens_ends_length_never_stop(small):
    _, model = small
    generation = rows_of(
        model,
        "A person:",
        max_new_tokens=6,
        temperature=1.0,
        seed=1,
        num_samples=4,
        constraint=Constraint.json_schema(SCHEMA),
    )
    assert generation.finish_reasons == [LENGTH] * 4
    for text in generation.texts_out:
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)


@pytest.mark.parametrize(
    "constraint, pattern",
    [
        (Constraint.regex(r"[0-9]{3}-[a-z]{2}"), r"[0-9]{3}-[a-z]{2}"),
        (Constraint.grammar('root ::= ("yes" | "no") ", " [0-9] [0-9]?'), r"(yes|no), [0-9][0-9]?"),  # GBNF
        (Constraint.grammar('start: "x = " NUM ";"\nNUM: /[1-9][0-9]{0,2}/'), r"x = [1-9][0-9]{0,2};"),  # Lark
        (Constraint.choice(["red", "green", "blue 💙"]), r"red|green|blue 💙"),
    ],
    ids=["regex", "gbnf", "lark", "choice"],
)
def test_regex_grammar_and_choice_texts_match(small, constraint, pattern):
    _, model = small
    generation = rows_of(
        model, "Answer:", max_new_tokens=20, temperature=1.2, seed=3, num_samples=8, constraint=constraint
    )
    assert all(re.fullmatch(pattern, text) for text in generation.texts_out), generation.texts_out
    assert generation.finish_reasons == [STOP] * 8


def test_any_json_object(small):
    _, model = small
    closing = {
        1: 8.0,
        92: 8.0,
        1298: 8.0,
        1600: 8.0,
        20662: 8.0,
    }  # '"', "}", '":', '",', '"}': a random model's strings end
    generation = rows_of(
        model,
        "{}",
        max_new_tokens=60,
        temperature=0.7,
        seed=2,
        num_samples=4,
        constraint=Constraint.json_object(),
        logit_bias=closing,
    )
    assert (
        all(isinstance(json.loads(text), dict) for text in generation.texts_out)
        and generation.finish_reasons == [STOP] * 4
    )


def test_a_character_model_is_held_to_a_constraint_and_ends_where_it_is_complete(tmp_path):
    """A character vocabulary has no <|endoftext|>: llguidance gets a token past the last to end
    on, and the row ends where the constraint allows nothing more."""
    chars = CharTokenizer(list('abcdefgh{}:" ,0123456789'))
    hf = make_hf_model(seed=1, vocab_size=chars.n_vocab, n_positions=64, n_embd=32, n_layer=1, n_head=2)
    hf.save_pretrained(tmp_path)
    model = GPT2.from_pretrained(tmp_path, device="cpu")
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["a"],
        "additionalProperties": False,
    }
    generation = TextGeneration(
        model,
        chars,
        "abc",
        max_new_tokens=30,
        temperature=1.0,
        seed=0,
        num_samples=6,
        constraint=Constraint.json_schema(schema),
    )
    texts = [""] * 6
    for b, piece in generation:
        texts[b] += piece
    assert all(set(json.loads(text)) == {"a"} for text in texts) and generation.finish_reasons == [STOP] * 6
    choice = generate_text(
        model, chars, "abc", max_new_tokens=10, temperature=0, constraint=Constraint.choice(["bad cafe"])
    )
    assert choice == ["bad cafe"]


SHAKESPEARE_CHARS = (
    "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # shakespeare_char's 65, no "{" or "["
)


@pytest.mark.parametrize(
    "constraint, message",
    [
        (
            Constraint.json_object(),
            "json_object: its text must begin '{', and the model's vocabulary (65 tokens) has no '{'",
        ),
        (
            Constraint.choice(["{x}"]),
            "choice: its text must begin '{x}', and the model's vocabulary (65 tokens) has no '{'",
        ),
        (
            Constraint.json_schema(
                {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
            ),
            "json_schema: its text must begin '{\"name\": \"', and the model's vocabulary (65 tokens) has no '{'",
        ),
        (
            Constraint.regex(r"ab\{y"),
            "regex: its text must begin 'ab{y', and the model's vocabulary (65 tokens) has no '{'",
        ),
        (
            Constraint.regex(r"(\{|\[)a"),
            "regex: its text must begin with '[' or '{', and the model's vocabulary (65 tokens) has none of them",
        ),
    ],
)
def test_a_constraint_no_token_can_begin_is_refused_before_generating_naming_the_character(constraint, message):
    """shakespeare_char's 65 characters have no "{": a JSON object can never begin. Refused as the
    request is made, in one line naming the character, at every door (Python here; the CLI and
    the server in their tests); never a traceback from sampling nothing."""
    model = GPT2.from_pretrained("shakespeare_char", device="cpu")
    assert "".join(model.tokenizer.decode([i]) for i in range(65)) == SHAKESPEARE_CHARS
    with pytest.raises(GPT2Error) as caught:
        generate_text(model, model.tokenizer, "A:", max_new_tokens=5, constraint=constraint)
    assert str(caught.value) == message and "\n" not in str(caught.value)
    assert generate_text(
        model, model.tokenizer, "A:", max_new_tokens=5, seed=0, constraint=Constraint.choice(["ab", "{x}"])
    ) == ["ab"]


def test_a_token_that_breaks_a_constraint_is_named_in_one_line():
    """llguidance reports the parser's state and grammar in 25 lines: the error keeps its first."""
    compiled = compile_constraint(Constraint.regex("[a-c]+"), ENC)
    process = Processing(compiled=compiled).start([1, 2])
    with pytest.raises(GPT2Error, match="^token 88 broke the constraint: ") as caught:
        process.advance(ENC.encode("y")[0])
    assert "\n" not in str(caught.value) and ENC.encode("y") == [88]


# ------------------------------------------------------------------ rows of each, together


def test_rows_of_different_processing_in_one_batch_get_their_tokens_alone(small):
    """7 sampled rows, 3 slots: a schema, a regex, a choice, penalties and bias, none; each row's
    tokens equal those it gets alone."""
    _, model = small
    processings = [
        processing_of(ENC, Constraint.json_schema(SCHEMA)),
        processing_of(ENC, Constraint.regex("[a-z ]{5,20}")),
        processing_of(ENC, Constraint.choice(["one", "two", "three"])),
        processing_of(ENC, frequency_penalty=1.5, presence_penalty=-0.5, repetition_penalty=1.3, logit_bias={11: 3.0}),
        None,
        processing_of(ENC, Constraint.regex("[0-9]+")),
        processing_of(ENC, Constraint.json_object()),
    ]
    prompts = [ENC.encode(p) for p in ["Data:", "Words", "Pick", "Go on and on", "Free", "Count", "{"]]

    def make() -> list[Row]:
        return [
            Row(
                prompts[i],
                len(LONGEST) if i == 0 else 12 + 3 * i,
                Sampling(1.0, top_k=100),
                seed=40 + i,
                eos_token_id=50256,
                processing=processings[i],
            )
            for i in range(7)
        ]

    together, decoder = make(), Decoder(TorchEngine(model, 3))
    for row in together:
        decoder.add(row)
    with torch.inference_mode():
        while decoder.busy:
            decoder.step()
    for row, other in zip(together, make()):
        alone = Decoder(TorchEngine(model, 1))
        alone.add(other)
        with torch.inference_mode():
            while alone.busy:
                alone.step()
        assert row.tokens == other.tokens and row.finish_reason == other.finish_reason
    assert together[0].finish_reason == STOP and valid(json.loads(ENC.decode(together[0].tokens)))


def test_a_draft_model_under_a_constraint_gives_the_greedy_text_without_it(small, tmp_path):
    """Speculative decoding with a draft model: the draft proposes from its constrained scores, the
    model verifies them under its own; the text equals that without a draft, and drafts are kept."""
    hf, model = small
    perturbed(hf, 0.3).save_pretrained(tmp_path)
    draft = GPT2.from_pretrained(tmp_path, device="cpu")
    options = dict(
        max_new_tokens=60,
        temperature=0,
        num_samples=1,
        constraint=Constraint.json_schema(SCHEMA),
        frequency_penalty=0.3,
    )
    plain = rows_of(model, "A person:", **options)
    drafted = rows_of(model, "A person:", draft=draft, draft_tokens=3, **options)
    assert drafted.texts_out == plain.texts_out and valid(json.loads(plain.texts_out[0]))
    assert drafted.stats.accepted > 0


# ------------------------------------------------------------------ logit bias and penalties: transformers' rules


PENALTY_CASES = [
    ({"frequency_penalty": 0.8}, {"logits_processor": (0.0, 0.8, 0.0, 1.0)}),
    ({"presence_penalty": 1.5}, {"logits_processor": (0.0, 0.0, 1.5, 1.0)}),
    ({"frequency_penalty": -0.4, "presence_penalty": 0.9}, {"logits_processor": (0.0, -0.4, 0.9, 1.0)}),
    ({"repetition_penalty": 1.3}, {"repetition_penalty": 1.3}),  # transformers' own RepetitionPenaltyLogitsProcessor
    ({"repetition_penalty": 0.8}, {"repetition_penalty": 0.8}),
    (
        {"logit_bias": {262: 6.0, 13: -100}},
        {"sequence_bias": {(262,): 6.0, (13,): -100.0}},
    ),  # transformers' SequenceBiasLogitsProcessor
    (
        {"logit_bias": {11: 2.5}, "repetition_penalty": 1.2, "frequency_penalty": 0.5, "presence_penalty": 0.25},
        {"logits_processor": ({11: 2.5}, 0.5, 0.25, 1.2)},
    ),
]


@pytest.mark.parametrize(
    "ours, theirs",
    PENALTY_CASES,
    ids=["frequency", "presence", "both", "repetition", "repetition-below-1", "bias", "all"],
)
def test_greedy_text_with_penalties_equals_transformers_with_the_same_rule(small, ours, theirs):
    hf, model = small
    prompt = ENC.encode("The cat sat on the mat. The cat sat on the mat. The cat")
    generation = rows_of(model, ENC.decode(prompt), max_new_tokens=30, temperature=0, **ours)
    if "logits_processor" in theirs:
        bias, frequency, presence, repetition = theirs.pop("logits_processor")
        theirs["logits_processor"] = LogitsProcessorList(
            [PenaltiesWrittenOut(len(prompt), bias or {}, frequency, presence, repetition)]
        )
    idx = torch.tensor([prompt])
    out = hf.generate(
        idx, max_new_tokens=30, do_sample=False, attention_mask=torch.ones_like(idx), pad_token_id=50256, **theirs
    )
    expected = out[0, len(prompt) :].tolist()
    plain = rows_of(model, ENC.decode(prompt), max_new_tokens=30, temperature=0).rows[0].tokens
    assert generation.rows[0].tokens == expected[: len(generation.rows[0].tokens)] and len(expected) >= len(
        generation.rows[0].tokens
    )
    assert generation.rows[0].tokens != plain  # the rule changed the text: the test tells them apart


def test_a_bias_of_100_forces_a_token_and_minus_100_bans_it(small):
    _, model = small
    forced = rows_of(model, "Hello", max_new_tokens=8, temperature=1.0, seed=0, logit_bias={464: 100})
    assert forced.rows[0].tokens == [464] * 8
    plain = rows_of(model, "Hello", max_new_tokens=8, temperature=0).rows[0].tokens
    banned = rows_of(model, "Hello", max_new_tokens=8, temperature=0, logit_bias={plain[0]: -100}).rows[0].tokens
    assert banned[0] != plain[0]


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "make, param, message",
    [
        (
            lambda: Penalties(frequency_penalty=2.5),
            "frequency_penalty",
            "frequency_penalty must be a number from -2 to 2, got 2.5",
        ),
        (
            lambda: Penalties(presence_penalty=float("nan")),
            "presence_penalty",
            "presence_penalty must be a number from -2 to 2",
        ),
        (lambda: Penalties(repetition_penalty=0), "repetition_penalty", "repetition_penalty must be a number above 0"),
        (
            lambda: Penalties.make({50256: 100.5}),
            "logit_bias",
            "logit_bias values must be numbers from -100 to 100, got 100.5",
        ),
        (lambda: Penalties.make({"eos": 1}), "logit_bias", "logit_bias keys must be token ids"),
        (lambda: Penalties.make([1, 2]), "logit_bias", "logit_bias must map token ids to biases"),
        (lambda: Constraint.choice([]), "choice", "choice needs at least one string"),
        (lambda: Constraint.choice("yes"), "choice", "choice must be a list of strings"),
        (lambda: Constraint.regex(""), "regex", "regex must be non-empty text"),
        (lambda: Constraint("yaml", "a: 1"), "constraint", "unknown constraint 'yaml'"),
        (lambda: compile_constraint(Constraint.regex("a(("), ENC), "regex", 'regex: at 1(8): invalid regex "a(("'),
        (
            lambda: compile_constraint(Constraint.json_schema({"type": "nonsense"}), ENC),
            "json_schema",
            "json_schema: Invalid type: nonsense",
        ),
        (lambda: Constraint.json_schema("{not json"), "json_schema", "json_schema is not JSON"),
        (
            lambda: compile_constraint(Constraint.grammar("root ::= missing"), ENC),
            "grammar",
            "Rule 'missing' not found",
        ),
        (lambda: compile_constraint(Constraint.grammar("start: ((("), ENC), "grammar", "grammar:"),
        (
            lambda: one_constraint(json_schema={}, regex="a"),
            "json_schema",
            "one constraint at a time: json_schema and regex",
        ),
    ],
)
def test_bad_constraints_and_penalties_are_named(make, param, message):
    with pytest.raises(GPT2Error) as caught:
        make()
    assert caught.value.param == param and message in str(caught.value) and "\n" not in str(caught.value)


def test_a_bias_for_an_id_past_the_vocabulary_is_named(small):
    _, model = small
    with pytest.raises(TokenIdError, match=r"token id 50257 in logit_bias is out of range: ids are 0..50256"):
        generate_text(model, ENC, "Hi", max_new_tokens=2, logit_bias={50257: 1})


def test_without_llguidance_a_constraint_asks_for_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "llguidance", None)  # import llguidance now raises ImportError
    with pytest.raises(MissingPackageError, match=r"pip install 'gpt2\[structured\]'"):
        compile_constraint(Constraint.regex("[0-9]+"), CharTokenizer(list("0123456789")))
    assert Processing().start([1]) is None  # no constraint, no penalties: rows carry no state
