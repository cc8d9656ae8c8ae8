"""The token loop: rows joining and leaving a running batch get the tokens they get alone."""

from __future__ import annotations

import pytest
import torch
from helpers import chi_square_p, exact_distribution, hf_and_ours, make_hf_model, perturbed, transformers_sampled

from gpt2 import Tokenizer
from gpt2.errors import GPT2Error
from gpt2.generation.caches import PrefixCache
from gpt2.generation.decoding import LENGTH, STOP, Decoder, Request, Row, row_seed, run, start_of_text
from gpt2.generation.engines import TorchEngine
from gpt2.generation.generate import TextGeneration, generate_text
from gpt2.generation.sampling import Sampling
from gpt2.model.model import GPT2

ENC = Tokenizer.gpt2()
GREEDY, SAMPLED = Sampling(temperature=0), Sampling(temperature=1.0, top_k=50)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """transformers' model (the reference) and ours, on the same random weights of GPT-2's vocabulary."""
    return hf_and_ours(
        tmp_path_factory.mktemp("decoding"), seed=3, vocab_size=50257, n_positions=48, n_embd=48, n_layer=2, n_head=3
    )


def prompt(i: int, length: int) -> list[int]:
    return torch.randint(0, 50257, (length,), generator=torch.Generator().manual_seed(i)).tolist()


def alone(model, row: Row) -> Row:
    """The same row served by itself, in an engine of one slot."""
    copy = Row(
        row.prompt, row.max_new_tokens, row.sampling, row.seed, row.eos_token_id, row.logprobs, row.echo_logprobs
    )
    run(TorchEngine(model, 1), [copy])
    return copy


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_rows_joining_and_leaving_a_running_batch_get_their_tokens_alone(models, sampling):
    """Rows of different lengths and budgets, fed in over time, 3 slots for 7 rows: rows end,
    later rows move into their slots, and each row's tokens equal those it gets alone."""
    _, model = models
    rows = [Row(prompt(i, 3 + 4 * i % 11), 4 + 5 * i % 17, sampling, seed=100 + i) for i in range(7)]
    decoder, pending, steps = Decoder(TorchEngine(model, 3)), list(rows), 0
    with torch.inference_mode():
        while pending or decoder.busy:
            if pending and steps % 3 == 0:  # a new row arrives every third step
                decoder.add(pending.pop(0))
            decoder.step()
            steps += 1
            assert len(decoder.active) <= 3
    for row in rows:
        assert row.tokens == alone(model, row).tokens and row.finish_reason == LENGTH
    assert len({tuple(row.tokens) for row in rows}) == 7


def test_a_row_ended_by_its_owner_leaves_and_frees_its_slot(models):
    _, model = models
    long, short, late = Row(prompt(1, 5), 30, GREEDY), Row(prompt(2, 7), 30, GREEDY), Row(prompt(3, 4), 10, GREEDY)
    gone = Row(prompt(4, 4), 10, GREEDY)
    decoder = Decoder(TorchEngine(model, 2))
    for row in (long, short, gone, late):
        decoder.add(row)
    with torch.inference_mode():
        decoder.step()
        gone.end(STOP)  # its client left while it waited: it never takes a slot
        for _ in range(3):
            decoder.step()
        short.end(STOP)  # e.g. a stop string in its text
        while decoder.busy:
            decoder.step()
    assert len(short.tokens) == 4 and gone.tokens == [] and short.finish_reason == gone.finish_reason == STOP
    assert long.tokens == alone(model, long).tokens and late.tokens == alone(model, late).tokens


def test_end_of_text_stops_a_row_and_max_new_tokens_ends_it(models):
    _, model = models
    free = alone(model, Row(prompt(5, 6), 12, GREEDY))
    eos = free.tokens[4]
    ended = Row(prompt(5, 6), 12, GREEDY, eos_token_id=eos)
    run(TorchEngine(model, 1), [ended])
    assert ended.tokens == free.tokens[: free.tokens.index(eos) + 1] and ended.finish_reason == STOP
    assert free.finish_reason == LENGTH and len(free.tokens) == 12


