"""Generation: the KV cache, decoding, text, streaming, context overflow, bad input."""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers import hf_and_ours, make_hf_model, perturbed, transformers_greedy, transformers_sampled

from gpt2 import (
    ContextLengthError,
    GPT2Error,
    GPT2Warning,
    InputTypeError,
    InvalidArgumentError,
    NonFiniteError,
    TokenIdError,
    Tokenizer,
)
from gpt2.generation.decoding import ContextOverflowWarning, Decoder, Row
from gpt2.generation.engines import TorchEngine
from gpt2.generation.generate import (
    EmptyPromptWarning,
    TextGeneration,
    TextRow,
    TokenGeneration,
    generate_text,
    stream_text,
)
from gpt2.generation.sampling import Sampling
from gpt2.model.model import GPT2
from gpt2.model.pretrained import hf_state_dict
from gpt2.reference import ReferenceModel

ENC = Tokenizer.gpt2()


def hf_greedy(hf, idx, n, attention_mask=None):
    mask = torch.ones_like(idx) if attention_mask is None else attention_mask
    return hf.generate(idx, max_new_tokens=n, do_sample=False, attention_mask=mask, pad_token_id=hf.config.eos_token_id)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A small model with GPT-2's vocabulary, so text round-trips through the tokenizer."""
    return hf_and_ours(
        tmp_path_factory.mktemp("small"), vocab_size=50257, n_positions=64, n_embd=48, n_layer=2, n_head=3
    )


# ------------------------------------------------------------------ parity with transformers


def test_greedy_equals_transformers_124m_shape(tmp_path):
    hf, ours = hf_and_ours(tmp_path, n_positions=256)
    for batch in (1, 3):
        idx = torch.randint(0, 50257, (batch, 12), generator=torch.Generator().manual_seed(batch))
        assert torch.equal(ours.generate(idx, 32, temperature=0), hf_greedy(hf, idx, 32))  # the small configs: 64


@pytest.mark.parametrize(
    "config",
    [
        dict(vocab_size=101, n_positions=96, n_embd=48, n_layer=3, n_head=3),
        dict(vocab_size=257, n_positions=80, n_embd=35, n_layer=2, n_head=5),
    ],
    ids=["L3H3", "L2H5"],
)
def test_greedy_equals_transformers_small_configs(config, tmp_path):
    hf, ours = hf_and_ours(tmp_path, **config)
    for batch in (1, 4):
        idx = torch.randint(0, config["vocab_size"], (batch, 9), generator=torch.Generator().manual_seed(batch))
        assert torch.equal(ours.generate(idx, 64, temperature=0), hf_greedy(hf, idx, 64))


