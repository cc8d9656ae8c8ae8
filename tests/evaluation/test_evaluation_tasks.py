"""The evaluation sets' files: their formats, wrong lines named, WikiText's rows, downloads and the cache."""

from __future__ import annotations

import json
import os
import re
import stat

import pytest

import gpt2.evaluation.tasks as tasks
from gpt2.errors import GPT2Error, UnwritablePathError
from gpt2.evaluation.tasks import Choice, Completion, read_hellaswag, read_lambada, read_wikitext, task_file


def write_lines(path, lines: list[str]):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_lambada_splits_at_the_last_space(tmp_path):
    path = write_lines(
        tmp_path / "l.jsonl",
        [json.dumps({"text": "the cat sat on the mat"}), "", json.dumps({"text": "Ça va, dit-il à Émile"})],
    )
    assert read_lambada(path) == [Completion("the cat sat on the", " mat"), Completion("Ça va, dit-il à", " Émile")]
    assert read_lambada(path, limit=1) == [Completion("the cat sat on the", " mat")]


def test_hellaswag_fields(tmp_path):
    record = {"ind": 4, "ctx": "A man", "ctx_a": "A man", "endings": ["a", "b", "c", "d"], "label": 3, "split": "val"}
    path = write_lines(tmp_path / "h.jsonl", [json.dumps(record)] * 3)
    assert read_hellaswag(path) == [Choice("A man", ("a", "b", "c", "d"), 3)] * 3
    assert len(read_hellaswag(path, limit=2)) == 2


@pytest.mark.parametrize(
    "reader, lines, message",
    [
        (read_lambada, ['{"text": "two words"}', "not json"], r"l.jsonl, line 2: not JSON"),
        (read_lambada, ['{"text": "two words"}', "", '["a list"]'], r"line 3: expected a JSON object, got list"),
        (
            read_lambada,
            ['{"sentence": "two words"}'],
            r"line 1: expected \{\"text\": \"...\"\} \(LAMBADA's format\), got keys \['sentence'\]",
        ),
        (read_lambada, ['{"text": "oneword"}'], r"line 1: the text 'oneword' has no space before a last word"),
        (read_lambada, [], r"l.jsonl holds no examples"),
        (
            read_hellaswag,
            ['{"ctx": "c", "endings": ["a", "b"], "label": 1}', '{"ctx": "c", "endings": "ab", "label": 0}'],
            r"line 2: expected \{\"ctx\": text, \"endings\": \[texts\], \"label\": index\} \(HellaSwag's format\)",
        ),
        (
            read_hellaswag,
            ['{"ctx": "c", "endings": ["a", "b"], "label": 2}'],
            r"line 1: label 2 is not the index of one of its 2 endings",
        ),
        (read_hellaswag, ['{"ctx": "c", "endings": ["a", "b"], "label": "1"}'], r"line 1: label '1' is not the index"),
    ],
)
def test_a_file_in_the_wrong_format_names_the_line(tmp_path, reader, lines, message):
    path = write_lines(tmp_path / "l.jsonl", lines)
    with pytest.raises(GPT2Error, match=message):
        reader(path)


def test_missing_and_undecodable_files(tmp_path):
    with pytest.raises(GPT2Error, match="nothing.jsonl does not exist"):
        read_lambada(tmp_path / "nothing.jsonl")
    (tmp_path / "bad.jsonl").write_bytes(b'{"text": "caf\xe9 au lait"}\n')
    with pytest.raises(GPT2Error, match="is not UTF-8 text: byte 0xe9 at offset 13"):
        read_lambada(tmp_path / "bad.jsonl")
    with pytest.raises(GPT2Error, match="is not a file"):
        read_wikitext(tmp_path)


def test_wikitext_rows_are_lines_and_blank_lines_are_empty_rows(tmp_path):
    # wiki.test.raw as `datasets` reads it: a row per line, newline kept; a blank line, ""
    path = tmp_path / "wiki.test.raw"
    path.write_text(" \n = Robert = \n \n Robert is a man .\n", encoding="utf-8")
    assert read_wikitext(path) == "\n\n = Robert = \n\n\n\n\n Robert is a man .\n"
    assert read_wikitext(path, limit=2) == "\n\n = Robert = \n"
    (tmp_path / "blank.raw").write_text(" \n\n", encoding="utf-8")
    with pytest.raises(GPT2Error, match="holds no text"):
        read_wikitext(tmp_path / "blank.raw")


