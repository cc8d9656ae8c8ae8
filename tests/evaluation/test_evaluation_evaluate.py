"""gpt2.evaluation.evaluate against independent references: Hugging Face's perplexity recipe run with
transformers' GPT2LMHeadModel on the same random weights, and LAMBADA and HellaSwag scored
directly with transformers and tiktoken, as lm-evaluation-harness and llm.c score them."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from helpers import corpus, make_hf_model, ours_from_hf

from gpt2.data.text import prepare
from gpt2.errors import GPT2Error
from gpt2.evaluation.evaluate import (
    Window,
    evaluate_data,
    evaluate_file,
    evaluate_text,
    hellaswag,
    lambada,
    perplexity,
    run_task,
    score_continuations,
    sliding_windows,
)
from gpt2.evaluation.tasks import Completion, read_hellaswag, read_lambada
from gpt2.examples import model_directory
from gpt2.generation.engines import TorchEngine
from gpt2.model.model import GPT2
from gpt2.tokenizer import CharTokenizer

THE = 262  # " the" in GPT-2's vocabulary


@pytest.fixture(scope="module")
def hf_and_ours(tmp_path_factory):
    """A random GPT-2 of GPT-2's vocabulary (context 64) in transformers and in ours, same weights."""
    hf = make_hf_model(vocab_size=50257, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    return hf, ours_from_hf(hf, tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def leaning(tmp_path_factory):
    """The same kind of model, leaning towards " the" (ln_f's bias along wte[" the"]), so that
    its greedy prediction is " the" and benchmark accuracies are neither 0 nor 1."""
    hf = make_hf_model(seed=3, vocab_size=50257, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    with torch.no_grad():
        wte = hf.transformer.wte.weight
        wte[THE] *= 3
        hf.transformer.ln_f.bias.add_(2 * wte[THE] / wte[THE].norm() * math.sqrt(32))
    return hf, ours_from_hf(hf, tmp_path_factory.mktemp("leaning"))


def guide_perplexity(hf, ids: list[int], max_length: int, stride: int) -> tuple[float, int]:
    """Hugging Face's "Perplexity of fixed-length models" loop, each window's scored ids counted
    exactly and their log-probabilities summed in float64: (mean loss, ids scored)."""
    ids_t, seq_len = torch.tensor([ids]), len(ids)
    nll, count, prev_end_loc = 0.0, 0, 0
    for begin_loc in range(0, seq_len, stride):
        end_loc = min(begin_loc + max_length, seq_len)
        trg_len = end_loc - prev_end_loc
        input_ids = ids_t[:, begin_loc:end_loc]
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        with torch.no_grad():
            log_probs = torch.log_softmax(hf(input_ids).logits[0, :-1].double(), dim=-1)
        labels = target_ids[0, 1:]
        scored = labels != -100
        nll -= float(log_probs[scored].gather(1, labels[scored][:, None]).sum())
        count += int(scored.sum())
        prev_end_loc = end_loc
        if end_loc == seq_len:
            break
    return nll / count, count


# ------------------------------------------------------------------ windows


def test_windows_written_out():
    assert sliding_windows(10, 4, 2) == [Window(0, 4, 1), Window(2, 6, 4), Window(4, 8, 6), Window(6, 10, 8)]
    # stride = context: each window's first id has no context and is not scored
    assert sliding_windows(10, 4, 4) == [Window(0, 4, 1), Window(4, 8, 5), Window(8, 10, 9)]
    # a stride that does not divide: the last window ends at the last id
    assert sliding_windows(11, 4, 3) == [Window(0, 4, 1), Window(3, 7, 4), Window(6, 10, 7), Window(9, 11, 10)]
    assert sliding_windows(3, 8, 4) == [Window(0, 3, 1)]  # shorter than a window
    assert sliding_windows(9, 4, 4) == [Window(0, 4, 1), Window(4, 8, 5)]  # a last window of one id scores nothing


@pytest.mark.parametrize("n, context, stride", [(100, 16, 8), (101, 16, 5), (57, 10, 1), (64, 64, 32), (33, 7, 6)])
def test_each_id_after_the_first_is_scored_once_with_enough_context(n, context, stride):
    windows = sliding_windows(n, context, stride)
    scored = [i for w in windows for i in range(w.score_from, w.end)]
    assert scored == list(range(1, n))
    for w in windows[1:]:
        assert w.end - w.begin <= context and w.score_from - w.begin >= context - stride


# ------------------------------------------------------------------ perplexity against transformers


@pytest.mark.parametrize("context, stride", [(64, 32), (64, 64), (50, 17), (64, 1), (10, 3), (2, 1), (64, 50)])
def test_perplexity_equals_hugging_faces_recipe(hf_and_ours, context, stride):
    hf, ours = hf_and_ours
    ids = torch.randint(0, 50257, (301,), generator=torch.Generator().manual_seed(context * 100 + stride)).tolist()
    expected, count = guide_perplexity(hf, ids, context, stride)
    got = perplexity(ours, ids, context=context, stride=stride, batch_size=4)
    assert got.tokens == count
    assert abs(got.loss - expected) < 1e-6
    assert abs(got.perplexity - math.exp(expected)) < 1e-5 * math.exp(expected)


def test_batched_windows_equal_unbatched(hf_and_ours):
    _, ours = hf_and_ours
    ids = torch.randint(0, 50257, (500,), generator=torch.Generator().manual_seed(1)).tolist()
    one, *more = [perplexity(ours, ids, context=48, stride=20, batch_size=b) for b in (1, 3, 8, 64)]
    for result in more:
        assert result.tokens == one.tokens and abs(result.loss - one.loss) < 1e-7


def test_defaults_are_the_models_context_and_half_of_it(hf_and_ours):
    hf, ours = hf_and_ours
    ids = torch.randint(0, 50257, (200,), generator=torch.Generator().manual_seed(2)).tolist()
    assert perplexity(ours, ids).loss == perplexity(ours, ids, context=64, stride=32).loss
    assert abs(perplexity(ours, ids).loss - guide_perplexity(hf, ids, 64, 32)[0]) < 1e-6


def test_text_bits_per_byte_counts_the_bytes_of_the_scored_ids(hf_and_ours, tiktoken_gpt2):
    hf, ours = hf_and_ours
    text = (
        "Perplexity, in bits per byte: naïve café 東京 🙂 — the same for any tokenizer.<|endoftext|>\n" * 3
    )  # characters
    ids = tiktoken_gpt2.encode_ordinary(text)
    expected, count = guide_perplexity(hf, ids, 64, 32)
    scored_bytes = len(text.encode("utf-8")) - len(tiktoken_gpt2.decode_single_token_bytes(ids[0]))
    got = evaluate_text(ours, text)
    assert got.tokens == count == len(ids) - 1
    assert abs(got.loss - expected) < 1e-6
    assert abs(got.bits_per_byte - expected * count / math.log(2) / scored_bytes) < 1e-6


def test_a_file_and_its_json(hf_and_ours, tmp_path):
    _, ours = hf_and_ours
    path = tmp_path / "text.txt"
    path.write_text("To be, or not to be, that is the question.\n", encoding="utf-8")
    result = evaluate_file(ours, path, context=8, stride=4).to_dict()
    assert list(result) == ["tokens", "loss", "perplexity", "bits_per_byte"]
    assert json.loads(json.dumps(result)) == result and result["perplexity"] == math.exp(result["loss"])


def test_prepared_data_is_its_val_bin_as_one_stream(hf_and_ours, tmp_path, corpus_text):
    hf, ours = hf_and_ours
    (tmp_path / "a.txt").write_text(corpus_text[:3000], encoding="utf-8")
    (tmp_path / "b.txt").write_text(corpus_text[3000:4500], encoding="utf-8")
    prepare([tmp_path / "a.txt", tmp_path / "b.txt"], tmp_path / "data", "gpt2", 0.5, progress=False)
    val = np.fromfile(tmp_path / "data" / "val.bin", dtype="<u2").tolist()
    expected, count = guide_perplexity(hf, val, 64, 32)
    got = evaluate_data(ours, tmp_path / "data")
    assert got.tokens == count and abs(got.loss - expected) < 1e-6


def test_a_character_model_counts_the_bytes_of_its_characters(tmp_path):
    chars = CharTokenizer(list(" abcdeé東"))
    hf = make_hf_model(vocab_size=chars.n_vocab, n_positions=32, n_embd=16, n_layer=1, n_head=2)
    hf.save_pretrained(tmp_path)
    chars.save(tmp_path)
    model = GPT2.from_pretrained(tmp_path, device="cpu")
    text = "abc é東 dead bead é"
    ids = chars.encode(text)
    expected, count = guide_perplexity(hf, ids, 32, 16)
    got = evaluate_text(model, text)
    assert abs(got.bits_per_byte - expected * count / math.log(2) / len(text[1:].encode("utf-8"))) < 1e-6


# ------------------------------------------------------------------ continuations: LAMBADA, HellaSwag


def continuation_score(hf, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """The continuation's summed log-probability after the context, and whether every one of
    its ids is the argmax, straight from transformers' logits."""
    ids = torch.tensor([(context + continuation)[:-1]])  # the last id is only predicted
    with torch.no_grad():
        log_probs = torch.log_softmax(hf(ids).logits[0].double(), dim=-1)
    rows = log_probs[len(context) - 1 :]  # the positions that predict the continuation
    target = torch.tensor(continuation)
    return float(rows.gather(1, target[:, None]).sum()), bool((rows.argmax(-1) == target).all())


LAMBADA_TEXTS = [
    "He looked at the door and said it was the",
    "She would not let anyone see the letter she had kept for years in the drawer",
    "In the morning they went down to the river to see the",
    "Nothing could have prepared him for what he found behind the wall",
    "The old man smiled, took off his hat and bowed to the",
    "They waited for hours, but the train never came",
]


def test_lambada_equals_transformers_scored_as_the_harness_does(leaning, tmp_path, tiktoken_gpt2):
    hf, ours = leaning
    path = tmp_path / "lambada_test.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in LAMBADA_TEXTS), encoding="utf-8")
    examples = read_lambada(path)
    assert examples[0] == Completion("He looked at the door and said it was", " the")
    log_probs, right = [], 0
    for text in LAMBADA_TEXTS:  # lm-evaluation-harness: the whole text's ids after the context's own
        context = text.rsplit(" ", 1)[0]
        head = tiktoken_gpt2.encode_ordinary(context)
        log_prob, greedy = continuation_score(hf, head, tiktoken_gpt2.encode_ordinary(text)[len(head) :])
        log_probs.append(log_prob)
        right += greedy
    expected_acc, expected_ppl = right / len(LAMBADA_TEXTS), math.exp(-sum(log_probs) / len(log_probs))
    assert 0 < expected_acc < 1  # the test can tell right from wrong
    got = lambada(ours, examples, batch_size=4)
    assert got["task"] == "lambada" and got["examples"] == len(LAMBADA_TEXTS)
    assert got["acc"] == expected_acc
    assert abs(got["perplexity"] - expected_ppl) < 1e-5 * expected_ppl


HELLASWAG = [
    {
        "ctx": "A man is sitting on a roof. He",
        "endings": ["is using the the ladder.", "starts the the the roof.", "eats a sandwich.", "the"],
        "label": 1,
    },
    {
        "ctx": "Two women in a kitchen",
        "endings": ["cook the dinner.", "dance on the table of the house.", "the the", "sing."],
        "label": 2,
    },
    {
        "ctx": "The dog runs",
        "endings": ["after the ball in the park.", "away.", "to the the the door.", "home the end."],
        "label": 2,
    },
    {
        "ctx": "A child holds a kite.",
        "endings": ["It flies high over the trees.", "The the wind.", "She lets go.", "the kite is red."],
        "label": 3,
    },
    {
        "ctx": "People are gathered",
        "endings": ["around the fire.", "in a hall.", "to watch the the game.", "the the the the"],
        "label": 3,
    },
]


def test_hellaswag_equals_transformers_scored_as_llm_c_does(leaning, tmp_path, tiktoken_gpt2):
    hf, ours = leaning
    path = tmp_path / "hellaswag_val.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in HELLASWAG), encoding="utf-8")
    right = right_norm = 0
    for example in HELLASWAG:  # llm.c: context ids + ids of " " + ending; least total and least mean loss
        context = tiktoken_gpt2.encode_ordinary(example["ctx"])
        endings = [tiktoken_gpt2.encode_ordinary(" " + e) for e in example["endings"]]
        losses = [-continuation_score(hf, context, e)[0] for e in endings]
        right += int(np.argmin(losses)) == example["label"]
        right_norm += int(np.argmin([loss / len(e) for loss, e in zip(losses, endings)])) == example["label"]
    got = hellaswag(ours, read_hellaswag(path), batch_size=3)
    assert got == {"task": "hellaswag", "examples": 5, "acc": right / 5, "acc_norm": right_norm / 5}
    assert right != right_norm  # the two measures differ here, so each is checked


def test_hellaswags_progress_bar_counts_examples_not_endings(leaning, tmp_path, capsys):
    path = tmp_path / "hellaswag_val.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in HELLASWAG), encoding="utf-8")
    hellaswag(leaning[1], read_hellaswag(path), batch_size=3, progress=True)
    bar = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert bar.startswith("hellaswag: 100%") and " 5/5 " in bar and "example" in bar  # 5 examples of 4 endings each


def test_scores_are_the_same_in_any_batch_and_order(hf_and_ours):
    hf, ours = hf_and_ours
    g = torch.Generator().manual_seed(4)
    pairs = [
        (
            torch.randint(0, 50257, (int(a),), generator=g).tolist(),
            torch.randint(0, 50257, (int(b),), generator=g).tolist(),
        )
        for a, b in torch.randint(1, 30, (9, 2), generator=g)
    ]
    one = score_continuations(ours, pairs, batch_size=1)
    for got, (context, continuation) in zip(score_continuations(ours, pairs, batch_size=4), pairs):
        expected, greedy = continuation_score(hf, context, continuation)
        assert abs(got.log_prob - expected) < 1e-4 and got.greedy == greedy and got.n_ids == len(continuation)
    assert all(abs(a.log_prob - b.log_prob) < 1e-5 for a, b in zip(one, score_continuations(ours, pairs, batch_size=4)))


def test_continuations_of_one_context_reuse_its_blocks_and_score_as_computed_whole(hf_and_ours, monkeypatch):
    """Three contexts of 20 to 40 ids, four endings each (HellaSwag's shape): with the prefix
    cache, each context's whole blocks are computed once, and every score equals the padded
    computation's within 1e-5 and transformers' within 1e-4."""
    hf, ours = hf_and_ours
    g = torch.Generator().manual_seed(8)
    pairs = [
        (context, torch.randint(0, 50257, (3 + k,), generator=g).tolist())
        for context in (torch.randint(0, 50257, (n,), generator=g).tolist() for n in (20, 33, 40))
        for k in range(4)
    ]
    computed = []
    hidden = TorchEngine.hidden
    monkeypatch.setattr(
        TorchEngine,
        "hidden",
        lambda self, slots, starts, chunks: (
            computed.append(sum(map(len, chunks))) or hidden(self, slots, starts, chunks)
        ),
    )
    cached = score_continuations(ours, pairs, batch_size=3)
    whole = score_continuations(ours, pairs, batch_size=3, prefix_cache_mb=0)
    inputs = sum(len(c) + len(x) - 1 for c, x in pairs)
    assert sum(computed) == inputs - 3 * (16 + 32 + 32)  # each context's whole blocks once, not four times
    for got, want, (context, continuation) in zip(cached, whole, pairs):
        assert abs(got.log_prob - want.log_prob) < 1e-5 and got.greedy == want.greedy and got.n_ids == want.n_ids
        assert abs(got.log_prob - continuation_score(hf, context, continuation)[0]) < 1e-4
    with pytest.raises(GPT2Error, match="prefix_cache_mb"):
        score_continuations(ours, pairs, prefix_cache_mb=-1)


def test_a_pair_longer_than_the_context_keeps_its_last_ids(hf_and_ours):
    hf, ours = hf_and_ours
    ids = torch.randint(0, 50257, (90,), generator=torch.Generator().manual_seed(6)).tolist()
    got = score_continuations(ours, [(ids[:80], ids[80:])])[0]
    expected, _ = continuation_score(hf, ids[90 - 65 : 80], ids[80:])  # 65 ids: 64 in, the last 10 scored
    assert abs(got.log_prob - expected) < 1e-4


def test_run_task_reads_the_given_file_and_limits_it(leaning, tmp_path):
    _, ours = leaning
    path = tmp_path / "l.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in LAMBADA_TEXTS), encoding="utf-8")
    assert run_task(ours, "lambada", path, limit=2) == lambada(ours, read_lambada(path)[:2])
    wiki = tmp_path / "wiki.test.raw"
    wiki.write_text(" = Title = \n\n Some text about the thing .\n", encoding="utf-8")
    got = run_task(ours, "wikitext2", wiki, context=16, stride=8)
    assert got == {
        "task": "wikitext2",
        **evaluate_text(ours, " = Title = \n\n\n\n\n Some text about the thing .\n", context=16, stride=8).to_dict(),
    }


# ------------------------------------------------------------------ wrong input


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(context=65), "context must be a number of ids up to the model's n_ctx=64, i.e. from 2 to 64, got 65"),
        (dict(context=1), "context must be a number of ids up to the model's n_ctx=64, i.e. from 2 to 64, got 1"),
        (dict(stride=0), "stride must be a number of ids up to the context (64), i.e. from 1 to 64, got 0"),
        (
            dict(context=16, stride=17),
            "stride must be a number of ids up to the context (16), i.e. from 1 to 16, got 17",
        ),
        (dict(batch_size=0), "batch_size must be a positive integer, got 0"),
    ],
)
def test_bad_windows_are_named(hf_and_ours, options, message):
    """In the library's words, naming the parameter (`gpt2 eval` adds its flag: tests/cli/test_cli_eval.py)."""
    _, ours = hf_and_ours
    with pytest.raises(GPT2Error) as error:
        perplexity(ours, [1, 2, 3], **options)
    assert str(error.value) == message and error.value.param == message.split()[0]


def test_bad_streams_and_files_are_named(hf_and_ours, tmp_path):
    _, ours = hf_and_ours
    with pytest.raises(GPT2Error, match="at least 2 ids"):
        perplexity(ours, [5])
    with pytest.raises(GPT2Error, match="token id 50257 is out of range"):
        perplexity(ours, [5, 50257])
    for content, message in (
        (b"", "is empty"),
        (b"ok \xff", "is not UTF-8 text: byte 0xff at offset 3"),
        (b"a", "f.txt is 1 id long: perplexity needs at least 2"),
    ):
        (tmp_path / "f.txt").write_bytes(content)
        with pytest.raises(GPT2Error, match=message):
            evaluate_file(ours, tmp_path / "f.txt")
    with pytest.raises(GPT2Error, match="does not exist"):
        evaluate_file(ours, tmp_path / "missing.txt")
    with pytest.raises(GPT2Error, match="unknown task 'mmlu': use one of lambada, hellaswag, wikitext2"):
        run_task(ours, "mmlu")
    with pytest.raises(GPT2Error, match=r"^limit must be a positive integer, got 0"):
        run_task(ours, "lambada", tmp_path / "f.txt", limit=0)
    with pytest.raises(GPT2Error, match="context and stride"):
        run_task(ours, "hellaswag", tmp_path / "f.txt", context=8)


def test_data_of_another_tokenizer_is_refused(hf_and_ours, tmp_path):
    _, ours = hf_and_ours
    (tmp_path / "a.txt").write_text("some text to prepare, some text to prepare\n" * 50, encoding="utf-8")
    prepare([tmp_path / "a.txt"], tmp_path / "chars", "char", 0.5, progress=False)
    with pytest.raises(GPT2Error, match="prepared with another tokenizer"):
        evaluate_data(ours, tmp_path / "chars")


# ------------------------------------------------------------------ narrow weights against float32


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The model gpt2 ships (shakespeare_char, trained: peaked distributions, which random weights,
    flat ones, would not give, so that quantisation errors show) and its validation data: the
    whole corpus prepared as it was (so its characters' ids), the last 1% held out (11,154 ids)."""
    root = tmp_path_factory.mktemp("shakespeare")
    (root / "input.txt").write_text(corpus()[1], encoding="utf-8")
    prepare([root / "input.txt"], root / "data", "char", val_fraction=0.01, progress=False)
    return model_directory("shakespeare_char"), root / "data"


@pytest.fixture(scope="module")
def float32(trained):
    """The model in float32, its validation ids and perplexity: what each narrower copy is held to."""
    from gpt2.data.files import open_data
    from gpt2.evaluation.evaluate import evaluate_data

    directory, data = trained
    reference = GPT2.from_pretrained(directory, device="cpu")
    return reference, open_data(data).val, evaluate_data(reference, data).perplexity


def test_a_model_agrees_with_itself_exactly(float32):
    from gpt2.evaluation.evaluate import agreement

    reference, ids, _ = float32
    result = agreement(reference, reference, ids)
    assert result.tokens == len(ids) and result.kl == 0.0 and result.top1 == 1.0


@pytest.mark.parametrize(
    "dtype, max_kl, min_top1, max_ppl_change",
    [
        ("bfloat16", 1e-3, 0.98, 0.005),
        ("float16", 1e-3, 0.98, 0.005),
        ("int8", 5e-3, 0.95, 0.02),
    ],
)
def test_narrow_weights_agree_with_float32(trained, float32, dtype, max_kl, min_top1, max_ppl_change):
    """Issue 12's bounds: KL per token, top-1 agreement and perplexity against float32."""
    from gpt2.evaluation.evaluate import agreement, evaluate_data

    directory, data = trained
    reference, ids, base = float32
    model = GPT2.from_pretrained(directory, device="cpu", dtype=dtype)
    result = agreement(reference, model, ids)
    assert result.tokens == len(ids) and 0 <= result.kl < max_kl and result.top1 >= min_top1
    ppl = evaluate_data(model, data).perplexity
    assert abs(ppl / base - 1) < max_ppl_change
    assert base < 20  # it learned something: its 65 characters unlearned are a perplexity of 65