def test_prompts_of_different_lengths_equal_transformers_left_padded(small):
    hf, ours = small
    prompts = [
        ENC.encode("The quick brown fox jumps over"),
        ENC.encode("Hello"),
        ENC.encode("GPT-2 is a language model that"),
    ]
    longest = max(map(len, prompts))
    idx = torch.tensor([[50256] * (longest - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
    expected = hf_greedy(hf, idx, 20, attention_mask=mask)[:, longest:]
    rows = [Row(p, 20, Sampling(temperature=0)) for p in prompts]
    decoder = Decoder(TorchEngine(ours, 3, longest + 20))
    for row in rows:
        decoder.add(row)
    with torch.inference_mode():
        while decoder.busy:
            decoder.step()
    assert torch.equal(torch.tensor([row.tokens for row in rows]), expected)
    # and each row equals its own unbatched continuation
    texts = generate_text(ours, ENC, [ENC.decode(p) for p in prompts], max_new_tokens=20, temperature=0)
    for text, prompt in zip(texts, prompts):
        assert text == generate_text(ours, ENC, ENC.decode(prompt), max_new_tokens=20, temperature=0)[0]


# ------------------------------------------------------------------ decoding


def test_seed_reproduces_sampling(small):
    _, model = small
    run = lambda seed: generate_text(model, ENC, "Once upon a time", max_new_tokens=15, seed=seed, top_k=50)  # noqa: E731
    assert run(1) == run(1)
    assert run(1) != run(2)
    idx = torch.tensor([[464, 3290]])
    assert torch.equal(model.generate(idx, 10, seed=5), model.generate(idx, 10, seed=5))


def test_several_samples_per_prompt(small):
    _, model = small
    greedy = generate_text(model, ENC, "Hello", max_new_tokens=8, temperature=0, num_samples=3)
    assert len(greedy) == 3 and len(set(greedy)) == 1
    sampled = generate_text(model, ENC, ["Hello", "Bye"], max_new_tokens=8, seed=0, num_samples=2)
    assert len(sampled) == 4 and len(set(sampled)) > 1


# ------------------------------------------------------------------ text: ends, stop strings, streaming


def feed(row: TextRow, text: str) -> list[str]:
    pieces = [p for t in ENC.encode(text) if (p := row.add(t))]
    return pieces + ([p] if (p := row.finish()) else [])


def test_stop_string_ends_the_text_before_it_and_is_never_streamed():
    pieces = feed(TextRow(ENC, ["\n\n"]), "Hello world\nstill going\n\nBye now")
    assert "".join(pieces) == "Hello world\nstill going"
    assert all("\n\n" not in p for p in pieces)


def test_text_that_only_began_a_stop_string_is_released():
    pieces = feed(TextRow(ENC, ["world!"]), "hello world? yes")
    assert "".join(pieces) == "hello world? yes"


def test_end_of_text_ends_a_row():
    row = TextRow(ENC, [])
    pieces = [p for t in ENC.encode("one two") + [50256] + ENC.encode(" three") if (p := row.add(t))]
    assert "".join(pieces) == "one two" and row.done


def test_streaming_never_splits_a_character():
    row = TextRow(ENC, [])
    pieces = feed(row, "emoji 🤗 and 中文")
    assert "".join(pieces) == "emoji 🤗 and 中文"
    assert all("\ufffd" not in p for p in pieces)


def test_stream_text_pieces_join_to_generate_text(small):
    _, model = small
    options = dict(max_new_tokens=25, seed=3, top_k=100, stop=[" the"])
    pieces = list(stream_text(model, ENC, "In the beginning", **options))
    assert "".join(pieces) == generate_text(model, ENC, "In the beginning", **options)[0]
    assert len(pieces) > 1


def test_empty_prompt_starts_from_end_of_text(small):
    _, model = small
    with pytest.warns(EmptyPromptWarning, match="generating from <\\|endoftext\\|>"):
        text = generate_text(model, ENC, "", max_new_tokens=5, temperature=0)[0]
    ids = model.generate(torch.tensor([[50256]]), 5, temperature=0)[0, 1:].tolist()
    assert text == ENC.decode(ids[: ids.index(50256)] if 50256 in ids else ids)
    assert text != ""


def test_end_of_text_written_in_a_prompt_is_the_special_token_unless_read_as_text(small):
    """allowed_special="all" by default, as OpenAI's API, gpt2 generate and gpt2 serve; frozenset() reads
    its characters."""
    hf, model = small
    prompt = "The end.<|endoftext|>A new story"
    special = ENC.encode("The end.") + [50256] + ENC.encode("A new story")
    as_text = ENC.encode_ordinary(prompt)
    assert 50256 not in as_text

    def transformers_greedy(ids):
        new = hf_greedy(hf, torch.tensor([ids]), 10)[0, len(ids) :].tolist()
        return ENC.decode(new[: new.index(50256)] if 50256 in new else new)

    greedy = dict(max_new_tokens=10, temperature=0)
    assert generate_text(model, ENC, prompt, **greedy)[0] == transformers_greedy(special)
    assert generate_text(model, ENC, prompt, **greedy, allowed_special="all")[0] == transformers_greedy(special)
    read_as_text = "".join(stream_text(model, ENC, prompt, **greedy, allowed_special=frozenset()))
    assert read_as_text == transformers_greedy(as_text) != transformers_greedy(special)
    with pytest.raises(InvalidArgumentError, match="allowed_special must be a set of special tokens or 'all'"):
        TextGeneration(model, ENC, prompt, allowed_special="none")


def test_gpt2s_warnings_are_silenced_by_one_filter(small):
    from gpt2.generation.graphs import CUDAGraphWarning

    _, model = small
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.simplefilter("ignore", GPT2Warning)
        generate_text(model, ENC, "", max_new_tokens=2, temperature=0)  # an empty prompt
        model.generate(torch.zeros(1, model.config.n_ctx, dtype=torch.long), 2, temperature=0)  # past the context
    assert caught == []  # (without the filter: two warnings)
    assert issubclass(CUDAGraphWarning, GPT2Warning) and issubclass(CUDAGraphWarning, RuntimeWarning)


def test_eos_token_id_fills_ended_rows(small):
    _, model = small
    idx = torch.tensor([[464, 3290], [15496, 11]])
    free = model.generate(idx, 6, temperature=0)
    eos = int(free[0, 3])  # pretend the 2nd new token of row 0 is the end
    out = model.generate(idx, 6, temperature=0, eos_token_id=eos)
    assert (out[0, 3:] == eos).all() and torch.equal(out[:, :4], free[:, :4])


# ------------------------------------------------------------------ context overflow


def test_context_slides_like_nanogpt_cropping(tmp_path):
    _, model = hf_and_ours(tmp_path, vocab_size=97, n_positions=16, n_embd=24, n_layer=2, n_head=2)
    idx = torch.randint(0, 97, (2, 10), generator=torch.Generator().manual_seed(0))
    with pytest.warns(ContextOverflowWarning, match="the model sees only the last 16 tokens") as record:
        out = model.generate(idx, 20, temperature=0)
    assert len(record) == 1
    expected = idx
    with torch.no_grad():
        for _ in range(20):
            next_id = model(expected[:, -16:])[:, -1].argmax(-1, keepdim=True)
            expected = torch.cat([expected, next_id], 1)
    assert torch.equal(out, expected)
    long_prompt = torch.randint(0, 97, (1, 40))  # longer than the context on its own
    with pytest.warns(ContextOverflowWarning):
        assert model.generate(long_prompt, 3, temperature=0).shape == (1, 43)


def test_the_context_warning_points_at_the_line_that_asked(small):
    """Each door reaches the check at its own depth: the warning names the caller's file, this one,
    not gpt2's; so does an empty prompt's."""
    _, model = small
    doors = [
        (ContextOverflowWarning, lambda: model.generate(torch.tensor([[1, 2]]), 63, temperature=0)),
        (ContextOverflowWarning, lambda: generate_text(model, ENC, "Hi", max_new_tokens=64, temperature=0)),
        (ContextOverflowWarning, lambda: TextGeneration(model, ENC, "Hi", max_new_tokens=64, temperature=0)),
        (EmptyPromptWarning, lambda: generate_text(model, ENC, "", max_new_tokens=1, temperature=0)),
        (EmptyPromptWarning, lambda: TextGeneration(model, ENC, "", max_new_tokens=1, temperature=0)),
    ]
    for kind, call in doors:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        [warning] = [w for w in caught if issubclass(w.category, kind)]
        assert warning.filename == __file__, (kind, warning.filename, warning.lineno)


def test_context_overflow_can_be_an_error(small):
    _, model = small
    with pytest.raises(
        ContextLengthError, match="the prompt \\(2 tokens\\) and 63 new tokens exceed the context of n_ctx=64"
    ):
        model.generate(torch.tensor([[1, 2]]), 63, on_overflow="error")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.generate(torch.tensor([[1, 2]]), 62, on_overflow="error")  # fits exactly: no warning


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(max_new_tokens=0), "max_new_tokens must be a positive integer, got 0"),
        (dict(max_new_tokens=-3), "max_new_tokens must be a positive integer, got -3"),
        (dict(temperature=-0.1), "temperature must be a finite number >= 0"),
        (dict(temperature=float("inf")), "temperature must be a finite number >= 0 \\(0 is greedy\\), got inf"),
        (dict(temperature=float("nan")), "temperature must be a finite number >= 0"),
        (dict(temperature="hot"), "temperature must be a finite number >= 0"),
        (dict(top_k=0), "top_k must be an integer from 1 up, got 0"),
        (dict(top_k=float("inf")), "top_k must be an integer from 1 up, got inf"),
        (dict(top_k=True), "top_k must be an integer from 1 up, got True"),
        (dict(top_k=50258), "got 50258"),
        (dict(top_p=0.0), "top_p must be in \\(0, 1\\], got 0.0"),
        (dict(top_p=1.01), "top_p must be in \\(0, 1\\], got 1.01"),
        (dict(top_p=float("inf")), "top_p must be in \\(0, 1\\], got inf"),
        (dict(top_p=float("nan")), "top_p must be in \\(0, 1\\], got nan"),
        (dict(stop=[""]), "stop strings must be non-empty text"),
        (dict(stop=""), "stop strings must be non-empty text"),
        (dict(stop=["ok", None]), "stop strings must be non-empty text, got None"),
        (dict(num_samples=0), "num_samples must be a positive integer"),
        (dict(num_samples=-2), "num_samples must be a positive integer, got -2"),
        (dict(seed=-1), "seed must be a whole number from 0 to 18446744073709551615, got -1"),
        (dict(seed=2**64), "seed must be a whole number from 0 to 18446744073709551615, got 18446744073709551616"),
        (dict(seed=1.5), "seed must be a whole number"),
        (dict(seed=True), "seed must be a whole number"),
        (dict(on_overflow="wrap"), "on_overflow must be 'slide' or 'error'"),
    ],
)
def test_bad_options_are_named(small, options, message):
    _, model = small
    with pytest.raises(InvalidArgumentError, match=message):
        TextGeneration(model, ENC, "Hello", **options)


