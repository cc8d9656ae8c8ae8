"""gpt2.tokenizer.registry: a tokenizer found by the directory it was saved in (OpenAI's names,
Hugging Face's, chars.json), against tiktoken."""

from __future__ import annotations

import pytest
from helpers import VOCAB

from gpt2 import Tokenizer, VocabularyError, VocabularyNotFoundError
from gpt2.tokenizer import CharTokenizer, load_tokenizer


def test_load_tokenizer_reads_openai_and_hugging_face_names(tmp_path, tiktoken_gpt2):
    import shutil

    text = "Hello world, <|endoftext|> it's 2024 ✓"
    for encoder, merges in [("encoder.json", "vocab.bpe"), ("vocab.json", "merges.txt")]:
        (tmp_path / encoder).mkdir()
        shutil.copy(VOCAB / "encoder.json", tmp_path / encoder / encoder)
        shutil.copy(VOCAB / "vocab.bpe", tmp_path / encoder / merges)
        loaded = load_tokenizer(tmp_path / encoder)
        assert isinstance(loaded, Tokenizer) and loaded.encode_ordinary(text) == tiktoken_gpt2.encode_ordinary(text)
    (tmp_path / "nothing").mkdir()
    assert load_tokenizer(tmp_path / "nothing") is None
    assert load_tokenizer(tmp_path / "nowhere") is None


def test_load_tokenizer_of_one_kind_passes_over_the_other(tmp_path):
    Tokenizer.gpt2().save(tmp_path)
    CharTokenizer(list("ab")).save(tmp_path)
    assert isinstance(load_tokenizer(tmp_path), Tokenizer)  # the pairs come first
    assert isinstance(load_tokenizer(tmp_path, "bpe"), Tokenizer)
    assert load_tokenizer(tmp_path, "char").chars == ["a", "b"]
    (tmp_path / "chars.json").unlink()
    assert load_tokenizer(tmp_path, "char") is None


def test_load_tokenizer_names_a_corrupt_or_missing_file(tmp_path):
    cases = {
        "chars1": ("not json", r"chars1/chars\.json"),
        "chars2": ('{"chars": "abc"}', r"chars\.json must hold a list of characters"),
        "chars3": ('{"chars": ["a", "a"]}', r"chars\.json: a character vocabulary lists each character once"),
        "chars4": ('["a"]', r"chars\.json"),
    }
    for name, (content, message) in cases.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "chars.json").write_text(content, encoding="utf-8")
        with pytest.raises(VocabularyError, match=message):
            load_tokenizer(tmp_path / name)
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "vocab.json").write_text("{}", encoding="utf-8")
    with pytest.raises(VocabularyNotFoundError, match=r"vocabulary file not found: .*half/merges\.txt"):
        load_tokenizer(tmp_path / "half")