def test_one_seed_rule_row_i_samples_from_seed_plus_i(models):
    """The tensor API, the text API and the CLI agree: row i of a call seeded s is what a call
    seeded s + i gives alone, whatever else is in the batch."""
    hf, model = models
    idx = torch.tensor([prompt(6, 5), prompt(7, 5), prompt(6, 5)])
    batch = model.generate(idx, 12, seed=9, top_k=50)
    for b in range(3):
        assert torch.equal(batch[b], model.generate(idx[b : b + 1], 12, seed=9 + b, top_k=50)[0])
    assert not torch.equal(batch[0], batch[2])  # the same prompt, other seeds
    texts = generate_text(model, ENC, "Once upon a time", max_new_tokens=10, seed=2**64 - 1, num_samples=3)
    for i, text in enumerate(texts):  # row i: transformers' sampling from seed 2**64 - 1 + i, wrapping past 2**64 - 1
        assert text == ENC.decode(transformers_sampled(hf, ENC.encode("Once upon a time"), 10, (2**64 - 1 + i) % 2**64))
    assert row_seed(2**64 - 1, 1) == 0


def test_text_generation_says_why_each_row_ended(models):
    _, model = models
    free = generate_text(model, ENC, "Hello there", max_new_tokens=20, temperature=0)[0]
    stop = free[5:9]
    generation = TextGeneration(
        model, ENC, ["Hello there", "Hello there"], max_new_tokens=20, temperature=0, stop=[stop]
    )
    texts = ["", ""]
    for row, piece in generation:
        texts[row] += piece
    assert texts[0] == free[: free.index(stop)] and generation.finish_reasons == [STOP, STOP]
    generation = TextGeneration(model, ENC, "Hello there", max_new_tokens=20, temperature=0)
    assert "".join(piece for _, piece in generation) == free and generation.finish_reasons == [LENGTH]


def test_logprobs_of_prompt_and_new_tokens_equal_transformers(models):
    hf, model = models
    row = Row(prompt(8, 9), 6, SAMPLED, seed=1, logprobs=5, echo_logprobs=True)
    neighbour = Row(prompt(9, 3), 20, GREEDY, logprobs=2)
    run(TorchEngine(model, 2), [neighbour, row])
    ids = row.prompt + row.tokens
    with torch.no_grad():
        expected = torch.log_softmax(hf(torch.tensor([ids])).logits[0].double(), dim=-1)  # (T, V)
    assert row.prompt_logprobs[0] is None and len(row.prompt_logprobs) == len(row.prompt)
    got = [entry for entry in row.prompt_logprobs[1:]] + list(zip(row.token_logprobs, row.top_logprobs))
    for t, (chosen, top) in enumerate(got):
        assert abs(chosen - float(expected[t, ids[t + 1]])) < 1e-4
        top_ids = [i for i, _ in top]
        assert len(top) == 5 and top_ids == expected[t].topk(5).indices.tolist()
        assert max(abs(lp - float(expected[t, i])) for i, lp in top) < 1e-4
    assert len(neighbour.top_logprobs[0]) == 2


def test_a_row_of_no_new_tokens_is_scored_and_takes_no_slot(models):
    _, model = models
    scored, other = Row(prompt(10, 7), 0, GREEDY, echo_logprobs=True, logprobs=1), Row(prompt(11, 5), 5, GREEDY)
    decoder = Decoder(TorchEngine(model, 1))
    decoder.add(scored)
    decoder.add(other)
    with torch.inference_mode():
        events = decoder.step()
    assert (scored, None) in events and scored.finish_reason == LENGTH and scored.tokens == []
    assert len(scored.prompt_logprobs) == 7 and decoder.active == [other]


def test_rows_of_one_prompt_share_its_prefill(models, monkeypatch):
    _, model = models
    engine = TorchEngine(model, 4)
    calls = []
    extend = engine.extend
    monkeypatch.setattr(engine, "extend", lambda *a, **k: calls.append(a[0]) or extend(*a, **k))
    rows = [Row(prompt(12, 6), 8, SAMPLED, seed=row_seed(4, i)) for i in range(3)] + [Row(prompt(13, 6), 8, GREEDY)]
    run(engine, rows)
    assert calls == [[0, 3]]  # one call: the first row of each prompt
    for row in rows:
        assert row.tokens == alone(model, row).tokens