def test_bad_tensor_input(small):
    _, model = small
    with pytest.raises(TokenIdError, match="token id 50257 in prompt 0 is out of range"):
        model.generate(torch.tensor([[50257]]), 3)
    with pytest.raises(
        InvalidArgumentError, match="idx must have shape \\(B, T\\), got \\[2\\]; for one sequence use idx\\[None\\]"
    ):
        model.generate(torch.tensor([1, 2]), 3)
    with pytest.raises(
        InputTypeError, match="integer tensor of token ids shaped \\(B, T\\), got a torch.float32 tensor"
    ):
        model.generate(torch.zeros(1, 2), 3)
    with pytest.raises(InvalidArgumentError, match="prompt 0 is empty"):
        model.generate(torch.zeros(1, 0, dtype=torch.long), 3)
    with pytest.raises(InputTypeError, match="prompts must be str"):
        generate_text(model, ENC, [b"bytes"])


def test_stop_none_means_no_stop_strings_and_other_types_are_named(small):
    _, model = small
    options = dict(max_new_tokens=6, temperature=0)
    assert generate_text(model, ENC, "Hello", stop=None, **options) == generate_text(model, ENC, "Hello", **options)
    with pytest.raises(InputTypeError, match="stop must be a str, a list of str, or None, got int"):
        generate_text(model, ENC, "Hello", stop=5, **options)


