"""gpt2.tokenizer.load, the tokenizers' files: OpenAI's as released (their hashes), errors naming the
file and line, and Hugging Face's directory as transformers reads it (the same ids as ours)."""

from __future__ import annotations

import hashlib
import json
import re

import pytest
from helpers import VOCAB

from gpt2 import Tokenizer, VocabularyError, VocabularyNotFoundError
from gpt2.tokenizer import CharTokenizer, load_tokenizer, same_vocabulary


@pytest.fixture(scope="module")
def enc() -> Tokenizer:
    return Tokenizer.gpt2()


# ------------------------------------------------------------------ the vocabulary shipped


def test_packaged_vocabulary_matches_provenance_hashes():
    provenance = (VOCAB / "PROVENANCE.md").read_text()
    expected = dict(re.findall(r"\|\s*(encoder\.json|vocab\.bpe)\s*\|\s*\d+\s*\|\s*([0-9a-f]{64})\s*\|", provenance))
    assert set(expected) == {"encoder.json", "vocab.bpe"}
    for name, digest in expected.items():
        assert hashlib.sha256((VOCAB / name).read_bytes()).hexdigest() == digest, name
    assert "Modified MIT License" in (VOCAB / "LICENSE").read_text()


# ------------------------------------------------------------------ OpenAI's files


@pytest.fixture
def vocab_copy(tmp_path):
    (tmp_path / "encoder.json").write_bytes((VOCAB / "encoder.json").read_bytes())
    (tmp_path / "vocab.bpe").write_bytes((VOCAB / "vocab.bpe").read_bytes())
    return tmp_path


def test_missing_vocabulary_file(tmp_path):
    with pytest.raises(VocabularyNotFoundError, match="vocabulary file not found: .*encoder.json"):
        Tokenizer.from_files(tmp_path / "encoder.json", tmp_path / "vocab.bpe")


def test_corrupt_encoder_json(vocab_copy):
    (vocab_copy / "encoder.json").write_text('{"a": 0, "b": ')
    with pytest.raises(VocabularyError, match="is not valid JSON"):
        Tokenizer.from_files(vocab_copy / "encoder.json", vocab_copy / "vocab.bpe")


def test_encoder_json_with_a_non_integer_id(vocab_copy):
    encoder = json.loads((vocab_copy / "encoder.json").read_text())
    encoder["Hello"] = "15496"
    (vocab_copy / "encoder.json").write_text(json.dumps(encoder))
    with pytest.raises(VocabularyError, match="'Hello' has id '15496'"):
        Tokenizer.from_files(vocab_copy / "encoder.json", vocab_copy / "vocab.bpe")


def test_encoder_json_missing_a_byte(vocab_copy):
    encoder = json.loads((vocab_copy / "encoder.json").read_text())
    del encoder["!"]
    (vocab_copy / "encoder.json").write_text(json.dumps(encoder))
    with pytest.raises(VocabularyError, match="id 0 is missing"):
        Tokenizer.from_files(vocab_copy / "encoder.json", vocab_copy / "vocab.bpe")


def test_merge_naming_an_unknown_token(vocab_copy):
    lines = (vocab_copy / "vocab.bpe").read_text().splitlines()
    lines.insert(5, "Ġzzq xyzzy")
    (vocab_copy / "vocab.bpe").write_text("\n".join(lines) + "\n")
    with pytest.raises(VocabularyError, match="merge 4 \\(Ġzzq xyzzy\\) names 'Ġzzq', which is not a token"):
        Tokenizer.from_files(vocab_copy / "encoder.json", vocab_copy / "vocab.bpe")


def test_malformed_merge_line(vocab_copy):
    with open(vocab_copy / "vocab.bpe", "a", encoding="utf-8") as f:
        f.write("onlyonetoken\n")
    with pytest.raises(VocabularyError, match="line 50002: expected two tokens"):
        Tokenizer.from_files(vocab_copy / "encoder.json", vocab_copy / "vocab.bpe")