def test_context_slides_for_each_row_of_a_batch(tmp_path):
    hf = make_hf_model(vocab_size=97, n_positions=16, n_embd=24, n_layer=2, n_head=2)
    hf.save_pretrained(tmp_path)
    model = GPT2.from_pretrained(tmp_path, device="cpu")
    rows = [
        Row(torch.randint(0, 97, (n,), generator=torch.Generator().manual_seed(n)).tolist(), 20, GREEDY)
        for n in (3, 10, 15)
    ]
    run(TorchEngine(model, 3), rows)
    for row in rows:
        expected = torch.tensor([row.prompt])
        with torch.no_grad():
            for _ in range(20):  # nanoGPT's crop: the last n_ctx tokens
                expected = torch.cat([expected, hf(expected[:, -16:]).logits[:, -1].argmax(-1, keepdim=True)], 1)
        assert row.tokens == expected[0, len(row.prompt) :].tolist()


# ------------------------------------------------------------------ requests


def test_a_request_makes_its_rows_prompt_major_and_seeds_row_i_with_seed_plus_i():
    request = Request.build(
        [[1, 2], [3]], 5, n_vocab=50257, n_ctx=8, sampling=SAMPLED, seed=2**64 - 2, n=2, eos_token_id=9
    )
    rows = request.rows()
    assert [row.prompt for row in rows] == [[1, 2], [1, 2], [3], [3]] and (request.slots, request.longest) == (4, 2)
    assert [row.seed for row in rows] == [2**64 - 2, 2**64 - 1, 0, 1]
    assert all((row.max_new_tokens, row.sampling, row.eos_token_id) == (5, SAMPLED, 9) for row in rows)


@pytest.mark.parametrize(
    "prompts, options, param, message",
    [
        ([[1]], dict(max_new_tokens=0), "max_new_tokens", "max_new_tokens must be a positive integer, got 0"),
        (
            [[1]],
            dict(sampling=Sampling(top_k=11)),
            "top_k",
            "top_k must be an integer from 1 to 10, the model's vocabulary size, got 11",
        ),
        ([[1]], dict(seed=-1), "seed", "seed must be a whole number from 0"),
        ([[1]], dict(n=0), "n", "n must be a positive integer, got 0"),
        ([], {}, "prompt", "no prompts"),
        ([[1], []], {}, "prompt", "prompt 1 is empty"),
        ([[1], [10]], {}, "prompt", "token id 10 in prompt 1 is out of range: ids are 0..9"),
        ([[1]], dict(on_overflow="wrap"), "on_overflow", "on_overflow must be 'slide' or 'error'"),
        (
            [[1] * 5],
            dict(on_overflow="error"),
            "prompt",
            "the prompt \\(5 tokens\\) and 4 new tokens exceed the context of n_ctx=8",
        ),
    ],
)
def test_a_bad_request_is_refused_naming_its_param(prompts, options, param, message):
    """Every front door's checks, in one place: the server answers the param as OpenAI's `param`."""
    options = {"max_new_tokens": 4, **options}
    with pytest.raises(GPT2Error, match=message) as caught:
        Request.build(prompts, options.pop("max_new_tokens"), n_vocab=10, n_ctx=8, **options)
    assert caught.value.param == param


def test_no_new_tokens_only_where_allowed_and_an_empty_text_prompt_starts_at_end_of_text():
    assert Request.build([[1]], 0, n_vocab=10, n_ctx=8, allow_zero=True).rows()[0].max_new_tokens == 0
    assert start_of_text([], 9) == [9] and start_of_text([4], 9) == [4]
    with pytest.raises(GPT2Error, match="no <\\|endoftext\\|> to start from") as caught:
        start_of_text([], None)
    assert caught.value.param == "prompt"


# ------------------------------------------------------------------ prefilled together, in chunks