def test_stream_text_refuses_several_samples(small):
    _, model = small
    with pytest.raises(InvalidArgumentError, match="stream_text streams one continuation .* iterate TextGeneration"):
        next(stream_text(model, ENC, "Hello", num_samples=2))


# ------------------------------------------------------------------ seeds


def test_seed_2_63_samples_other_text_than_seed_0(small):
    _, model = small
    run = lambda seed: generate_text(model, ENC, "Once upon a time", max_new_tokens=15, seed=seed)  # noqa: E731
    assert run(2**63) != run(0) and run(2**32) != run(0)
    assert run(2**64 - 1) == run(2**64 - 1)


# ------------------------------------------------------------------ a model that produces NaN or inf


@pytest.fixture(scope="module")
def broken(small, tmp_path_factory):
    """The small model, once with a NaN in its final LayerNorm and once with an inf in its embedding."""
    _, model = small
    nan, inf = GPT2(model.config), GPT2(model.config)
    nan.load_state_dict(model.state_dict())
    inf.load_state_dict(model.state_dict())
    with torch.no_grad():
        nan.transformer.ln_f.weight[3] = float("nan")
        inf.transformer.wte.weight[464, 0] = float("inf")  # "The"
    return nan.eval(), inf.eval()


@pytest.mark.parametrize(
    "options",
    [dict(temperature=0), dict(temperature=0.8, seed=0), dict(top_k=5, top_p=0.9, seed=1)],
    ids=["greedy", "sampled", "filtered"],
)
def test_nan_or_inf_logits_stop_generation_with_a_clear_error(broken, options):
    for model in broken:
        with pytest.raises(NonFiniteError, match="the model produced NaN or infinite logits at new token 1"):
            generate_text(model, ENC, "The dog", max_new_tokens=5, **options)
        with pytest.raises(NonFiniteError):
            model.generate(torch.tensor([[464, 3290]]), 5, **options)
        with pytest.raises(NonFiniteError):
            generate_text(
                ReferenceModel(model.config, {k: v.numpy() for k, v in hf_state_dict(model).items()}),
                ENC,
                "The dog",
                max_new_tokens=2,
                **options,
            )