def test_files_read_again_are_read_as_they_are_now(vocab_copy, enc, tmp_path_factory):
    """A vocabulary is read once per process, by its files' contents: a copy elsewhere gives the
    same tokenizer, and a file changed since it was read is read anew."""
    first = Tokenizer.from_files(vocab_copy / "encoder.json", vocab_copy / "vocab.bpe")
    assert first.encode(" gazed") == [50255]
    elsewhere = tmp_path_factory.mktemp("copy")
    for name in ("encoder.json", "vocab.bpe"):
        (elsewhere / name).write_bytes((vocab_copy / name).read_bytes())
    assert Tokenizer.from_files(elsewhere / "encoder.json", elsewhere / "vocab.bpe") is first
    lines = (vocab_copy / "vocab.bpe").read_text(encoding="utf-8").splitlines()
    assert lines[-1] == "Ġg azed"  # GPT-2's last merge, which makes token 50255
    (vocab_copy / "vocab.bpe").write_text("\n".join(lines[:-1]) + "\n", encoding="utf-8")
    assert Tokenizer.from_files(vocab_copy / "encoder.json", vocab_copy / "vocab.bpe").encode(" gazed") == enc.encode(
        " g"
    ) + enc.encode("azed")


# ------------------------------------------------------------------ transformers' files

# Text that a decoder's "clean-up of tokenization spaces" would change (" ," -> ","), more whitespace, and not ASCII.
SPACED = "Hello , world !\nIt 's  don 't ? I 'm ; you 've .\r\n\t(x) [y] {z} -- 'quoted' \"too\"\n\n  café ✓ 😀 end "


def hf_tokenizer(directory):
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # not the note that the corpus is longer than model_max_length
    return AutoTokenizer.from_pretrained(directory)


@pytest.mark.parametrize("kind", ["gpt2", "bpe"])
def test_transformers_reads_the_saved_vocabulary_and_encodes_as_ours(kind, enc, corpus_text, tmp_path):
    ours = enc if kind == "gpt2" else Tokenizer.train(corpus_text[:100_000], 1000)
    ours.save_pretrained(tmp_path, model_max_length=64)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "merges.txt",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.json",
    ]
    theirs = hf_tokenizer(tmp_path)
    assert len(theirs) == ours.n_vocab and theirs.model_max_length == 64
    assert theirs.eos_token == theirs.bos_token == "<|endoftext|>" and theirs.eos_token_id == ours.eot_token
    for text in (corpus_text, SPACED):
        ids = ours.encode(text)
        assert theirs(text)["input_ids"] == ids
        assert theirs.decode(ids) == text
    every_id = [[i] for i in range(ours.n_vocab)]  # single tokens: partial UTF-8 characters decode as U+FFFD alike
    assert theirs.batch_decode(every_id) == [ours.decode(ids) for ids in every_id]
    # as in transformers' own GPT-2 files, text spelling <|endoftext|> is that token there
    assert theirs("a<|endoftext|>b")["input_ids"] == ours.encode("a<|endoftext|>b", allowed_special="all")
    # without tokenizer.json, transformers builds the same from vocab.json + merges.txt; and we read those back
    (tmp_path / "tokenizer.json").unlink()
    assert hf_tokenizer(tmp_path)(corpus_text[:50_000])["input_ids"] == ours.encode(corpus_text[:50_000])
    assert same_vocabulary(load_tokenizer(tmp_path), ours)


def test_transformers_reads_the_saved_character_vocabulary_and_encodes_as_ours(corpus_text, tmp_path):
    ours = CharTokenizer.from_text([corpus_text, SPACED])
    ours.save_pretrained(tmp_path, model_max_length=64)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chars.json", "tokenizer.json", "tokenizer_config.json"]
    theirs = hf_tokenizer(tmp_path)
    assert len(theirs) == ours.n_vocab and theirs.model_max_length == 64
    assert theirs.all_special_tokens == [] and theirs.eos_token_id is None
    for text in (corpus_text, SPACED):
        ids = ours.encode(text)
        assert theirs(text)["input_ids"] == ids
        assert theirs.decode(ids) == text
    assert theirs.batch_decode([[i] for i in range(ours.n_vocab)]) == ours.chars
    unknown = next(chr(c) for c in range(0x4E00, 0x9FFF) if chr(c) not in ours.chars)
    with pytest.raises(Exception, match=r"Missing \[UNK\] token"):  # refused, as ours refuses, never some id
        theirs("a" + unknown)
    assert same_vocabulary(load_tokenizer(tmp_path), ours)


def test_save_pretrained_removes_another_tokenizers_files(enc, tmp_path):
    enc.save(tmp_path)  # encoder.json + vocab.bpe, which load_tokenizer would read first
    (tmp_path / "special_tokens_map.json").write_text('{"unk_token": "a"}')  # transformers would read this
    chars = CharTokenizer(list("ab\n"))
    chars.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chars.json", "tokenizer.json", "tokenizer_config.json"]
    assert same_vocabulary(load_tokenizer(tmp_path), chars)
    enc.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "merges.txt",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.json",
    ]
    assert load_tokenizer(tmp_path).encode("Hello world") == [15496, 995]