@pytest.mark.parametrize("budget", [None, 16, 40], ids=["one-pass", "chunks-of-16", "chunks-of-40"])
def test_eight_rows_prefilled_together_and_in_chunks_equal_transformers_and_the_rows_alone(models, budget):
    """8 rows of prompts from 3 to 41 tokens arrive at once: their prompts go in together (in
    chunks within a budget of tokens per step); each row's greedy tokens equal transformers'
    and the row's alone; its log-probabilities, the prompt's (echo) too, agree within 1e-4."""
    hf, model = models
    lengths = [3, 17, 30, 5, 41, 9, 25, 12]
    rows = [Row(prompt(40 + i, n), 6, GREEDY, logprobs=2, echo_logprobs=i % 2 == 0) for i, n in enumerate(lengths)]
    run_with(Decoder(TorchEngine(model, 8), budget), rows)
    with torch.inference_mode():
        for row in rows:
            idx = torch.tensor([row.prompt])
            expected = hf.generate(
                idx, max_new_tokens=6, do_sample=False, attention_mask=torch.ones_like(idx), pad_token_id=0
            )
            assert row.tokens == expected[0, len(row.prompt) :].tolist()
            single = alone(model, row)
            assert row.tokens == single.tokens
            assert max(abs(a - b) for a, b in zip(row.token_logprobs, single.token_logprobs)) < 1e-4
            if row.echo_logprobs:
                logp = torch.log_softmax(hf(idx).logits[0].float(), -1)  # (T, V)
                assert row.prompt_logprobs[0] is None and len(row.prompt_logprobs) == len(row.prompt)
                for t in range(1, len(row.prompt)):
                    value, top = row.prompt_logprobs[t]
                    assert abs(value - float(logp[t - 1, row.prompt[t]])) < 1e-4
                    assert [i for i, _ in top] == logp[t - 1].topk(2).indices.tolist()


def run_with(decoder: Decoder, rows: list[Row]) -> list[list[tuple[Row, int | None]]]:
    """Every row added at once, stepped to the end: the events of each step."""
    for row in rows:
        decoder.add(row)
    steps = []
    with torch.inference_mode():
        while decoder.busy:
            steps.append(decoder.step())
    return steps


def test_a_long_prompt_goes_in_over_several_steps_while_a_running_row_gets_a_token_each_step(models, monkeypatch):
    _, model = models
    engine = TorchEngine(model, 2)
    running, long = Row(prompt(50, 4), 20, GREEDY), Row(prompt(51, 40), 3, GREEDY)
    decoder = Decoder(engine, max_batched_tokens=11)
    decoder.add(running)
    chunks = []
    extend = engine.extend
    monkeypatch.setattr(
        engine,
        "extend",
        lambda slots, starts, pieces, every: (
            chunks.append(list(map(len, pieces))) or extend(slots, starts, pieces, every)
        ),
    )
    with torch.inference_mode():
        decoder.step()
        decoder.add(long)
        for _ in range(5):
            events = decoder.step()
            assert [row for row, _ in events][0] is running  # the stream keeps flowing
        while decoder.busy:
            decoder.step()
    assert chunks == [[4], [10], [10], [10], [10]]  # 11 tokens a step, one of them the running row's
    assert long.tokens == alone(model, long).tokens and running.tokens == alone(model, running).tokens


def test_a_row_that_leaves_while_its_prompt_goes_in_frees_its_slot_for_the_next(models):
    _, model = models
    first, gone, late = Row(prompt(60, 30), 4, GREEDY), Row(prompt(61, 30), 4, GREEDY), Row(prompt(62, 9), 5, GREEDY)
    decoder = Decoder(TorchEngine(model, 2), max_batched_tokens=8)
    for row in (first, gone, late):
        decoder.add(row)
    with torch.inference_mode():
        decoder.step()  # first takes slot 0 and 8 of its tokens; gone waits in slot 1
        gone.end(STOP)
        while decoder.busy:
            decoder.step()
    assert gone.tokens == [] and first.tokens == alone(model, first).tokens and late.tokens == alone(model, late).tokens


def test_max_batched_tokens_must_be_a_positive_whole_number(models):
    with pytest.raises(GPT2Error, match="max_batched_tokens"):
        Decoder(TorchEngine(models[1], 1), max_batched_tokens=0)


def test_rows_reusing_a_kept_prefix_score_and_continue_as_rows_computed_whole(models):
    """A context scored with four endings, as HellaSwag's: the later rows copy its kept blocks;
    their prompts' log-probabilities equal those computed whole within 1e-5, their tokens too."""
    _, model = models
    context = prompt(70, 37)
    endings = [prompt(71 + i, 3 + i) for i in range(4)]

    def rows():
        return [Row(context + e, 4, GREEDY, logprobs=1, echo_logprobs=True) for e in endings]

    cache = PrefixCache(model.config, 1 << 20, block_size=16)
    cached, whole = rows(), rows()
    run(TorchEngine(model, 2, prefix_cache=cache), cached)
    run(TorchEngine(model, 2), whole)
    assert cache.hits == 3 * 32  # the first row computes the context; each later one copies its 2 whole blocks
    for a, b in zip(cached, whole):
        assert a.tokens == b.tokens
        assert max(abs(x[0] - y[0]) for x, y in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:])) < 1e-5
        assert [x[1][0][0] for x in a.prompt_logprobs[1:]] == [y[1][0][0] for y in b.prompt_logprobs[1:]]