# ------------------------------------------------------------------ a draft model (speculative decoding)


@pytest.fixture(scope="module")
def draft(small, tmp_path_factory):
    """A draft of the small model's vocabulary that agrees with it often, not always."""
    directory = tmp_path_factory.mktemp("draft")
    perturbed(small[0], 0.5).save_pretrained(directory)
    return GPT2.from_pretrained(directory, device="cpu")


def test_greedy_text_with_a_draft_is_the_text_without_it_with_its_stop_strings_and_reasons(small, draft):
    """A row gets several tokens a step with a draft: its text still ends just before a stop
    string, and each row's finish reason is its own, as without a draft."""
    _, model = small
    prompts = ["Once upon a time", "The meaning of life is", "Hello"]
    free = generate_text(model, ENC, prompts, max_new_tokens=30, temperature=0)
    assert generate_text(model, ENC, prompts, max_new_tokens=30, temperature=0, draft=draft, draft_tokens=3) == free
    stop = free[1][8:12]
    runs = [
        TextGeneration(model, ENC, prompts, max_new_tokens=30, temperature=0, stop=stop, **options)
        for options in ({}, {"draft": draft, "draft_tokens": 5})
    ]
    texts = [[""] * 3, [""] * 3]
    for run, text in zip(runs, texts):
        for row, piece in run:
            text[row] += piece
    assert texts[1] == texts[0] and texts[0][1] == free[1][: free[1].index(stop)]
    assert runs[1].finish_reasons == runs[0].finish_reasons and runs[1].tokens_generated == runs[0].tokens_generated
    assert runs[1].stats.accepted > 0 and runs[1].stats.tokens_per_pass > 1


def test_the_numpy_engine_drafts_as_the_torch_engine_does(small, draft):
    _, model = small
    numpy_model, numpy_draft = (
        ReferenceModel(m.config, {k: v.numpy() for k, v in hf_state_dict(m).items()}) for m in (model, draft)
    )
    expected = generate_text(model, ENC, "Hello", max_new_tokens=8, temperature=0)
    assert generate_text(numpy_model, ENC, "Hello", max_new_tokens=8, temperature=0, draft=numpy_draft) == expected


