"""gpt2.inspect.walkthrough: the seeds' walk as data (`walk`) equals transformers' own modules
step by step, its BPE merges replay against vocab.bpe to tiktoken's tokens, and the position
table is the model's; the text walk (`walkthrough`) is tested in test_inspect_tracing.py."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import REPO, VOCAB, assert_walk_equals_transformers, gpt2_byte_letters, hf_and_ours, tiktoken_from_files

from gpt2 import GPT2, GPT2Config, Tokenizer
from gpt2.errors import InvalidArgumentError
from gpt2.examples import model_directory
from gpt2.inspect import walk

TEXT = "Mississippi lollipops: 1234567 naïve 日本語!!!!   the the"


@pytest.fixture(scope="module")
def hf_ours(tmp_path_factory):
    hf, ours = hf_and_ours(
        tmp_path_factory.mktemp("walk"), seed=3, vocab_size=50257, n_positions=64, n_embd=48, n_layer=2, n_head=3
    )
    hf.config._attn_implementation = "eager"  # its attention weights, for the patterns
    return hf, ours


def test_every_step_of_the_walk_equals_transformers_modules(hf_ours):
    hf, ours = hf_ours
    answer = json.loads(json.dumps(walk(ours, TEXT, top_k=7)))  # as the CLI prints it
    assert answer["ids"] == tiktoken_from_files(VOCAB / "encoder.json", VOCAB / "vocab.bpe").encode_ordinary(TEXT)
    assert answer["tokens"] == [Tokenizer.gpt2().decode([i]) for i in answer["ids"]]
    assert_walk_equals_transformers(answer, hf)
    pattern = next(s for s in answer["steps"] if s["name"] == "h.1.attn.pattern")
    T = len(answer["ids"])
    assert (
        pattern["shape"] == [3, T, T]
        and len(pattern["values"]) == 3
        and all(len(row) == T for row in pattern["values"])
    )
    logits = next(s for s in answer["steps"] if s["name"] == "logits")
    assert logits["shape"] == [T, 50257] and len(logits["values"]) == 50257
    assert answer["model"] == {
        "n_layer": 2, "n_head": 3, "n_embd": 48, "n_ctx": 64, "n_vocab": 50257, "activation": "gelu_tanh",
        "positions": "learned",
    }  # fmt: skip
    assert answer["tokenizer"] == "bpe"


def replay(word: str, merges: list[list[str]], ranks: dict[tuple[str, str], int]) -> None:
    """Each step of `merges` checked against vocab.bpe: the first is the word's bytes in GPT-2's
    letters; each next merges one adjacent pair, the lowest-ranked one present (the leftmost on a
    tie); the last has no pair left to merge."""
    letters = gpt2_byte_letters()
    assert merges[0] == [letters[b] for b in word.encode("utf-8")]
    for before, after in zip(merges, merges[1:]):
        pairs = [(ranks[p], i) for i, p in enumerate(zip(before, before[1:])) if p in ranks]
        rank, i = min(pairs)
        assert after == before[:i] + [before[i] + before[i + 1]] + before[i + 2 :]
    last = merges[-1]
    assert not [p for p in zip(last, last[1:]) if p in ranks]


def test_the_bpe_merges_replay_against_vocab_bpe_to_tiktokens_tokens():
    lines = (VOCAB / "vocab.bpe").read_text(encoding="utf-8").splitlines()[1:]
    ranks = {tuple(line.split()): r for r, line in enumerate(lines) if line}
    encoder = json.loads((VOCAB / "encoder.json").read_text(encoding="utf-8"))
    reference = tiktoken_from_files(VOCAB / "encoder.json", VOCAB / "vocab.bpe")
    text = TEXT + " supercalifragilistic<|endoftext|>aaaa"
    words = Tokenizer.gpt2().merge_steps(text, allowed_special="all")
    assert "".join(w["word"] for w in words) == text
    for w in words:
        if w["word"] != "<|endoftext|>":
            replay(w["word"], w["merges"], ranks)
    ids = [encoder[token] if token in encoder else 50256 for w in words for token in w["merges"][-1]]
    assert ids == reference.encode(text, allowed_special="all")
    ties = [w for w in words if w["word"] == "aaaa"]  # "a a" merges twice: the leftmost pair first
    assert ties and ties[0]["merges"][1] == ["aa", "a", "a"]
    assert words[-2] == {"word": "<|endoftext|>", "merges": [["<|endoftext|>"]]}
    ordinary = Tokenizer.gpt2().merge_steps("a<|endoftext|>")  # special tokens not allowed: read as characters
    assert [w["word"] for w in ordinary] == ["a", "<|", "endoftext", "|>"]


def test_a_char_model_walks_with_no_merges_and_its_learned_position_table():
    model = GPT2.from_pretrained(model_directory("shakespeare_char"), device="cpu")
    answer = walk(model, "ROMEO:", top_k=3)
    assert answer["tokenizer"] == "char" and answer["bpe"] is None and answer["tokens"] == list("ROMEO:")
    positions = answer["positions"]
    wpe = model.transformer.wpe.weight.detach()
    assert (
        positions["kind"] == "learned"
        and positions["rows"] == list(range(64))
        and positions["dims"] == list(range(128))
    )
    torch.testing.assert_close(torch.tensor(positions["heat"], dtype=torch.float64), wpe.double(), atol=1e-6, rtol=0)
    curves = torch.tensor(positions["curves"]["values"], dtype=torch.float64)
    torch.testing.assert_close(curves, wpe[:, positions["curves"]["dims"]].T.double(), atol=1e-6, rtol=0)


def test_a_sinusoidal_model_walks_with_the_seeds_sines_sampled_evenly():
    model = GPT2(GPT2Config(n_layer=1, n_head=2, n_embd=600, n_ctx=300, n_vocab=50, positions="sinusoidal"))
    positions = walk(model, [1, 2, 3])["positions"]
    assert positions["kind"] == "sinusoidal" and len(positions["rows"]) == 256 and len(positions["dims"]) == 256
    assert positions["rows"][0] == 0 and positions["rows"][-1] == 299 and positions["dims"][-1] == 599
    curves = positions["curves"]
    for d, values in zip(curves["dims"], curves["values"]):  # PE[t, 2i] = sin(t / 10000^(2i/C)), PE[t, 2i+1] = cos
        angle = torch.arange(300, dtype=torch.float64) / 10000 ** ((d - d % 2) / 600)
        torch.testing.assert_close(
            torch.tensor(values, dtype=torch.float64), angle.sin() if d % 2 == 0 else angle.cos(), atol=1e-5, rtol=0
        )
    assert curves["dims"] == [0, 1, 150, 300]


def test_a_model_without_a_tokenizer_walks_on_ids_and_a_bad_top_k_is_refused():
    model = GPT2.from_pretrained(REPO / "tests" / "fixtures" / "induction_2l", device="cpu")
    answer = walk(model, [3, 14, 15, 3], top_k=64)
    assert answer["tokenizer"] is None and answer["tokens"] is None and answer["bpe"] is None
    assert [e["token"] for e in answer["next"]] == [None] * 64
    with pytest.raises(InvalidArgumentError, match="k must be a whole number in 1..64, got 65"):
        walk(model, [3, 14], top_k=65)