# ------------------------------------------------------------------ speculative decoding


@pytest.fixture(scope="module")
def draft(models, tmp_path_factory):
    """A draft of the model's vocabulary that agrees with it often, not always."""
    directory = tmp_path_factory.mktemp("draft")
    perturbed(models[0], 0.5).save_pretrained(directory)
    return GPT2.from_pretrained(directory, device="cpu")


@pytest.fixture(scope="module")
def greedy_alone(models) -> list[Row]:
    """6 greedy rows of prompts of 3 to 28 tokens and budgets of 5 to 30 (one ends at eos, the
    longest slides past the context of 48), each served alone, without a draft."""
    _, model = models
    rows = [Row(prompt(70 + i, 3 + 5 * i), 5 + 5 * i, GREEDY, logprobs=2) for i in range(6)]
    rows[3] = Row(rows[3].prompt, 20, GREEDY, eos_token_id=alone(model, rows[3]).tokens[9], logprobs=2)
    return [alone(model, row) for row in rows]


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_with_a_draft_is_the_model_alone_token_for_token(models, draft, greedy_alone, k):
    """The rows of `greedy_alone` go through 3 slots (they join and leave) with a draft
    proposing k tokens a step: each row's tokens and log-probabilities are those it gets alone;
    some drafts were kept, some refused, and rows got several tokens in a step."""
    _, model = models
    rows = [Row(r.prompt, r.max_new_tokens, GREEDY, eos_token_id=r.eos_token_id, logprobs=2) for r in greedy_alone]
    decoder = Decoder(TorchEngine(model, 3), draft=TorchEngine(draft, 3), draft_tokens=k)
    steps = run_with(decoder, rows)
    for row, single in zip(rows, greedy_alone):
        assert (row.tokens, row.finish_reason) == (single.tokens, single.finish_reason)
        assert max(abs(a - b) for a, b in zip(row.token_logprobs, single.token_logprobs)) < 1e-4
        assert [t for t, _ in row.top_logprobs[0]] == [t for t, _ in single.top_logprobs[0]]
    assert rows[3].finish_reason == STOP and len(rows[3].tokens) <= 10 and rows[5].finish_reason == LENGTH
    stats = decoder.stats
    assert 0 < stats.accepted < stats.proposed and stats.tokens > stats.passes
    assert any(
        len(events) > len({id(row) for row, _ in events}) for events in steps
    )  # a row got several tokens in a step


def test_greedy_with_a_draft_equals_transformers(models, draft):
    hf, model = models
    idx = torch.tensor([prompt(80 + b, 7) for b in range(3)])
    out = model.generate(idx, 20, temperature=0, draft=draft, draft_tokens=3)
    with torch.inference_mode():
        expected = hf.generate(
            idx, max_new_tokens=20, do_sample=False, attention_mask=torch.ones_like(idx), pad_token_id=0
        )
    assert torch.equal(out, expected)


def test_a_draft_with_a_shorter_context_drafts_only_where_it_holds_the_row(tmp_path):
    """The draft holds 8 positions, the model 16: a prompt longer than 8 is decoded without it,
    a shorter one with it until the draft is full; then the model slides on alone, as nanoGPT crops."""
    hf = make_hf_model(vocab_size=97, n_positions=16, n_embd=24, n_layer=2, n_head=2)
    hf.save_pretrained(tmp_path / "model")
    small = make_hf_model(vocab_size=97, n_positions=8, n_embd=24, n_layer=2, n_head=2)
    with torch.no_grad():  # the model's weights, its positions cut to 8: it agrees with it while it holds a row
        for (_, p), (_, q) in zip(small.named_parameters(), hf.named_parameters()):
            p.copy_(q[: p.size(0)])
    small.save_pretrained(tmp_path / "draft")
    model, draft = (GPT2.from_pretrained(tmp_path / name, device="cpu") for name in ("model", "draft"))
    rows = [
        Row(torch.randint(0, 97, (n,), generator=torch.Generator().manual_seed(n)).tolist(), 20, GREEDY)
        for n in (3, 10)
    ]
    decoder = run(TorchEngine(model, 2), rows, TorchEngine(draft, 2), draft_tokens=2)
    for row in rows:
        expected = torch.tensor([row.prompt])
        with torch.no_grad():
            for _ in range(20):
                expected = torch.cat([expected, hf(expected[:, -16:]).logits[:, -1].argmax(-1, keepdim=True)], 1)
        assert row.tokens == expected[0, len(row.prompt) :].tolist()
    assert decoder.stats.proposed == decoder.stats.accepted > 0  # the short row's drafts, all the model's own