def test_a_draft_that_does_not_share_the_models_vocabulary_or_device_is_refused_naming_it(small):
    from gpt2.checkpoints.config import GPT2Config
    from gpt2.tokenizer import CharTokenizer

    _, model = small
    idx = torch.tensor([[464, 3290]])
    config = dict(n_ctx=16, n_embd=8, n_head=2, n_layer=1)
    with pytest.raises(
        InvalidArgumentError, match="draft has a vocabulary of 97 tokens, the model 50,257: a draft model must share"
    ) as caught:
        model.generate(idx, 4, draft=GPT2(GPT2Config(n_vocab=97, **config)))
    assert caught.value.param == "draft"
    with torch.device("meta"):
        elsewhere = GPT2(GPT2Config(n_vocab=50257, **config))
    with pytest.raises(InvalidArgumentError, match="draft is on meta, the model on cpu: load both on one device"):
        generate_text(model, ENC, "Hello", draft=elsewhere)
    chars, other = GPT2(GPT2Config(n_vocab=3, **config)), GPT2(GPT2Config(n_vocab=3, **config))
    chars.tokenizer, other.tokenizer = CharTokenizer("abc"), CharTokenizer("xyz")
    with pytest.raises(
        InvalidArgumentError, match="draft has another tokenizer than the model's \\(of 3 tokens too"
    ) as caught:
        chars.generate(torch.tensor([[0, 1]]), 4, draft=other)
    assert caught.value.param == "draft"
    with pytest.raises(InvalidArgumentError, match="draft has another tokenizer than the model's"):
        generate_text(chars, CharTokenizer("abc"), "ab", draft=other)
    other.tokenizer = CharTokenizer("abc")  # the same characters: a draft of its own
    assert chars.generate(torch.tensor([[0, 1]]), 4, temperature=0, draft=other).shape == (1, 6)


@pytest.mark.parametrize("draft_tokens", [0, -1, 1.5, True])
def test_draft_tokens_must_be_a_positive_whole_number(small, draft, draft_tokens):
    _, model = small
    with pytest.raises(
        InvalidArgumentError, match=f"draft_tokens must be a positive integer, got {draft_tokens}"
    ) as caught:
        model.generate(torch.tensor([[464]]), 4, draft=draft, draft_tokens=draft_tokens)
    assert caught.value.param == "draft_tokens"
    with pytest.raises(InvalidArgumentError, match="draft_tokens must be a positive integer"):
        TextGeneration(model, ENC, "Hello", draft=draft, draft_tokens=draft_tokens)


def test_a_draft_that_produces_nan_stops_generation_with_a_clear_error(small, broken):
    _, model = small
    with pytest.raises(NonFiniteError, match="the draft model produced NaN or infinite logits at new token 2"):
        generate_text(model, ENC, "The dog", max_new_tokens=5, temperature=0, draft=broken[0])