def test_wikitext_from_the_hubs_parquet(tmp_path):
    import pyarrow as pa  # in the dev and eval extras
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["", " = Robert = \n", "", " Robert is a man .\n"]}), tmp_path / "test.parquet")
    assert read_wikitext(tmp_path / "test.parquet") == "\n\n = Robert = \n\n\n\n\n Robert is a man .\n"
    pq.write_table(pa.table({"sentence": ["a"]}), tmp_path / "other.parquet")
    with pytest.raises(GPT2Error, match=r"has no 'text' column \(its columns: sentence\)"):
        read_wikitext(tmp_path / "other.parquet")
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(GPT2Error, match="is not a readable parquet file"):
        read_wikitext(tmp_path / "broken.parquet")


# ------------------------------------------------------------------ downloads


@pytest.fixture
def online(monkeypatch, tmp_path):
    """The cache in tmp_path, downloads allowed, and LAMBADA's address a local file."""
    monkeypatch.setenv("GPT2_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    source = write_lines(tmp_path / "lambada_test.jsonl", [json.dumps({"text": "a b"})])
    monkeypatch.setattr(tasks, "LAMBADA_URL", source.as_uri())
    return source


def test_a_download_lands_once_in_the_cache_with_the_users_permissions(online, tmp_path):
    old = os.umask(0o022)
    try:
        path = task_file("lambada", progress=False)
    finally:
        os.umask(old)
    assert path == tmp_path / "cache" / "lambada_test.jsonl" and path.read_bytes() == online.read_bytes()
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    online.unlink()  # the cached copy serves from now on
    assert task_file("lambada", progress=False) == path and read_lambada(path) == [Completion("a", " b")]
    assert [p.name for p in path.parent.iterdir()] == ["lambada_test.jsonl"]  # no temporary file left


def test_a_failed_download_says_how_to_go_on_and_leaves_nothing(online, monkeypatch, tmp_path):
    monkeypatch.setattr(tasks, "HELLASWAG_URL", (tmp_path / "absent.jsonl").as_uri())
    with pytest.raises(
        GPT2Error,
        match=r"could not download hellaswag from file://.*absent.jsonl: .*; without a network, "
        r"download it elsewhere and pass its path as data",
    ) as e:
        task_file("hellaswag", progress=False)
    assert e.value.param == "data"
    assert list((tmp_path / "cache").iterdir()) == []


def test_an_unwritable_cache_is_named_before_anything_is_fetched(online, monkeypatch, tmp_path):
    (tmp_path / "a-file").write_text("x")
    monkeypatch.setenv("GPT2_CACHE", str(tmp_path / "a-file" / "cache"))
    monkeypatch.setattr(tasks.urllib.request, "urlopen", None)  # a fetch would fail otherwise
    with pytest.raises(
        UnwritablePathError,
        match=f"^cannot write into {re.escape(str(tmp_path / 'a-file' / 'cache'))}: "
        f"{re.escape(str(tmp_path / 'a-file'))} is a file, not a directory$",
    ):
        task_file("lambada", progress=False)


def test_offline_mode_downloads_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("GPT2_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(GPT2Error, match="lambada is not in the cache .* HF_HUB_OFFLINE is set"):
        task_file("lambada")
    with pytest.raises(
        GPT2Error, match=r"could not download wikitext2 from the Hugging Face hub \(Salesforce/wikitext\)"
    ):
        task_file("wikitext2")
    # the setting that gives the file is named: `gpt2 train`'s eval_task_data, not `gpt2 eval`'s data
    with pytest.raises(
        GPT2Error,
        match=r"HF_HUB_OFFLINE is set; without a network, download it elsewhere and pass its path as "
        r"eval_task_data$",
    ) as e:
        task_file("hellaswag", param="eval_task_data")
    assert e.value.param == "eval_task_data"
    with pytest.raises(GPT2Error, match=r"pass its path as eval_task_data \(wiki.test.raw") as e:
        task_file("wikitext2", param="eval_task_data")
    assert e.value.param == "eval_task_data"


def test_a_file_of_ones_own_is_taken_as_it_is(tmp_path):
    assert task_file("hellaswag", tmp_path / "mine.jsonl") == tmp_path / "mine.jsonl"
    with pytest.raises(GPT2Error, match="unknown task 'piqa'"):
        task_file("piqa")


def test_the_cache_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("GPT2_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tasks.cache_dir() == tmp_path / "gpt2"