# ------------------------------------------------------------------ sampling with a draft: the model's distribution


V, PROMPT, N_RUNS = 8, [3, 1, 4], 6000


@pytest.fixture(scope="module")
def peaked_pair(tmp_path_factory):
    """transformers' models of 8 tokens, with weights large enough that their distributions are
    peaked and differ; and ours, loaded from them: the model and its draft."""
    config = dict(vocab_size=V, n_positions=16, n_embd=16, n_layer=1, n_head=2, initializer_range=0.5)
    pair = []
    for seed in (1, 2):
        hf = make_hf_model(seed=seed, **config)
        directory = tmp_path_factory.mktemp(f"small{seed}")
        hf.save_pretrained(directory)
        pair.append((hf, GPT2.from_pretrained(directory, device="cpu")))
    return pair


@pytest.mark.parametrize(
    "sampling",
    [Sampling(temperature=1.0), Sampling(temperature=0.7, top_k=5, top_p=0.9)],
    ids=["temperature-1", "top-k-top-p"],
)
def test_sampling_with_a_draft_follows_the_models_distribution_exactly(peaked_pair, sampling):
    """6000 rows of one prompt, seeded 0..5999, sample 4 tokens with a draft proposing 3 a step
    (kept or refused by speculative sampling's rule). The 8**4 continuations' frequencies pass a
    chi-square test against the model's exact distribution (p > 0.001), and fail it against the
    draft's own (p < 0.001): the test tells the two apart."""
    (hf, model), (hf_draft, draft) = peaked_pair
    idx = torch.tensor([PROMPT] * N_RUNS)
    tokens = model.generate(
        idx, 4, sampling.temperature, sampling.top_k, sampling.top_p, seed=0, draft=draft, draft_tokens=3
    )[:, len(PROMPT) :].numpy()
    assert chi_square_p(tokens, exact_distribution(hf, PROMPT, 4, sampling)) > 1e-3
    assert chi_square_p(tokens, exact_distribution(hf_draft, PROMPT, 4, sampling)) < 1e-3


def test_drafts_stay_within_the_steps_token_budget(models, draft, monkeypatch):
    """max_batched_tokens 6 for 3 rows: each pass of the model verifies 6 tokens at most (a
    row's newest and its drafts, the earlier rows' drafts first), not 3 x (1 + 4)."""
    _, model = models
    engine = TorchEngine(model, 3)
    passes = []
    extend = engine.extend
    monkeypatch.setattr(
        engine,
        "extend",
        lambda slots, starts, chunks, every=None: (
            passes.append(sum(map(len, chunks))) or extend(slots, starts, chunks, every)
        ),
    )
    rows = [Row(prompt(90 + i, 2), 20, GREEDY) for i in range(3)]  # all in at the first step
    decoder = Decoder(engine, max_batched_tokens=6, draft=TorchEngine(draft, 3), draft_tokens=4)
    run_with(decoder, rows)
    assert max(passes) == 6 and decoder.stats.proposed > 0
    for row in rows:
        assert row.tokens == alone(model, row).tokens


def test_a_draft_takes_the_whole_prompt_where_the_model_reuses_kept_blocks(models, draft):
    """The model's slot starts from a kept prefix; the draft, which keeps none, gets the whole
    prompt: greedy rows with both equal the model alone."""
    _, model = models
    context = prompt(90, 35)
    rows = [Row(context + prompt(91 + i, 4), 8, GREEDY) for i in range(3)]
    cache = PrefixCache(model.config, 1 << 20, block_size=16)
    decoder = Decoder(
        TorchEngine(model, 2, prefix_cache=cache), max_batched_tokens=24, draft=TorchEngine(draft, 2), draft_tokens=3
    )
    for row in rows:
        decoder.add(row)
    with torch.inference_mode():
        while decoder.busy:
            decoder.step()
    assert cache.hits == 2 * 32 and decoder.stats.proposed > 0
    for row in rows:
        assert row.tokens == alone(model, row).tokens