# ------------------------------------------------------------------ conversations


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A tiny model of 64 positions saved with gpt2's default chat template; transformers' model
    and its tokenizer of the same directory (which reads the template from tokenizer_config.json)."""
    from transformers import AutoTokenizer

    from gpt2.tokenizer.chat import DEFAULT_TEMPLATE

    directory = tmp_path_factory.mktemp("chat")
    hf = make_hf_model(seed=3, vocab_size=50257, n_positions=64, n_embd=48, n_layer=2, n_head=3)
    hf.save_pretrained(directory)
    Tokenizer.gpt2().with_chat_template(DEFAULT_TEMPLATE).save_pretrained(directory)
    return hf, GPT2.from_pretrained(directory, device="cpu"), AutoTokenizer.from_pretrained(directory)


def hf_chat_reply(chat_model, messages, n):
    """transformers' greedy reply of n tokens on its apply_chat_template ids, less the default template's
    space after "Assistant:"."""
    hf, _, hf_tokenizer = chat_model
    ids = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    new = hf_greedy(hf, torch.tensor([ids]), n)[0, len(ids) :].tolist()
    text = hf_tokenizer.decode(new)
    return text[1:] if text.startswith(" ") else text


def test_a_chat_replies_as_transformers_continues_the_rendered_history(chat_model):
    from gpt2.generation.generate import Chat

    chat = Chat(chat_model[1], chat_model[1].tokenizer, system="Be brief.", max_new_tokens=6, temperature=0)
    first = "".join(chat.reply("Hi there"))
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    assert first == hf_chat_reply(chat_model, history, 6) and chat.finish_reason == "length"
    second = "".join(chat.reply("And then?"))  # its prompt holds the first reply, as the assistant's message
    history += [{"role": "assistant", "content": first}, {"role": "user", "content": "And then?"}]
    assert second == hf_chat_reply(chat_model, history, 6)
    assert chat.messages == [*history, {"role": "assistant", "content": second}] and chat.dropped == 0
    chat.reset()
    assert chat.messages == history[:1] and "".join(chat.reply("Hi there")) == first


def test_a_reply_stopped_early_is_not_kept(chat_model):
    from gpt2.generation.generate import Chat

    chat = Chat(chat_model[1], chat_model[1].tokenizer, max_new_tokens=6, temperature=0)
    pieces = chat.reply("Hello")
    next(pieces)
    pieces.close()  # as Ctrl-C leaves it
    assert chat.messages == []
    assert "".join(chat.reply("Hello")) == hf_chat_reply(chat_model, [{"role": "user", "content": "Hello"}], 6)


def test_a_seeded_conversation_can_be_had_again(chat_model):
    from gpt2.generation.generate import Chat

    def conversation():
        chat = Chat(chat_model[1], chat_model[1].tokenizer, max_new_tokens=8, seed=5)
        return ["".join(chat.reply(text)) for text in ("One", "Two")]

    first = conversation()
    assert first == conversation() and first[0] != first[1]


def test_the_oldest_turns_are_left_out_to_fit_the_context(chat_model):
    from gpt2.generation.generate import Chat

    hf_tokenizer = chat_model[2]
    chat = Chat(chat_model[1], chat_model[1].tokenizer, system="S.", max_new_tokens=10, temperature=0)

    def fits(messages):
        return len(hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)) + 10 <= 64

    for turn in range(4):  # each message is 14 tokens rendered ("User: " + 12 words + "\n"), 64 positions in all
        history = [*chat.messages, {"role": "user", "content": "word " * 11 + str(turn)}]
        "".join(chat.reply(history[-1]["content"]))
    assert chat.dropped > 0 and chat.dropped % 2 == 0  # whole turns: a message and its reply
    kept = [history[0], *history[1 + chat.dropped :]]  # the system message stays
    assert chat.messages[:-1] == kept and fits(kept)
    assert not fits([history[0], *history[1 + chat.dropped - 2 :]])  # one more turn would not have fitted
    before = list(chat.messages)
    with pytest.raises(
        ContextLengthError,
        match=r"the message does not fit: the conversation is \d+ tokens with it alone, and a reply "
        r"of up to 10 tokens makes \d+ more than the model's context of 64: ",
    ):
        chat.reply("word " * 60)
    assert chat.messages == before


def test_a_chat_needs_a_template_and_sound_options(chat_model):
    from gpt2.generation.generate import Chat
    from gpt2.tokenizer.chat import ChatTemplate

    model = chat_model[1]
    with pytest.raises(
        InvalidArgumentError, match="the model's tokenizer has no chat template.*give one with chat_template"
    ) as caught:
        Chat(model, Tokenizer.gpt2())
    assert caught.value.param == "chat_template"
    chat = Chat(
        model,
        Tokenizer.gpt2(),
        chat_template=ChatTemplate("{{ messages[-1]['content'] }}:"),
        max_new_tokens=3,
        temperature=0,
    )
    assert (
        chat.prefix == ""
        and "".join(chat.reply("Hi"))
        == generate_text(model, Tokenizer.gpt2(), "Hi:", max_new_tokens=3, temperature=0)[0]
    )
    for options, param in [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"seed": -1}, "seed"),
    ]:
        with pytest.raises(InvalidArgumentError) as caught:
            Chat(model, model.tokenizer, **options)
        assert caught.value.param == param


# ------------------------------------------------------------------ TokenGeneration: ids in, ids out


def test_token_generation_gives_transformers_ids_greedy_and_sampled(small_pair):
    hf, ours = small_pair
    prompt = [464, 3290, 318, 257]
    greedy = TokenGeneration(ours, [prompt], max_new_tokens=8, sampling=Sampling(0.0))
    rows = [[], []]
    for b, token in greedy:
        rows[b].append(token)
    assert rows[0] == transformers_greedy(hf, prompt, 8) and greedy.finish_reasons == ["length"]
    sampled = TokenGeneration(ours, [prompt], max_new_tokens=6, sampling=Sampling(0.9), seed=7, num_samples=2)
    rows = [[], []]
    for b, token in sampled:
        rows[b].append(token)
    assert rows == [transformers_sampled(hf, prompt, 6, seed=7 + i, temperature=0.9) for i in range(2)]
    assert sampled.tokens_generated == 12


def test_token_generation_ends_a_row_at_eos_and_refuses_bad_ids(small_pair):
    _, small = small_pair
    prompt = [464, 3290]
    first = next(iter(TokenGeneration(small, [prompt], max_new_tokens=1, sampling=Sampling(0.0))))[1]
    ended = TokenGeneration(small, [prompt], max_new_tokens=5, sampling=Sampling(0.0), eos_token_id=first)
    assert list(ended) == [(0, first)] and ended.finish_reasons == ["stop"]  # the end id given out too
    with pytest.raises(TokenIdError):
        TokenGeneration(small, [[1, 50257]], max_new_tokens=2)


# ------------------------------------------------------------------ steering


def steered_hf(hf, layer: int, vector: torch.Tensor):
    """A forward hook adding `vector` to the stream leaving transformers' block `layer`: its handle."""

    def add(module, args, out):
        return (out[0] + vector, *out[1:]) if isinstance(out, tuple) else out + vector

    return hf.transformer.h[layer].register_forward_hook(add)


def test_steered_generation_equals_transformers_with_the_vector_added(small_pair):
    hf, ours = small_pair
    prompt = [464, 3290, 318, 257]
    vector = torch.randn(48, generator=torch.Generator().manual_seed(3)) * 4
    handle = steered_hf(hf, 0, vector)
    try:
        expected = transformers_greedy(hf, prompt, 10)
        sampled = transformers_sampled(hf, prompt, 6, seed=5, temperature=0.8)
    finally:
        handle.remove()
    plain = transformers_greedy(hf, prompt, 10)
    assert expected != plain  # the vector steers: the test can fail
    tokens = [
        t for _, t in TokenGeneration(ours, [prompt], max_new_tokens=10, sampling=Sampling(0.0), steer={0: vector})
    ]
    assert tokens == expected
    rows = [
        t
        for _, t in TokenGeneration(ours, [prompt], max_new_tokens=6, sampling=Sampling(0.8), seed=5, steer={0: vector})
    ]
    assert rows == sampled
    text = generate_text(ours, ENC, ENC.decode(prompt), max_new_tokens=10, temperature=0.0, steer={0: vector})
    assert text == [ENC.decode(expected)]
    assert ours.steering == {}  # only while it generates
    assert [t for _, t in TokenGeneration(ours, [prompt], max_new_tokens=10, sampling=Sampling(0.0))] == plain


def test_steering_errors(small_pair):
    _, ours = small_pair
    cases = [
        ({2: torch.zeros(48)}, "block 2 is not one of the model's 0..1"),
        ({0: torch.zeros(47)}, r"must be a tensor of shape \[48\]"),
        ({0: torch.full((48,), float("nan"))}, "NaN"),
        ([torch.zeros(48)], "mapping"),
    ]
    for steer, match in cases:
        with pytest.raises(GPT2Error, match=match):
            TokenGeneration(ours, [[1, 2]], max_new_tokens=2, steer=steer)
    with pytest.raises(GPT2Error, match="NumPy engine"):
        numpy_engine = ReferenceModel(ours.config, {k: v.numpy() for k, v in hf_state_dict(ours).items()})
        TokenGeneration(numpy_engine, [[1, 2]], max_new_tokens=2, steer={0: torch.zeros(48)})
