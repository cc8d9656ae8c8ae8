"""The `gpt2` command line, run in-process and once as a real subprocess."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import REPO, Watched, head_score_written_out, heed_ctrl_c, make_hf_model, write_conversations

from gpt2.cli import main

if TYPE_CHECKING:
    import torch

HELLO = "Hello!! I'm Andrej Karpathy. It's 2022. w00t :D 🤗"
HELLO_IDS = "15496 3228 314 1101 10948 73 509 5117 10036 13 632 338 33160 13 266 405 83 1058 35 12520 97 245"


def run(capsys, *argv: str, stdin: bytes | None = None, monkeypatch=None) -> tuple[int, str, str]:
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_tokenize_prints_ids(capsys):
    assert run(capsys, "tokenize", HELLO) == (0, HELLO_IDS + "\n", "")


def test_tokenize_joins_words_with_spaces(capsys):
    assert run(capsys, "tokenize", "Hello", "world") == (0, "15496 995\n", "")


def test_decode_prints_text(capsys):
    assert run(capsys, "tokenize", "--decode", "15496", "11", "995") == (0, "Hello, world\n", "")


def test_count(capsys):
    assert run(capsys, "tokenize", "--count", HELLO) == (0, "22\n", "")


def test_stdin_keeps_newlines_and_crlf(capsys, monkeypatch):
    code, out, _ = run(capsys, "tokenize", "-", stdin=b"a\r\nb\n", monkeypatch=monkeypatch)
    assert code == 0
    from gpt2 import Tokenizer

    assert out.split() == [str(i) for i in Tokenizer.gpt2().encode("a\r\nb\n")]


def test_decode_from_stdin(capsys, monkeypatch):
    assert run(capsys, "tokenize", "--decode", "-", stdin=b"15496 11\n995\n", monkeypatch=monkeypatch) == (
        0,
        "Hello, world\n",
        "",
    )


def test_special_token_only_when_allowed(capsys, tiktoken_gpt2):
    """tokenize.md's rule, kept while Tokenizer.encode raises on such text: characters unless --allow-special."""
    text = "a<|endoftext|>b"
    assert run(capsys, "tokenize", text)[1].split() == [
        str(i) for i in tiktoken_gpt2.encode(text, disallowed_special=())
    ]
    assert run(capsys, "tokenize", "--allow-special", text)[1].split() == [
        str(i) for i in tiktoken_gpt2.encode(text, allowed_special="all")
    ]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["tokenize", "--decode", "15496", "oops"], "--decode takes integer token ids, got 'oops'"),
        (["tokenize", "--decode", "-5"], "token id -5 at position 0 is out of range"),
        (["tokenize", "--decode", "50257"], "token id 50257 at position 0 is out of range: ids are 0..50256"),
        (["tokenize"], "nothing to tokenize"),
        (["tokenize", "--frobnicate", "x"], "unrecognized arguments: --frobnicate (see 'gpt2 tokenize --help')"),
        (
            ["tokenize", "\udcff\udcfe"],
            "the text given on the command line is not UTF-8 text: byte 0xff at character 0",
        ),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("gpt2: error: ")
    assert message in err
    assert "Traceback" not in err


def test_stdin_that_is_not_utf8(capsys, monkeypatch):
    code, _, err = run(capsys, "tokenize", "-", stdin=b"\xff\xfe bad", monkeypatch=monkeypatch)
    assert code == 2 and "standard input is not UTF-8" in err


def test_console_script_runs_as_a_process():
    result = subprocess.run(
        [sys.executable, "-m", "gpt2", "tokenize", "--count", "-"],
        input=b"Hello world",
        capture_output=True,
        timeout=60,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, b"2\n", b"")
    result = subprocess.run(
        [sys.executable, "-m", "gpt2", "tokenize", "--decode", "x"], capture_output=True, timeout=60
    )
    assert result.returncode == 2
    assert result.stderr.decode().strip() == "gpt2: error: --decode takes integer token ids, got 'x'"


def test_importing_gpt2_and_tokenizing_does_not_import_torch():
    code = "import sys, gpt2.cli; gpt2.cli.main(['tokenize', '--count', 'hi']); assert 'torch' not in sys.modules"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr.decode()


# ------------------------------------------------------------------ gpt2 generate


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("model")
    make_hf_model(vocab_size=50257, n_positions=64, n_embd=48, n_layer=2, n_head=3).save_pretrained(directory)
    return str(directory)


def expected_text(model_dir, prompt, **options):
    from gpt2 import GPT2, Tokenizer
    from gpt2.generation.generate import generate_text

    return generate_text(GPT2.from_pretrained(model_dir, device="cpu"), Tokenizer.gpt2(), prompt, **options)[0]


def test_generate_no_stream_prints_the_continuation(capsys, model_dir):
    code, out, err = run(
        capsys,
        "generate",
        "The dog",
        "--model",
        model_dir,
        "--max-new-tokens",
        "12",
        "--temperature",
        "0",
        "--no-stream",
        "--no-progress",
    )
    assert code == 0
    assert out == expected_text(model_dir, "The dog", max_new_tokens=12, temperature=0) + "\n"
    assert err.startswith("[gpt2: 12 tokens in ") and "tokens/s]" in err


def test_generate_streams_prompt_and_continuation(capsys, model_dir):
    code, out, _ = run(
        capsys, "generate", "Once", "--model", model_dir, "--max-new-tokens", "10", "--seed", "4", "--top-k", "40"
    )
    assert code == 0
    assert out == "Once" + expected_text(model_dir, "Once", max_new_tokens=10, seed=4, top_k=40, temperature=0.8) + "\n"


def test_generate_reads_end_of_text_in_a_prompt_as_the_special_token_unless_told(capsys, model_dir):
    """As OpenAI's API and gpt2 serve read it (tests/serve/test_serve_protocol.py checks that the two agree)."""
    prompt = "The end.<|endoftext|>A new story"
    argv = ["generate", prompt, "--model", model_dir, "--max-new-tokens", "10", "--temperature", "0", "--no-stream"]
    special = expected_text(model_dir, prompt, max_new_tokens=10, temperature=0, allowed_special={"<|endoftext|>"})
    as_text = expected_text(model_dir, prompt, max_new_tokens=10, temperature=0, allowed_special=frozenset())
    assert special != as_text
    assert run(capsys, *argv)[1] == special + "\n"
    assert run(capsys, *argv, "--special-as-text")[1] == as_text + "\n"
    assert run(capsys, *argv[:-1], "--engine", "numpy")[1] == prompt + special + "\n"


def test_generate_numpy_engine_agrees(capsys, model_dir):
    argv = ["generate", "Hello", "--model", model_dir, "--max-new-tokens", "6", "--temperature", "0", "--no-stream"]
    torch_out = run(capsys, *argv)[1]
    assert run(capsys, *argv, "--engine", "numpy")[1] == torch_out


@pytest.fixture(scope="module")
def draft_dir(model_dir, tmp_path_factory):
    """A draft of model_dir's vocabulary, which agrees with it often, not always."""
    from helpers import perturbed
    from transformers import GPT2LMHeadModel

    directory = tmp_path_factory.mktemp("draft")
    perturbed(GPT2LMHeadModel.from_pretrained(model_dir), 0.5).save_pretrained(directory)
    return str(directory)


def test_generate_with_a_draft_model_prints_what_the_model_alone_prints(capsys, model_dir, draft_dir):
    argv = [
        "generate",
        "The dog",
        "--model",
        model_dir,
        "--max-new-tokens",
        "24",
        "--temperature",
        "0",
        "--no-stream",
        "--no-progress",
    ]
    code, out, err = run(capsys, *argv, "--draft-model", draft_dir, "--draft-tokens", "3")
    assert code == 0 and out == expected_text(model_dir, "The dog", max_new_tokens=24, temperature=0) + "\n"
    assert err.startswith("[gpt2: 24 tokens in ")
    assert run(capsys, *argv, "--draft-model", draft_dir, "--engine", "numpy")[1] == out


def test_generate_refuses_a_draft_of_another_vocabulary_and_bad_draft_tokens_in_one_line(
    capsys, model_dir, draft_dir, tmp_path
):
    from gpt2.tokenizer import CharTokenizer

    make_hf_model(vocab_size=65, n_positions=32, n_embd=32, n_layer=1, n_head=2).save_pretrained(tmp_path)
    CharTokenizer([chr(c) for c in range(32, 97)]).save(tmp_path)
    capsys.readouterr()  # transformers' progress bar
    for flags, message in [
        (
            ["--draft-model", str(tmp_path)],
            "--draft-model has a vocabulary of 65 tokens, the model 50,257: "
            "a draft model must share the model's tokenizer",
        ),
        (
            ["--draft-tokens", "3"],
            "--draft-tokens is the number of tokens a draft proposes: give --draft-model or --speculative ngram too",
        ),
        (["--draft-model", draft_dir, "--draft-tokens", "0"], "--draft-tokens must be a positive integer, got 0"),
        (["--draft-model", draft_dir, "--speculative", "ngram"], "--draft-model and --speculative ngram contradict"),
    ]:
        code, out, err = run(capsys, "generate", "Hi", "--model", model_dir, *flags)
        assert (code, out) == (2, "") and err.startswith(f"gpt2: error: {message}") and err.count("\n") == 1


def test_generate_structured_outputs_penalties_and_prompt_lookup_print_what_the_python_api_gives(
    capsys, model_dir, tmp_path
):
    from gpt2.generation.processors import Constraint

    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["n"]}
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    (tmp_path / "yes.gbnf").write_text('root ::= ("yes" | "no") "!"')
    base = [
        "generate",
        "Hi",
        "--model",
        model_dir,
        "--max-new-tokens",
        "16",
        "--temperature",
        "0.9",
        "--seed",
        "4",
        "--no-stream",
    ]
    for flags, options in [
        (["--json-schema", str(tmp_path / "schema.json")], {"constraint": Constraint.json_schema(schema)}),
        (
            ["--json-object", "--logit-bias", "92=10", "--logit-bias", "1=8"],
            {"constraint": Constraint.json_object(), "logit_bias": {92: 10, 1: 8}},
        ),
        (["--regex", "[0-9]{4}"], {"constraint": Constraint.regex("[0-9]{4}")}),
        (
            ["--choice", "héllo there", "--choice", "bye 👋"],
            {"constraint": Constraint.choice(["héllo there", "bye 👋"])},
        ),
        (["--grammar", str(tmp_path / "yes.gbnf")], {"constraint": Constraint.grammar('root ::= ("yes" | "no") "!"')}),
        (
            ["--frequency-penalty", "1", "--presence-penalty", "-0.5", "--repetition-penalty", "1.4"],
            {"frequency_penalty": 1, "presence_penalty": -0.5, "repetition_penalty": 1.4},
        ),
        (["--speculative", "ngram", "--prompt-lookup-max", "3", "--prompt-lookup-min", "1", "--draft-tokens", "2"], {}),
    ]:
        code, out, err = run(capsys, *base, *flags)
        assert (
            code == 0
            and out
            == expected_text(model_dir, "Hi", max_new_tokens=16, temperature=0.9, seed=4, top_k=200, **options) + "\n"
        )
    assert json.loads(run(capsys, *base, "--json-schema", str(tmp_path / "schema.json"))[1])["n"] in range(1, 10)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--regex", "a((", "--max-new-tokens", "4"], '--regex: at 1(8): invalid regex "a(("'),
        (["--regex", "a", "--choice", "b"], "argument --choice: not allowed with argument --regex"),
        (["--json-schema", "missing.json"], "--json-schema: missing.json does not exist"),
        (["--grammar", "missing.lark"], "--grammar: missing.lark does not exist"),
        (["--choice", ""], "each choice (--choice) must be non-empty text"),
        (
            ["--logit-bias", "50256=-101"],
            "--logit-bias values must be numbers from -100 to 100, got -101.0 for token 50256",
        ),
        (["--logit-bias", "50257=1"], "token id 50257 in --logit-bias is out of range: ids are 0..50256"),
        (["--logit-bias", "eos"], "--logit-bias takes ID=BIAS"),
        (["--frequency-penalty", "2.5"], "--frequency-penalty must be a number from -2 to 2, got 2.5"),
        (["--presence-penalty", "-3"], "--presence-penalty must be a number from -2 to 2, got -3.0"),
        (["--repetition-penalty", "0"], "--repetition-penalty must be a number above 0 (1 is none), got 0.0"),
        (["--speculative", "tree"], "argument --speculative: invalid choice: 'tree'"),
        (
            ["--prompt-lookup-min", "3"],
            "--prompt-lookup-max and --prompt-lookup-min set --speculative ngram: give it too",
        ),
    ],
)
def test_generate_bad_structured_outputs_and_penalties_are_one_line_and_exit_2(capsys, model_dir, flags, message):
    code, out, err = run(capsys, "generate", "Hi", "--model", model_dir, *flags)
    assert (code, out) == (2, "") and err.count("\n") == 1 and err.startswith("gpt2: error: ") and message in err, err


@pytest.mark.cuda
def test_generate_with_cuda_graphs_prints_what_eager_decoding_prints(capsys, model_dir):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    argv = [
        "generate",
        "Hello",
        "--model",
        model_dir,
        "--max-new-tokens",
        "20",
        "--num-samples",
        "3",
        "--seed",
        "1",
        "--device",
        "cuda",
    ]
    eager = run(capsys, *argv)
    assert eager[0] == 0 and run(capsys, *argv, "--cuda-graphs")[1] == eager[1]


def test_generate_from_stdin_with_stop_and_samples(capsys, monkeypatch, model_dir):
    code, out, _ = run(
        capsys,
        "generate",
        "-",
        "--model",
        model_dir,
        "--max-new-tokens",
        "8",
        "--temperature",
        "0",
        "--num-samples",
        "2",
        "--no-stream",
        stdin=b"The dog",
        monkeypatch=monkeypatch,
    )
    assert code == 0 and out.count("sample 1 of 2") == 1 and out.count("sample 2 of 2") == 1
    continuation = expected_text(model_dir, "The dog", max_new_tokens=8, temperature=0)
    stop = continuation[len(continuation) // 2 :][:3]
    out = run(
        capsys,
        "generate",
        "The dog",
        "--model",
        model_dir,
        "--max-new-tokens",
        "8",
        "--temperature",
        "0",
        "--no-stream",
        "--stop",
        stop,
    )[1]
    assert out == continuation[: continuation.index(stop)] + "\n"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--temperature", "-1"], "--temperature must be a finite number >= 0"),
        (["--temperature", "inf"], "--temperature must be a finite number >= 0 (0 is greedy), got inf"),
        (["--temperature", "nan"], "--temperature must be a finite number >= 0 (0 is greedy), got nan"),
        (["--top-p", "inf"], "--top-p must be in (0, 1], got inf"),
        (["--top-k", "inf"], "argument --top-k: expected a whole number, got 'inf'"),
        (["--top-k", "0"], "--top-k must be an integer from 1 up, got 0"),
        (["--top-k", "50258"], "--top-k must be an integer from 1 to 50257, the model's vocabulary size, got 50258"),
        (["--num-samples", "0"], "--num-samples must be a positive integer, got 0"),
        (["--num-samples", "-3"], "--num-samples must be a positive integer, got -3"),
        (["--seed", "-1"], "--seed must be a whole number from 0 to 18446744073709551615, got -1"),
        (
            ["--seed", str(2**64)],
            "--seed must be a whole number from 0 to 18446744073709551615, got 18446744073709551616",
        ),
        (
            ["--engine", "numpy", "--device", "cuda"],
            "--engine numpy runs on the CPU only, not on --device cuda: use --engine torch",
        ),
        (["--engine", "numpy", "--dtype", "bfloat16"], "--engine numpy computes in float32 only, not --dtype bfloat16"),
        (["--engine", "numpy", "--dtype", "int8"], "--engine numpy computes in float32 only, not --dtype int8"),
        (["--cuda-graphs", "--device", "cpu"], "--cuda-graphs replays decoding on a CUDA GPU; --device cpu is cpu"),
        (
            ["--cuda-graphs", "--engine", "numpy"],
            "--cuda-graphs is for --engine torch on a CUDA GPU, not --engine numpy",
        ),
        (
            ["--model", ""],
            "the model name is empty: give a released name (gpt2, gpt2-medium, gpt2-large, gpt2-xl) or a directory",
        ),
        (["--frobnicate"], "unrecognized arguments: --frobnicate (see 'gpt2 generate --help')"),
        (["--top-p", "1.5"], "--top-p must be in (0, 1], got 1.5"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be a positive integer, got 0"),
        (["--max-new-tokens", "many"], "argument --max-new-tokens: expected a whole number, got 'many'"),
        (["--stop", ""], "--stop strings must be non-empty text"),
        (["--device", "tpu"], "unknown device (--device) 'tpu'"),
        (["--dtype", "int4"], "argument --dtype: invalid choice: 'int4'"),
        (["--max-new-tokens", "80", "--on-overflow", "error"], "exceed the context of n_ctx=64"),
    ],
)
def test_generate_bad_input_is_one_line_and_exit_2(capsys, model_dir, flags, message):
    code, out, err = run(capsys, "generate", "Hi", "--model", model_dir, *flags)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith("gpt2: error: ") and message in err


def test_generate_without_a_device_or_a_model(capsys, tmp_path):
    import torch

    if not torch.cuda.is_available():
        code, _, err = run(capsys, "generate", "Hi", "--model", str(tmp_path), "--device", "cuda")
        assert code == 2 and "CUDA is not available on this machine" in err
    code, _, err = run(capsys, "generate", "Hi", "--model", "gpt-5")
    assert code == 2 and "unknown model 'gpt-5'" in err and err.count("\n") == 1


def test_generate_released_name_offline_says_how_to_pass_a_path(tmp_path, forks):
    env = {**__import__("os").environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)}
    result = subprocess.run([forks.command, "generate", "Hi"], capture_output=True, timeout=120, env=env)
    assert result.returncode == 2
    err = result.stderr.decode()
    assert err.count("\n") == 1 and "could not download 'gpt2'" in err and "pass a local directory" in err


def test_a_generation_not_streamed_shows_its_progress_on_stderr(forks):
    """As prepare, eval and train do: a tqdm bar of the new tokens and their rate, which
    --no-progress turns off (a streamed generation shows itself)."""
    argv = [
        forks.command,
        "generate",
        "ROMEO:",
        "--model",
        "shakespeare_char",
        "--max-new-tokens",
        "50",
        "--seed",
        "1",
        "--no-stream",
    ]
    run = lambda *more: subprocess.run([*argv, *more], capture_output=True, timeout=120)  # noqa: E731  (bytes: the bar's \r kept)
    shown = run()
    assert (
        shown.returncode == 0 and len(shown.stdout.decode()) == 50 + 1
    )  # 50 characters, a token each, and the newline
    bar = shown.stderr.decode().split("\r")[-1]  # the bar as it was last drawn, then the summary
    assert re.match(r"generating: 100%\|█+\| 50/50 \[[0-9:]+<00:00, +[0-9.]+tok/s\]\n\[gpt2: 50 tokens in ", bar), (
        shown.stderr
    )
    quiet = run("--no-progress")
    assert (quiet.returncode, quiet.stdout) == (0, shown.stdout) and quiet.stderr.startswith(b"[gpt2: 50 tokens in ")
    argv.remove("--no-stream")
    streamed = run()
    assert streamed.stdout == b"ROMEO:" + shown.stdout and streamed.stderr.startswith(b"[gpt2: 50 tokens in ")


def test_ctrl_c_while_streaming_keeps_what_was_printed(model_dir, forks):
    import signal

    process = subprocess.Popen(  # past the context: still generating when the signal comes, however fast
        [
            forks.command,
            "generate",
            "Tell me a story",
            "--model",
            model_dir,
            "--engine",
            "numpy",
            "--max-new-tokens",
            "100000",
            "--seed",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=heed_ctrl_c,
    )
    first = process.stdout.read(len("Tell me a story"))  # the prompt arrives first, then tokens
    more = process.stdout.read(1)  # a token's text: generation is under way (the prompt comes with the first token)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert first == b"Tell me a story" and len(more) == 1
    assert process.returncode == 130
    assert b"Traceback" not in err and b"interrupted" in err
    assert (first + more + out).startswith(b"Tell me a story")  # what was printed before the signal stays


def test_a_prompt_that_is_not_utf8_on_the_command_line():
    """Python hands such argv bytes over as lone surrogates: an error, as on standard input."""
    result = subprocess.run(
        [sys.executable, "-m", "gpt2", "generate", b"caf\xe9 au lait", "--model", "nowhere"],
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 2 and result.stdout == b""
    assert (
        result.stderr.decode()
        == "gpt2: error: the prompt given on the command line is not UTF-8 text: byte 0xe9 at character 3\n"
    )


def test_version_and_help_texts(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"gpt2 {__import__('gpt2').__version__}\n"
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    out = capsys.readouterr().out
    text = " ".join(out.split())  # argparse wraps help lines at the terminal's width
    for default in [
        "(default: float32)",
        "(default: off)",
        "(default: random)",
        "(default: 200, or the vocabulary size if smaller)",
        "(default: 0.8)",
        "(default: gpt2)",
        "(default: torch)",
    ]:
        assert default in text, default
    assert (
        '\nexamples:\n  gpt2 generate "Alan Turing' in out
        and '\n  echo "The meaning of life is" | gpt2 generate -' in out
    )
    with pytest.raises(SystemExit):
        main(["tokenize", "--help"])
    assert '\nexamples:\n  gpt2 tokenize "Hello world"\n  gpt2 tokenize --decode 15496 995\n' in capsys.readouterr().out


@pytest.mark.parametrize(
    "stdin, prompt",
    [(b"The dog\n", "The dog"), (b"The dog\r\n", "The dog"), (b"The dog\n\n", "The dog\n"), (b"The dog", "The dog")],
)
def test_a_prompt_from_stdin_loses_one_final_newline(capsys, monkeypatch, model_dir, stdin, prompt):
    code, out, _ = run(
        capsys,
        "generate",
        "-",
        "--model",
        model_dir,
        "--max-new-tokens",
        "6",
        "--temperature",
        "0",
        stdin=stdin,
        monkeypatch=monkeypatch,
    )
    assert code == 0 and out == prompt + expected_text(model_dir, prompt, max_new_tokens=6, temperature=0) + "\n"


def test_one_summary_for_all_samples_and_1_token_in_the_singular(capsys, model_dir):
    code, out, err = run(
        capsys, "generate", "Hi", "--model", model_dir, "--max-new-tokens", "4", "--num-samples", "3", "--seed", "1"
    )
    assert code == 0 and out.count(" sample ") == 3
    assert err.count("[gpt2: ") == 1 and err.startswith("[gpt2: 12 tokens in ")
    code, _, err = run(capsys, "generate", "Hi", "--model", model_dir, "--max-new-tokens", "1")
    assert code == 0 and err.startswith("[gpt2: 1 token in ")


def test_samples_generated_together_print_one_after_another_with_the_one_seed_rule(capsys, model_dir):
    """Streamed or not, sample i is what the Python API gives row i, and seed + i alone."""
    from gpt2 import GPT2, Tokenizer
    from gpt2.generation.generate import generate_text

    model = GPT2.from_pretrained(model_dir, device="cpu")
    texts = generate_text(
        model, Tokenizer.gpt2(), "Hi", max_new_tokens=12, seed=5, top_k=200, temperature=0.8, num_samples=3
    )
    assert texts[2] == expected_text(model_dir, "Hi", max_new_tokens=12, seed=7, top_k=200, temperature=0.8)
    argv = ["generate", "Hi", "--model", model_dir, "--max-new-tokens", "12", "--seed", "5", "--num-samples", "3"]
    header = lambda i: f"{'=' * 20} sample {i} of 3 {'=' * 20}\n"  # noqa: E731
    assert run(capsys, *argv)[1] == "".join(header(i + 1) + "Hi" + text + "\n" for i, text in enumerate(texts))
    assert run(capsys, *argv, "--no-stream")[1] == "".join(header(i + 1) + text + "\n" for i, text in enumerate(texts))


def test_the_largest_seed_and_the_samples_after_it(capsys, model_dir):
    argv = ["generate", "Hi", "--model", model_dir, "--max-new-tokens", "8", "--no-stream"]
    out = run(capsys, *argv, "--seed", str(2**64 - 1), "--num-samples", "2")[1]
    assert out.split("\n", 1)[1].startswith(
        expected_text(model_dir, "Hi", max_new_tokens=8, seed=2**64 - 1, top_k=200, temperature=0.8)
    )
    assert (
        out.rsplit("=\n", 1)[1]
        == expected_text(model_dir, "Hi", max_new_tokens=8, seed=0, top_k=200, temperature=0.8) + "\n"
    )


def test_a_character_sized_vocabulary_generates_with_no_flags(capsys, tmp_path):
    """The default top-k of 200 clamps to a 65-token vocabulary; only an explicit value over it is an error."""
    from gpt2.tokenizer import CharTokenizer

    make_hf_model(vocab_size=65, n_positions=32, n_embd=32, n_layer=2, n_head=2).save_pretrained(tmp_path)
    CharTokenizer([chr(c) for c in range(32, 97)]).save(tmp_path)  # its vocabulary: " " to "`"
    capsys.readouterr()  # transformers' progress bar
    code, out, err = run(capsys, "generate", "A", "--model", str(tmp_path), "--max-new-tokens", "10")
    assert len(out) == len("A") + 10 + 1  # ten characters, one a token, and the newline
    assert code == 0 and out.startswith("A") and len(out) > 2 and err.startswith("[gpt2: 10 tokens in ")
    code, out, err = run(capsys, "generate", "A", "--model", str(tmp_path), "--top-k", "66")
    assert (code, out) == (
        2,
        "",
    ) and err == "gpt2: error: --top-k must be an integer from 1 to 65, the model's vocabulary size, got 66\n"


def test_a_model_that_produces_nan_stops_with_one_line(capsys, tmp_path):
    import torch

    hf = make_hf_model(vocab_size=50257, n_positions=64, n_embd=32, n_layer=1, n_head=2)
    with torch.no_grad():
        hf.transformer.h[0].mlp.c_fc.weight[0, 0] = float("nan")
    hf.save_pretrained(tmp_path)
    capsys.readouterr()  # transformers' progress bar
    for flags in (["--temperature", "0"], ["--seed", "0"], ["--no-stream", "--no-progress"]):
        code, out, err = run(capsys, "generate", "The dog", "--model", str(tmp_path), *flags)
        assert code == 2 and out in ("", "The dog\n")  # a streamed prompt gets its line ended
        assert (
            err
            == "gpt2: error: the model produced NaN or infinite logits at new token 1: its weights hold NaN or inf, "
            "or its dtype overflowed (try float32)\n"
        )


# the replay below runs past the tiny model's context too, with the warning the CLI printed
@pytest.mark.filterwarnings("ignore::gpt2.generation.decoding.ContextOverflowWarning")
def test_ctrl_c_without_streaming_prints_what_was_generated(model_dir, forks, tmp_path):
    import signal

    from gpt2 import Tokenizer
    from gpt2.generation.generate import generate_text
    from gpt2.reference import ReferenceModel

    argv = ["generate", "Tell me a story", "--model", model_dir, "--engine", "numpy", "--seed", "1", "--no-stream"]
    with open(tmp_path / "stdout", "wb") as stdout:
        run = Watched([str(forks.command), *argv, "--max-new-tokens", "100000"], dict(os.environ), stdout)
        run.wait_for(r"\| *[1-9][0-9]*/100000 ")  # the progress bar: tokens generated, none printed (not streamed)
        run.stop(signal.SIGINT)
    out, err = (tmp_path / "stdout").read_bytes(), run.err
    assert run.process.returncode == 130 and "Traceback" not in err
    assert err.startswith("gpt2: warning: ") and "exceed the context" in err.splitlines()[0]
    summary, interrupted = err.splitlines()[-2:]  # after the bar's last line
    assert interrupted == "gpt2: interrupted"
    generated = int(summary.split()[1])
    assert generated > 0 and out.endswith(b"\n")
    reference = ReferenceModel.load(model_dir)
    whole = generate_text(
        reference, Tokenizer.gpt2(), "Tell me a story", max_new_tokens=generated, seed=1, top_k=200, temperature=0.8
    )[0]
    assert whole.startswith(out.decode()[:-1]) and len(out) > 1


# ------------------------------------------------------------------ gpt2 inspect


def hf_log_probabilities(model_dir: str, ids: list[int]) -> torch.Tensor:
    import torch
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(model_dir).eval()
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0], dim=-1)  # (T, V)


def test_inspect_json_gives_transformers_log_probabilities(capsys, model_dir, tiktoken_gpt2):
    import json

    text = "The dog chased the cat"
    code, out, err = run(capsys, "inspect", text, "--model", model_dir, "--json", "--top-k", "3")
    assert code == 0 and err == ""
    got = json.loads(out)
    ids = tiktoken_gpt2.encode(text)
    assert got["ids"] == ids and got["tokens"] == [tiktoken_gpt2.decode([i]) for i in ids]
    expected = hf_log_probabilities(model_dir, ids)
    assert got["logprobs"][0] is None
    assert max(abs(got["logprobs"][t] - expected[t - 1, ids[t]].item()) for t in range(1, len(ids))) < 1e-4
    assert [[e["id"] for e in top] for top in got["top"]] == expected.topk(3).indices.tolist()
    assert got["top"][0][0]["token"] == tiktoken_gpt2.decode([got["top"][0][0]["id"]])


def test_inspect_prints_each_tokens_probability_rank_and_alternatives(capsys, model_dir, tiktoken_gpt2):
    import math

    text = "The dog chased the cat"
    code, out, _ = run(capsys, "inspect", text, "--model", model_dir, "--top-k", "2")
    assert code == 0 and "\x1b[" not in out  # not a terminal: no colour
    lines = out.splitlines()
    ids = tiktoken_gpt2.encode(text)
    expected = hf_log_probabilities(model_dir, ids)
    assert len(lines) == 1 + len(ids) + 1  # a header, a line a token, the next token
    assert lines[1].split() == ["'The'", "-", "-"]
    for t in range(1, len(ids)):
        p = math.exp(expected[t - 1, ids[t]].item())
        rank = 1 + int((expected[t - 1] > expected[t - 1, ids[t]]).sum())
        token, shown_p, shown_rank = re.match(r"('.*?')\s+([\d.]+%)\s+(\d+)", lines[1 + t]).groups()
        assert (token, shown_p, int(shown_rank)) == (repr(tiktoken_gpt2.decode([ids[t]])), f"{p:.2%}", rank)
    best = expected[-1].topk(2).indices.tolist()
    assert lines[-1].startswith("(next)") and repr(tiktoken_gpt2.decode([best[0]])) in lines[-1]
    _, coloured, _ = run(capsys, "inspect", text, "--model", model_dir, "--color", "always")
    assert coloured.count("\x1b[38;5;") == len(ids) - 1


def test_inspect_walk_prints_every_step_with_transformers_values(capsys, model_dir):
    import torch
    from transformers import GPT2LMHeadModel

    code, out, _ = run(capsys, "inspect", "Hello, world", "--model", model_dir, "--walk")
    assert code == 0
    lines = {line.split()[0]: line for line in out.splitlines()}
    hf = GPT2LMHeadModel.from_pretrained(model_dir).eval()
    kept = {}
    hf.transformer.h[1].mlp.act.register_forward_hook(lambda m, a, out: kept.__setitem__("gelu", out[0, -1]))
    with torch.no_grad():
        hf(torch.tensor([[15496, 11, 995]]))
    line = lines["h.1.mlp.gelu"]
    assert "(3, 192)" in line
    values = [float(v) for v in re.search(r"\[(.*), \.\.\.\]", line).group(1).split(", ")]
    assert max(abs(a - b) for a, b in zip(values, kept["gelu"][:4].tolist())) < 1e-4
    for step in (
        "wte",
        "wpe",
        "x",
        "h.0.ln_1",
        "h.0.attn.c_attn",
        "h.0.attn.q",
        "h.0.attn.scores",
        "h.0.attn.pattern",
        "h.0.attn.z",
        "h.0.attn.c_proj",
        "h.0.mlp.c_fc",
        "h.1",
        "ln_f",
        "logits",
        "softmax",
    ):
        assert step in lines, step
    assert "(3, 50257)" in lines["logits"] and "the next token after ' world'" in lines["softmax"]


def test_inspect_png_draws_every_picture(capsys, model_dir, tmp_path):
    import matplotlib.image

    code, _, err = run(
        capsys,
        "inspect",
        "The dog chased the cat",
        "--model",
        model_dir,
        "--png",
        str(tmp_path / "pics"),
        "--position",
        "2",
        "--temperature",
        "0.7",
        "--top-p",
        "0.9",
    )
    assert code == 0
    names = ["attention-block0.png", "attention-block1.png", "logit-lens.png", "next-token.png"]
    assert err == f"gpt2: wrote 4 pictures in {tmp_path / 'pics'}: {', '.join(names)}\n"
    for name in names:
        assert matplotlib.image.imread(tmp_path / "pics" / name).shape[0] > 100


@pytest.mark.parametrize(
    "argv,message",
    [
        (["inspect", "", "--json"], "gpt2: error: the text is empty: give at least one token's worth"),
        (["inspect", "a", "--json", "--walk"], "gpt2: error: give --json or --walk, not both"),
        (["inspect", "--json"], "gpt2: error: no text: give one"),
        (["inspect", "a", "--top-k", "0"], "gpt2: error: --top-k must be"),
        (
            ["inspect", " ".join(["a"] * 70)],
            "gpt2: error: sequence of 70 tokens is longer than the model's context of n_ctx=64",
        ),
        (
            ["inspect", "a b c", "--png", "PNG", "--position", "3"],
            "gpt2: error: --position must be a whole number in 0..2",
        ),
        (
            ["inspect", "a", "--png", "PNG", "--temperature", "-1"],
            "gpt2: error: --temperature must be a finite number >= 0",
        ),
        (["inspect", "a", "--png", "FILE"], "gpt2: error: "),
    ],
)
def test_inspect_bad_input_is_one_line(capsys, model_dir, tmp_path, argv, message):
    (tmp_path / "FILE").write_text("not a directory")
    argv = [a.replace("PNG", str(tmp_path / "pics")).replace("FILE", str(tmp_path / "FILE")) for a in argv]
    code, out, err = run(capsys, *argv, "--model", model_dir)
    assert code == 2 and out == ""
    assert err.startswith(message) and err.count("\n") == 1, err


KINDS = ("previous_token", "duplicate_token", "induction")


def hf_head_scores(model_dir: str, ids: list[int]) -> dict:
    """Each kind's (n_layer, n_head) scores, written out on transformers' attention probabilities."""
    import torch
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        A = torch.stack(hf(torch.tensor([ids]), output_attentions=True).attentions)[:, 0]  # (L, H, T, T)
    return {
        kind: [[head_score_written_out(A[l, h], ids, kind) for h in range(A.shape[1])] for l in range(A.shape[0])]
        for kind in KINDS
    }


def test_inspect_heads_prints_transformers_head_scores_on_a_repeated_random_sequence(capsys, model_dir, tmp_path):
    import matplotlib.image
    import torch

    code, out, err = run(capsys, "inspect", "--heads", "--repeat", "20", "--model", model_dir, "--png", str(tmp_path))
    assert code == 0 and err == f"gpt2: wrote {tmp_path / 'head-scores.png'}\n"
    half = torch.randint(0, 50257, (20,), generator=torch.Generator().manual_seed(0)).tolist()  # the documented seed
    expected = hf_head_scores(model_dir, [50256] + half + half)
    lines = out.splitlines()
    assert lines[:2] == ["head scores on 20 random tokens written twice (seed 0, 41 tokens)", ""]
    tables = "\n".join(lines[2:]).split("\n\n")
    assert len(tables) == 3
    for kind, table in zip(KINDS, tables):
        header, *rows = table.splitlines()
        assert header.split() == [kind, "head", "0", "head", "1", "head", "2"]
        assert [row.split()[:2] for row in rows] == [["layer", "0"], ["layer", "1"]]
        shown = [[float(v) for v in row.split()[2:]] for row in rows]
        assert all(abs(a - b) <= 0.005 + 1e-5 for r, e in zip(shown, expected[kind]) for a, b in zip(r, e)), (
            kind,
            shown,
        )
    assert min(min(row) for row in expected["previous_token"]) > 0.01  # the tables compared are not all 0.00
    image = matplotlib.image.imread(tmp_path / "head-scores.png")
    assert (
        image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 3 * image.shape[0] / 2
    )  # three panels side by side


def test_inspect_heads_json_on_a_text(capsys, model_dir, tiktoken_gpt2):
    import json

    text = "The cat sat. The cat sat."
    code, out, err = run(capsys, "inspect", "--heads", text, "--model", model_dir, "--json")
    assert code == 0 and err == ""
    got = json.loads(out)
    expected = hf_head_scores(model_dir, tiktoken_gpt2.encode(text))
    assert list(got) == list(KINDS)
    for kind in KINDS:
        assert max(abs(a - b) for r, e in zip(got[kind], expected[kind]) for a, b in zip(r, e)) < 1e-4
    _, out, _ = run(capsys, "inspect", "--heads", "The dog ran", "--model", model_dir, "--json")
    assert json.loads(out)["induction"] is None  # no token repeats: nothing to score, previous_token still scored
    _, out, _ = run(capsys, "inspect", "--heads", "The dog ran", "--model", model_dir)
    assert out.splitlines()[-1] == "induction: none (no token of the input occurs twice)"


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--heads", "--repeat", "0"], "gpt2: error: --repeat must be a positive integer, got 0"),
        (["--heads", "--repeat", "2.5"], "gpt2: error: argument --repeat: expected a whole number, got '2.5'"),
        (
            ["--heads", "--repeat", "32"],
            "gpt2: error: --repeat 32 makes a sequence of 65 tokens (<|endoftext|>, then 32 "
            "random tokens twice), longer than the model's context of n_ctx=64: give --repeat 31 or less",
        ),
        (["--heads"], "gpt2: error: give --heads a text, or --repeat N for N random tokens written twice"),
        (["--heads", "a a", "--repeat", "3"], "gpt2: error: give --heads a text or --repeat N, not both"),
        (["--repeat", "3"], "gpt2: error: --repeat is the length of --heads' random sequence: add --heads"),
        (
            ["--heads", "a a", "--walk"],
            "gpt2: error: --walk walks through one forward pass; --heads scores every head: give one of them",
        ),
        (
            ["--heads", " ".join(["a"] * 70)],
            "gpt2: error: sequence of 70 tokens is longer than the model's context of n_ctx=64",
        ),
        (["--heads", "a"], "gpt2: error: the text is one token: head scores need two or more"),
        (["--heads", "a a", "--png", "FILE"], "gpt2: error: cannot write into"),
        (["--heads", "--experiment", "induction"], "gpt2: error: give --heads or --experiment, not both"),
    ],
)
def test_inspect_heads_bad_input_is_one_line(capsys, model_dir, tmp_path, argv, message):
    (tmp_path / "FILE").write_text("not a directory")
    argv = [a.replace("FILE", str(tmp_path / "FILE")) for a in argv]
    code, out, err = run(capsys, "inspect", *argv, "--model", model_dir)
    assert code == 2 and out == ""
    assert err.startswith(message) and err.count("\n") == 1, err


def test_inspect_corrupted_patches_the_clean_text_into_it(capsys, model_dir, tiktoken_gpt2, tmp_path):
    """--corrupted: both runs' logit differences are transformers'; patching the one embedding that
    differs (resid_pre, layer 0) gives the clean run's, any before it the corrupted run's; the
    estimate is gpt2.inspect.attribution_patching's (tested against transformers in its own module)."""
    import json

    import matplotlib.image
    import torch

    from gpt2 import GPT2
    from gpt2.inspect import attribution_patching, logit_diff

    clean, corrupted = (
        "When Mary and John went to the store, John gave a drink to",
        "When Mary and John went to the store, Mary gave a drink to",
    )
    ids = {name: tiktoken_gpt2.encode(text) for name, text in (("clean", clean), ("corrupted", corrupted))}
    logits = {
        name: hf_log_probabilities(model_dir, i)[-1] for name, i in ids.items()
    }  # log-softmax: differences are the logits'
    top = int(logits["clean"].argmax())
    assert top == int(logits["corrupted"].argmax())  # this random model's: both texts' next token, the defaults of both
    capsys.readouterr()  # transformers' progress bars
    code, out, err = run(capsys, "inspect", "--corrupted", corrupted, clean, "--model", model_dir, "--json")
    assert (code, out) == (2, "") and err == (
        f"gpt2: error: --answer and --other are the same token, {tiktoken_gpt2.decode([top])!r} (id {top}; "
        "answer: the clean text's next token; other: the corrupted text's next token): logit(answer) "
        "- logit(other) is 0 whatever the model does; give two different tokens\n"
    )
    john = tiktoken_gpt2.encode(" John")[0]
    code, out, err = run(
        capsys,
        "inspect",
        "--corrupted",
        corrupted,
        clean,
        "--model",
        model_dir,
        "--json",
        "--png",
        str(tmp_path),
        "--other",
        " John",
    )
    assert code == 0 and err == f"gpt2: wrote {tmp_path / 'patching.png'}\n"
    got = json.loads(out)
    assert (got["answer"], got["other"]) == (top, john)
    for name in ("clean", "corrupted"):
        assert abs(got["logit_diff"][name] - float(logits[name][got["answer"]] - logits[name][got["other"]])) < 1e-4
    p = next(t for t, (a, b) in enumerate(zip(ids["clean"], ids["corrupted"])) if a != b)
    grid = torch.tensor(got["activation"])  # (n_layer, T)
    assert abs(grid[0, p] - got["logit_diff"]["clean"]) < 1e-4 and torch.allclose(
        grid[:, :p], torch.tensor(got["logit_diff"]["corrupted"]), atol=1e-4
    )
    model = GPT2.from_pretrained(model_dir, device="cpu")
    expected = attribution_patching(model, clean, corrupted, logit_diff(got["answer"], got["other"]), "resid_pre")
    assert torch.allclose(torch.tensor(got["attribution"]), expected, atol=1e-5)
    assert got["tokens"] == [tiktoken_gpt2.decode([i]) for i in ids["clean"]]
    image = matplotlib.image.imread(tmp_path / "patching.png")
    assert image.ndim == 3 and image.shape[0] > 300  # two grids, one above the other
    code, out, _ = run(
        capsys,
        "inspect",
        "--corrupted",
        corrupted,
        clean,
        "--model",
        model_dir,
        "--answer",
        " Mary",
        "--other",
        " John",
    )
    assert (
        code == 0
        and out.startswith("resid_pre: logit(' Mary') - logit(' John'): clean ")
        and "attribution patching" in out
    )


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--corrupted", "a b"], "gpt2: error: --corrupted needs the clean text too"),
        (
            ["--corrupted", "a b", "a c", "--answer", " Mary Jane"],
            "gpt2: error: --answer must be one token of the model's vocabulary, but ' Mary Jane' is 2",
        ),
        (
            ["--corrupted", "a b c", "a c"],
            "gpt2: error: clean and corrupted (--corrupted) must have the same length: clean has 2 tokens, corrupted 3",
        ),
        (
            ["--corrupted", "a b", "a c", "--heads"],
            "gpt2: error: --corrupted patches a clean text with a corrupted one: give it without --heads",
        ),
        (
            ["--corrupted", "a b", "a c", "--site", "head_pos"],
            "gpt2: error: argument --site: invalid choice: 'head_pos'",
        ),
    ],
)
def test_inspect_corrupted_bad_input_is_one_line(capsys, model_dir, argv, message):
    code, out, err = run(capsys, "inspect", *argv, "--model", model_dir)
    assert code == 2 and out == ""
    assert err.startswith(message) and err.count("\n") == 1, err


# ------------------------------------------------------------------ gpt2 prepare


def test_prepare_writes_data_and_says_what(tmp_path, capsys):
    (tmp_path / "in.txt").write_text(
        "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 20, encoding="utf-8"
    )
    assert (
        main(
            ["prepare", str(tmp_path / "in.txt"), "--out", str(tmp_path / "d"), "--tokenizer", "char", "--no-progress"]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "training and" in err and "(char)" in err
    assert {p.name for p in (tmp_path / "d").iterdir()} == {"train.bin", "val.bin", "meta.json", "chars.json"}


@pytest.mark.parametrize(
    "args, message",
    [
        (["nowhere.txt"], "input 'nowhere.txt' does not exist"),
        (["IN", "--tokenizer", "bpe:12"], "unknown tokenizer (--tokenizer) 'bpe:12'"),
        (["IN", "--val-fraction", "2"], r"--val-fraction must be a number in (0, 1), got 2.0"),
        (["IN", "--val-fraction", "x"], "argument --val-fraction: invalid float value: 'x'"),
    ],
)
def test_prepare_errors_are_one_line(tmp_path, capsys, args, message):
    (tmp_path / "in.txt").write_text("some text here", encoding="utf-8")
    args = [str(tmp_path / "in.txt") if a == "IN" else a for a in args]
    assert main(["prepare", *args, "--out", str(tmp_path / "d"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpt2: error: ") and err.count("\n") == 1 and message in err


def test_prepare_from_stdin_refuses_to_overwrite_and_shows_examples(tmp_path, capsys, monkeypatch):
    import numpy as np

    text = "Hello world. " * 50
    code, out, err = run(
        capsys,
        "prepare",
        "-",
        "--out",
        str(tmp_path / "d"),
        "--no-progress",
        stdin=text.encode(),
        monkeypatch=monkeypatch,
    )
    ids = np.concatenate([np.fromfile(tmp_path / "d" / f, dtype="<u2") for f in ("train.bin", "val.bin")]).tolist()
    assert code == 0 and out == "" and ids[:3] == [15496, 995, 13] and ids[-1] == 50256  # "Hello", " world", "."
    train = int(len(ids) * 0.9)  # one document: nanoGPT's split
    assert err == (
        f"gpt2: {train:,} training and {len(ids) - train:,} validation tokens ({(len(ids) - train) / len(ids):.2%} for "
        f"validation) of a 50,257-token vocabulary (gpt2) in {tmp_path / 'd'}\n"
    )
    code, _, err = run(capsys, "prepare", "-", "--out", str(tmp_path / "d"), stdin=b"more", monkeypatch=monkeypatch)
    assert (
        code == 2
        and err.count("\n") == 1
        and "already holds prepared data" in err
        and "pass --overwrite to replace it" in err
    )
    with pytest.raises(SystemExit):
        main(["prepare", "--help"])
    assert (
        "\nexamples:\n  gpt2 prepare shakespeare --out data/shakespeare_char --tokenizer char   "
        "# tinyshakespeare, shipped in gpt2\n" in capsys.readouterr().out
    )


def test_prepare_says_how_several_documents_split(tmp_path, capsys):
    import json

    for name, size in (("a.txt", 3000), ("b.txt", 900), ("c.txt", 40)):  # drawn: c, a, b
        (tmp_path / "in" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "in" / name).write_text(("All the world's a stage. " * 200)[:size], encoding="utf-8")
    code, _, err = run(
        capsys, "prepare", str(tmp_path / "in"), "--out", str(tmp_path / "d"), "--val-fraction", "0.2", "--no-progress"
    )
    meta = json.loads((tmp_path / "d" / "meta.json").read_text())
    train, val, split = meta["train_tokens"], meta["val_tokens"], meta["split"]
    assert code == 0 and split["val_documents"] == 1 and split["cut"] is not None  # one whole, the tail of another
    assert err == (
        f"gpt2: {train:,} training and {val:,} validation tokens ({val / (train + val):.2%} for validation: 1 whole "
        f"document and the last {split['cut']['val_tokens']} tokens of {split['cut']['document']}) of a 50,257-token "
        f"vocabulary (gpt2) in {tmp_path / 'd'}\n"
    )
    assert abs(val - 0.2 * (train + val)) <= 0.5


QA = [
    [{"role": "user", "content": f"What is {i} plus {i}?"}, {"role": "assistant", "content": f"{2 * i}."}]
    for i in range(10)
]


def test_prepare_chat_writes_conversations_and_says_what(tmp_path, capsys, monkeypatch):
    import json

    import numpy as np

    write_conversations(tmp_path / "qa.jsonl", QA)
    code, out, err = run(
        capsys,
        "prepare",
        "--chat",
        str(tmp_path / "qa.jsonl"),
        "--out",
        str(tmp_path / "d"),
        "--val-fraction",
        "0.2",
        "--no-progress",
    )
    meta = json.loads((tmp_path / "d" / "meta.json").read_text())
    masks = [np.fromfile(tmp_path / "d" / f"{split}.mask.bin", dtype=np.uint8) for split in ("train", "val")]
    train, val = meta["train_tokens"], meta["val_tokens"]
    assert code == 0 and out == "" and meta["chat"]["conversations"] == {"train": 8, "val": 2}
    assert err == (
        f"gpt2: 8 training and 2 validation conversations ({train:,} and {val:,} tokens, {int(masks[0].sum())} and "
        f"{int(masks[1].sum())} of them in replies; {val / (train + val):.2%} for validation; the longest "
        f"{meta['chat']['longest']} tokens) of a 50,257-token vocabulary (gpt2) in {tmp_path / 'd'}\n"
    )
    text = "".join(json.dumps({"messages": m}) + "\n" for m in QA)  # standard input, another template
    (tmp_path / "t.jinja").write_text(
        "{% for m in messages %}{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}"
    )
    code, _, err = run(
        capsys,
        "prepare",
        "--chat",
        "-",
        "--out",
        str(tmp_path / "d"),
        "--chat-template",
        str(tmp_path / "t.jinja"),
        "--overwrite",
        "--no-progress",
        stdin=text.encode(),
        monkeypatch=monkeypatch,
    )
    assert code == 0 and "9 training and 1 validation conversations" in err
    assert (
        json.loads((tmp_path / "d" / "meta.json").read_text())["chat"]["template"] == (tmp_path / "t.jinja").read_text()
    )


@pytest.mark.parametrize(
    "line, args, message",
    [
        ("not json", [], "IN, line 2: not a JSON object (Expecting value: line 1 column 1 (char 0))"),
        (
            '{"text": "hi"}',
            [],
            'IN, line 2: a conversation is an object {"messages": [...]}, got an object with the keys text',
        ),
        (
            '{"messages": [{"role": "user", "content": "hi"}]}',
            [],
            "IN, line 2: the conversation has no assistant message",
        ),
        (
            '{"messages": [{"role": "robot", "content": "hi"}]}',
            [],
            "IN, line 2: messages[0].role must be one of system, user, assistant, got 'robot'",
        ),
        (
            '{"messages": [{"role": "user", "content": 7}]}',
            [],
            "IN, line 2: messages[0].content must be a string, got 7",
        ),
        (
            '{"messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]}',
            ["--chat-template", "T"],
            "IN, line 2: T failed to render (line 2): no system messages (--chat-template)",
        ),
        (None, ["--chat-template", "NOWHERE"], "cannot read the chat template NOWHERE: no such file (--chat-template)"),
        ("", [], "IN holds no conversations"),  # blank lines only
        (None, ["--val-fraction", "0.5"], "1 conversation cannot be split whole into training and validation"),
        (None, ["--tokenizer", "char"], "the char tokenizer (--tokenizer) cannot hold a conversation"),
        (
            None,
            ["--shard-tokens", "100"],
            "--chat reads JSON Lines files of conversations into train.bin and val.bin: --shard-tokens does not apply",
        ),
        (None, ["--text-field", "body", "--split", "test"], "--text-field, --split do not apply"),
    ],
)
def test_prepare_chat_errors_are_one_line(tmp_path, capsys, line, args, message):
    write_conversations(tmp_path / "in.jsonl", QA[:1] if line != "" else [])
    if line is not None:
        with open(tmp_path / "in.jsonl", "a") as f:
            f.write(line + "\n")
    (tmp_path / "t.jinja").write_text(
        "{% for m in messages %}\n{% if m['role'] == 'system' %}{{ raise_exception('no system messages') }}"
        "{% endif %}{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}"
    )
    names = {"IN": tmp_path / "in.jsonl", "T": tmp_path / "t.jinja", "NOWHERE": tmp_path / "nowhere.jinja"}
    args = [str(names.get(a, a)) for a in args]
    code, out, err = run(
        capsys, "prepare", "--chat", str(tmp_path / "in.jsonl"), *args, "--out", str(tmp_path / "d"), "--no-progress"
    )
    for name, path in names.items():
        message = message.replace(name, str(path))
    assert code == 2 and out == "" and err.startswith("gpt2: error: ") and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["IN", "--chat-template", "t.jinja"], "--chat-template is the template of conversations: add --chat"),
        (["--chat"], 'give JSON Lines files of conversations ({"messages": [...]} a line), or - for standard input'),
    ],
)
def test_prepare_chat_flags_that_do_not_go_together(tmp_path, capsys, args, message):
    (tmp_path / "in.txt").write_text("some text here", encoding="utf-8")
    args = [str(tmp_path / "in.txt") if a == "IN" else a for a in args]
    code, _, err = run(capsys, "prepare", *args, "--out", str(tmp_path / "d"), "--no-progress")
    assert code == 2 and err == f"gpt2: error: {message}\n" and not (tmp_path / "d").exists()


def test_prepare_and_train_into_an_unwritable_out_say_so_in_one_line(tmp_path, forks):
    """One case each (a process costs seconds): tests/test_files.py, test_data_tokens.py and
    test_training_train.py hold the others."""
    from gpt2.data.text import prepare

    (tmp_path / "in.txt").write_text(
        "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 20, encoding="utf-8"
    )
    prepare([tmp_path / "in.txt"], tmp_path / "data", "char", progress=False)
    (tmp_path / "a-file").write_text("x")
    on_linux = Path("/proc/self").is_dir()
    train_out = Path("/proc/gpt2-out") if on_linux else tmp_path / "a-file" / "out"
    train_reason = (
        "/proc takes no new files or directories (no such file or directory)"
        if on_linux
        else f"{tmp_path / 'a-file'} is a file, not a directory"
    )
    tiny = [
        "--n-layer",
        "1",
        "--n-head",
        "1",
        "--n-embd",
        "8",
        "--block-size",
        "8",
        "--max-iters",
        "1",
        "--device",
        "cpu",
    ]
    cases = [
        (
            ["prepare", str(tmp_path / "in.txt"), "--no-progress", "--out", str(tmp_path / "a-file")],
            f"cannot write into {tmp_path / 'a-file'}: {tmp_path / 'a-file'} is a file, not a directory",
        ),
        (
            ["train", "--data", str(tmp_path / "data"), *tiny, "--out", str(train_out)],
            f"cannot write into {train_out}: {train_reason}",
        ),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    for command, message in cases:
        result = subprocess.run([forks.command, *command], env=env, capture_output=True, text=True, timeout=120)
        assert (result.returncode, result.stderr) == (2, f"gpt2: error: {message}\n")


def test_warnings_are_one_line_each(tmp_path, forks):
    """The BPE trainer runs out of pairs on a small corpus: one line, no Python warning with a source path."""
    (tmp_path / "in.txt").write_text("to be or not to be, that is the question\n" * 30, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    command = [
        forks.command,
        "prepare",
        str(tmp_path / "in.txt"),
        "--out",
        str(tmp_path / "d"),
        "--tokenizer",
        "bpe:30000",
        "--no-progress",
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    lines = result.stderr.splitlines()
    assert (
        result.returncode == 0 and len(lines) == 2 and lines[1].startswith("gpt2: ") and "validation tokens" in lines[1]
    )
    assert re.fullmatch(
        r"gpt2: warning: the corpus ran out of pairs to merge after \d+ merges: the vocabulary has \d+ ids, "
        r"not 30000",
        lines[0],
    )


def test_a_warning_of_generate_is_one_line(capsys, model_dir):
    code, out, err = run(capsys, "generate", "", "--model", model_dir, "--max-new-tokens", "2", "--seed", "0")
    assert code == 0 and out
    warning, summary = err.splitlines()
    assert warning == "gpt2: warning: empty prompt: generating from <|endoftext|>, as GPT-2's unconditional samples do"
    assert summary.startswith("[gpt2: 2 tokens in ")


# ------------------------------------------------------------------ gpt2 eval


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 8, encoding="utf-8")
    return path


def test_eval_json_is_one_object_equal_to_the_api(capsys, model_dir, text_file):
    import json

    from gpt2 import GPT2
    from gpt2.evaluation.evaluate import evaluate_file

    code, out, err = run(
        capsys, "eval", str(text_file), "--model", model_dir, "--context", "32", "--stride", "8", "--json"
    )
    assert code == 0 and out.count("\n") == 1
    expected = evaluate_file(GPT2.from_pretrained(model_dir, device="cpu"), text_file, context=32, stride=8).to_dict()
    assert json.loads(out) == expected and list(json.loads(out)) == ["tokens", "loss", "perplexity", "bits_per_byte"]
    assert "perplexity: 100%" in err  # the progress bar


def test_eval_prints_a_line_per_measure(capsys, model_dir, text_file):
    code, out, err = run(capsys, "eval", str(text_file), "--model", model_dir, "--no-progress")
    assert code == 0 and err == ""
    assert [line.split()[0] for line in out.splitlines()] == ["tokens", "loss", "perplexity", "bits_per_byte"]


def test_eval_prepared_data_and_tasks(capsys, model_dir, tmp_path, text_file, monkeypatch):
    import json

    import gpt2.data.files
    import gpt2.evaluation.evaluate

    assert main(["prepare", str(text_file), "--out", str(tmp_path / "d"), "--no-progress"]) == 0
    opened = []  # open_data reads every id to check it: the directory is opened once, before the model loads
    counted = lambda path: opened.append(path) or open_data(path)  # noqa: E731
    open_data = gpt2.data.files.open_data
    monkeypatch.setattr(gpt2.data.files, "open_data", counted)
    monkeypatch.setattr(gpt2.evaluation.evaluate, "open_data", counted)
    code, out, _ = run(capsys, "eval", "--data", str(tmp_path / "d"), "--model", model_dir, "--json")
    assert code == 0 and json.loads(out)["tokens"] > 0 and opened == [str(tmp_path / "d")]
    lambada = tmp_path / "lambada_test.jsonl"
    lambada.write_text(
        "".join(json.dumps({"text": f"example number {i} ends here"}) + "\n" for i in range(5)), encoding="utf-8"
    )
    code, out, _ = run(
        capsys, "eval", "--task", "lambada", "--data", str(lambada), "--limit", "3", "--model", model_dir, "--json"
    )
    assert (
        code == 0
        and list(json.loads(out)) == ["task", "examples", "acc", "perplexity"]
        and json.loads(out)["examples"] == 3
    )
    hellaswag = tmp_path / "hellaswag_val.jsonl"
    hellaswag.write_text(
        json.dumps({"ctx": "A man", "endings": ["runs.", "sits.", "eats.", "sleeps."], "label": 1}) + "\n",
        encoding="utf-8",
    )
    code, out, _ = run(capsys, "eval", "--task", "hellaswag", "--data", str(hellaswag), "--model", model_dir, "--json")
    assert code == 0 and list(json.loads(out)) == ["task", "examples", "acc", "acc_norm"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["EMPTY"], "empty.txt is empty: there is nothing to evaluate"),
        (["LATIN1"], "latin1.txt is not UTF-8 text: byte 0xe9 at offset 3"),
        (["ONE"], "one.txt is 1 id long: perplexity needs at least 2"),
        (["nowhere.txt"], "nowhere.txt does not exist"),
        (
            ["TEXT", "--context", "65"],
            "--context must be a number of ids up to the model's n_ctx=64, i.e. from 2 to 64, got 65",
        ),
        (["TEXT", "--context", "1"], "--context must be a number of ids from 2 up, got 1"),
        (["TEXT", "--stride", "0"], "--stride must be a number of ids from 1 up, got 0"),
        (
            ["TEXT", "--context", "16", "--stride", "17"],
            "--stride must be a number of ids up to the context (16), i.e. from 1 to 16, got 17",
        ),
        (["TEXT", "--batch-size", "0"], "--batch-size must be a positive integer, got 0"),
        (["--task", "mmlu"], "argument --task: invalid choice: 'mmlu' (choose from "),
        (["--task", "lambada", "--data", "BADLINE"], "bad.jsonl, line 2: not JSON"),
        (["--task", "hellaswag", "--data", "BADLINE"], 'bad.jsonl, line 1: expected {"ctx": text'),
        (["--task", "lambada", "--limit", "0"], "--limit must be a positive integer, got 0"),
        (["--task", "lambada"], "lambada is not in the cache"),
        ([], "give one thing to evaluate: a text FILE, --data DIR (a prepared directory's val.bin), or --task NAME"),
        (["TEXT", "--data", "somewhere"], "give one thing to evaluate"),
        (["TEXT", "--task", "lambada"], "give a FILE or --task, not both"),
        (["TEXT", "--limit", "3"], "--limit counts the examples of a --task"),
        (["--data", "nowhere"], "--data 'nowhere' does not exist"),
    ],
)
def test_eval_bad_input_is_one_line_and_exit_2(capsys, model_dir, tmp_path, text_file, args, message):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "latin1.txt").write_bytes("Caf\xe9".encode("latin-1"))
    (tmp_path / "one.txt").write_text("a", encoding="utf-8")
    (tmp_path / "bad.jsonl").write_text('{"text": "two words"}\n{"text": \n', encoding="utf-8")
    names = {"EMPTY": "empty.txt", "LATIN1": "latin1.txt", "ONE": "one.txt", "BADLINE": "bad.jsonl"}
    args = [str(text_file) if a == "TEXT" else str(tmp_path / names[a]) if a in names else a for a in args]
    code, out, err = run(capsys, "eval", *args, "--model", model_dir, "--no-progress")
    assert (code, out) == (2, "")
    assert err.startswith("gpt2: error: ") and err.count("\n") == 1 and message in err


@pytest.mark.parametrize(
    "command", [["generate", "Hi", "--max-new-tokens", "2"], ["eval", "FILE"], ["train", "--out", "OUT"]]
)
def test_threads_sets_torchs_thread_count(command, capsys, tmp_path, monkeypatch):
    """--threads N: on a busy machine, fewer threads than cores (torch's threads wait for each other)."""
    import torch

    make_hf_model(vocab_size=50257, n_positions=16, n_embd=16, n_layer=1, n_head=2).save_pretrained(tmp_path / "m")
    (tmp_path / "text.txt").write_text("Some text to score, long enough to have a few windows of ids.")
    argv = [{"FILE": str(tmp_path / "text.txt"), "OUT": str(tmp_path / "out")}.get(a, a) for a in command]
    chosen = []
    monkeypatch.setattr(torch, "set_num_threads", chosen.append)  # the test's own threads stay as they are
    code = main([*argv, "--threads", "1"] + (["--model", str(tmp_path / "m")] if command[0] != "train" else []))
    assert chosen == [1]
    assert code == (2 if command[0] == "train" else 0)  # train: no --data, but the threads were set first
    assert main([*argv, "--threads", "0"]) == 2
    assert "gpt2: error: --threads must be a positive integer, got 0" in capsys.readouterr().err


def kv_cache_bytes(rows: int, positions: int, n_layer: int = 2, n_embd: int = 48, n_vocab: int = 50257) -> int:
    """float32 keys and values of every layer for each position of each row, and a decoding
    step's logits, probabilities and sort for each row: the memory gpt2 must find first."""
    return rows * (2 * n_layer * positions * n_embd * 4 + 3 * n_vocab * 4)


def test_generate_refuses_samples_whose_kv_cache_cannot_fit(capsys, model_dir, monkeypatch):
    from gpt2 import devices
    from gpt2.generation.decoding import Request

    monkeypatch.setattr(devices, "available_memory", lambda device: 10_000_000)  # 10 MB left
    needed = kv_cache_bytes(200, 1 + 50)  # "Hi" is one token, then 50 new ones
    code, out, err = run(capsys, "generate", "Hi", "--model", model_dir, "--num-samples", "200")
    assert (code, out) == (2, "")
    assert err == (
        f"gpt2: error: a KV cache of 200 rows of 51 positions needs about {needed / 1e6:.1f} MB of memory, but the "
        f"CPU has 10.0 MB available: generate fewer samples at once: a smaller --num-samples\n"
    )
    # refused before a row of the ten million is made (making them took 32 s)
    monkeypatch.setattr(Request, "rows", lambda request: pytest.fail(f"{request.slots:,} rows made before the refusal"))
    code, out, err = run(capsys, "generate", "Hi", "--model", model_dir, "--num-samples", "10000000")
    assert code == 2 and err.startswith("gpt2: error: a KV cache of 10,000,000 rows")


def test_generate_warns_of_samples_that_may_not_fit_and_goes_on(capsys, model_dir, monkeypatch):
    from gpt2 import devices

    needed = kv_cache_bytes(200, 1 + 2)
    monkeypatch.setattr(devices, "available_memory", lambda device: int(needed / 1.1))  # a little short: within 1.25x
    code, out, err = run(
        capsys, "generate", "Hi", "--model", model_dir, "--num-samples", "200", "--max-new-tokens", "2", "--no-stream"
    )
    assert code == 0 and out.count("sample 200 of 200") == 1
    assert err.startswith(
        f"gpt2: warning: a KV cache of 200 rows of 3 positions needs about {needed / 1e6:.1f} MB of memory, "
        f"but the CPU has {int(needed / 1.1) / 1e6:.1f} MB available, so it may not fit: generate fewer "
        f"samples at once: a smaller --num-samples\n"
    )


def test_train_refuses_a_batch_no_machine_holds_in_one_line(capsys, tmp_path, monkeypatch):
    """--batch-size 100000000 once ran 90 s and was killed by the kernel at 24 GB: now refused before
    anything is made."""
    import gpt2.training.train
    from gpt2.data.text import prepare

    (tmp_path / "input.txt").write_text("To be, or not to be, that is the question.\n" * 50, encoding="utf-8")
    prepare([tmp_path / "input.txt"], tmp_path / "data", "char", progress=False)
    monkeypatch.setattr(
        gpt2.training.train, "build_model", lambda *args: pytest.fail("a model was built before the refusal")
    )
    code, out, err = run(
        capsys,
        "train",
        "--data",
        str(tmp_path / "data"),
        "--out",
        str(tmp_path / "out"),
        "--batch-size",
        "100000000",
        "--n-layer",
        "2",
        "--n-head",
        "2",
        "--n-embd",
        "32",
        "--block-size",
        "16",
    )
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert err.startswith("gpt2: error: training needs about ") and " TB of memory, but the CPU has " in err
    assert "lower --batch-size (or --block-size): a micro-batch of 100,000,000 windows of 16 tokens " in err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ the library's messages and the CLI's flags


def test_the_cli_adds_the_flags_of_the_parameters_a_message_names(capsys, tmp_path):
    """The library's messages name its parameters (resume, max_iters); the command line adds the flag of each."""
    from gpt2.data.text import prepare

    (tmp_path / "in.txt").write_text(
        "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 20, encoding="utf-8"
    )
    prepare([tmp_path / "in.txt"], tmp_path / "data", "char", progress=False)
    out = str(tmp_path / "out")
    code, _, err = run(capsys, "train", "--out", out, "--resume", "--overwrite")
    assert (code, err) == (2, "gpt2: error: --resume and --overwrite contradict each other: pick one\n")
    code, _, err = run(capsys, "train", "--out", out, "--resume")
    assert code == 2 and err.endswith("(start a run without --resume)\n")
    tiny = ["--n-layer", "1", "--n-head", "1", "--n-embd", "8", "--block-size", "8", "--device", "cpu", "--no-progress"]
    code, _, err = run(capsys, "train", "--data", str(tmp_path / "data"), "--out", out, "--max-iters", "1", *tiny)
    assert code == 0  # the warning of a warm-up as long as the run: a GPT2Warning with its parameters
    assert err.startswith("gpt2: warning: --warmup-iters 2000 is not below --max-iters 1: ")
    assert " of lr (--lr) 0.0006), and never decays; pass a smaller --warmup-iters\n" in err
    code, _, err = run(capsys, "train", "--data", str(tmp_path / "data"), "--out", out, "--max-iters", "1", *tiny)
    assert code == 2 and err.endswith(": pass --resume to continue it, or --overwrite to start over\n")
    code, _, err = run(capsys, "train", "--out", out, "--resume", "--block-size", "16")
    assert code == 2 and err.startswith("gpt2: error: --block-size is 16, but the run was started with 8: ")
    assert err.endswith("; start a new run with --overwrite instead\n")


# (argv, the flag its one line names): a wrong value of each command's flags, refused before any model loads
WRONG_FLAGS = [
    (["generate", "Hi", "--temperature", "-1"], "--temperature"),
    (["generate", "Hi", "--top-k", "0"], "--top-k"),
    (["generate", "Hi", "--top-p", "0"], "--top-p"),
    (["generate", "Hi", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["generate", "Hi", "--num-samples", "0"], "--num-samples"),
    (["generate", "Hi", "--seed", "-1"], "--seed"),
    (["generate", "Hi", "--stop", ""], "--stop"),
    (["generate", "Hi", "--device", "tpu"], "--device"),
    (["generate", "Hi", "--draft-model", "MODEL", "--draft-tokens", "0"], "--draft-tokens"),
    (["generate", "Hi", "--draft-model", "CHARS"], "--draft-model"),  # another vocabulary: its config.json says so
    (["chat", "--temperature", "-1"], "--temperature"),
    (["chat", "--top-k", "0"], "--top-k"),
    (["chat", "--top-p", "2"], "--top-p"),
    (["chat", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["chat", "--seed", "-1"], "--seed"),
    (["chat", "--device", "tpu"], "--device"),
    (["inspect", "a", "--temperature", "-1"], "--temperature"),  # drawn with --png only, and checked always
    (["inspect", "a", "--top-p", "2"], "--top-p"),
    (["inspect", "a", "--top-k", "0"], "--top-k"),
    (["inspect", "a", "--device", "tpu"], "--device"),
    (["eval", "TEXT", "--context", "1"], "--context"),
    (["eval", "TEXT", "--stride", "0"], "--stride"),
    (["eval", "TEXT", "--context", "16", "--stride", "17"], "--stride"),
    (["eval", "TEXT", "--batch-size", "0"], "--batch-size"),
    (["eval", "--task", "lambada", "--limit", "0"], "--limit"),
    (["eval", "--data", "NOWHERE"], "--data"),
    (["eval", "TEXT", "--device", "tpu"], "--device"),
    (["serve", "--max-batch-size", "0"], "--max-batch-size"),
    (["serve", "--max-num-batched-tokens", "4"], "--max-batch-size"),
    (["serve", "--max-n", "0"], "--max-n"),
    (["serve", "--max-queue", "0"], "--max-queue"),
    (["serve", "--max-inspect-cells", "0"], "--max-inspect-cells"),
    (["serve", "--max-patching-tokens", "0"], "--max-patching-tokens"),
    (["serve", "--prefix-cache-mb", "-1"], "--prefix-cache-mb"),
    (["serve", "--port", "99999"], "--port"),
    (["serve", "--device", "tpu"], "--device"),
    (["serve", "--draft-model", "CHARS"], "--draft-model"),
    (["prepare", "TEXT", "--out", "OUT", "--val-fraction", "2"], "--val-fraction"),
    (["prepare", "TEXT", "--out", "OUT", "--tokenizer", "bpe:12"], "--tokenizer"),
    (["prepare", "TEXT", "--out", "OUT", "--shard-tokens", "0"], "--shard-tokens"),
    (["train", "--out", "OUT", "--data", "NOWHERE", "--lr", "-1"], "--lr"),
    (["train", "--out", "OUT", "--data", "NOWHERE", "--batch-size", "0"], "--batch-size"),
    (["train", "--out", "OUT", "--data", "NOWHERE", "--resume", "--overwrite"], "--overwrite"),
    (["train", "--out", "OUT", "--data", "NOWHERE", "--init", "gpt2", "--n-layer", "2"], "--n-layer"),
    (
        ["train", "--out", "OUT", "--data", "NOWHERE", "--muon-lr", "0.02"],
        "--optimizer muon",
    ),  # was "pass optimizer='muon'"
    (["train", "--out", "OUT", "--data", "NOWHERE", "--warmup-iters", "-1"], "--warmup-iters"),
]


@pytest.fixture(scope="module")
def chars_dir(tmp_path_factory):
    """A character model (65 ids), as a draft of another vocabulary than GPT-2's."""
    from gpt2.tokenizer import CharTokenizer

    directory = tmp_path_factory.mktemp("chars")
    make_hf_model(vocab_size=65, n_positions=32, n_embd=32, n_layer=1, n_head=2).save_pretrained(directory)
    CharTokenizer([chr(c) for c in range(32, 97)]).save(directory)
    return str(directory)


@pytest.mark.parametrize("argv, flag", WRONG_FLAGS, ids=[" ".join(a[:1] + a[-2:]) for a, _ in WRONG_FLAGS])
def test_a_wrong_flag_is_refused_before_the_model_loads_in_one_line_that_names_it(
    argv, flag, capsys, monkeypatch, model_dir, chars_dir, tmp_path, text_file
):
    """No model loads (a load fails the test), so a wrong value is said at once, not after a minute of
    loading; the line names the flag, never the library's parameter (top_k, resume=True)."""
    from gpt2.model.model import GPT2
    from gpt2.reference import ReferenceModel

    def loaded(*args, **kwargs):
        pytest.fail("the model loaded before the flags were checked")

    monkeypatch.setattr(GPT2, "from_pretrained", loaded)
    monkeypatch.setattr(ReferenceModel, "load", loaded)
    paths = {
        "MODEL": model_dir,
        "CHARS": chars_dir,
        "TEXT": str(text_file),
        "OUT": str(tmp_path / "out"),
        "NOWHERE": str(tmp_path / "no"),
    }
    argv = [paths.get(a, a) for a in argv]
    model = ["--model", model_dir] if argv[0] in ("generate", "chat", "inspect", "eval", "serve") else []
    code, out, err = run(capsys, *argv, *model, stdin=b"", monkeypatch=monkeypatch)
    line = err.replace(str(tmp_path), "DIR").replace(model_dir, "MODEL").replace(chars_dir, "CHARS")
    assert (code, out) == (2, "") and line.startswith("gpt2: error: ") and line.count("\n") == 1, err
    assert flag in line and "=True" not in line and not re.search(r"\b[a-z]+(?:_[a-z0-9]+)+\b", line), (
        line
    )  # no snake_case name


def test_a_bound_that_needs_the_model_names_the_flag_once_it_has_loaded(capsys, model_dir):
    """--top-k's bound is the vocabulary; inspect's library check calls it k, the command --top-k."""
    for argv in (["inspect", "a"], ["generate", "Hi"]):
        code, out, err = run(capsys, *argv, "--top-k", "50258", "--model", model_dir)
        assert (code, out, err) == (
            2,
            "",
            "gpt2: error: --top-k must be an integer from 1 to 50257, the model's vocabulary size, got 50258\n",
        )


def test_no_library_message_names_a_flag_of_the_cli():
    """Only gpt2.cli speaks of gpt2's flags: the library names its parameters, and the CLI names their flags."""
    import argparse
    import ast

    from gpt2.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices.values()
    flags = {
        flag
        for p in (parser, *commands)
        for action in p._actions
        for flag in action.option_strings
        if flag.startswith("--")
    }
    assert {"--max-iters", "--overwrite", "--max-batch-size", "--version"} <= flags
    # the C compiler's flag, asked of the compiler; the server's flag, in the 400 of chat without a template
    # (no CLI between)
    not_messages = {("kernels.py", "--version"), ("server.py", "--chat-template")}
    found = []
    for path in sorted((REPO / "src" / "gpt2").rglob("*.py")):
        if path.parent.name == "cli":  # the command line's own package
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        documented = [
            n
            for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        ]
        docstrings = {id(n.body[0].value) for n in documented if n.body and isinstance(n.body[0], ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                named = set(re.findall(r"--[a-z][a-z0-9-]*", node.value)) & flags
                found += [
                    f"{path.name}:{node.lineno}: {flag}" for flag in named if (path.name, flag) not in not_messages
                ]
    assert not found, f"library strings name gpt2's flags (name the parameter; the CLI names its flag): {found}"


# ------------------------------------------------------------------ train: recipes and loggers


@pytest.fixture
def recipe_dir(tmp_path, monkeypatch):
    """A directory with prepared characters in data/ and a recipe of a tiny run, gpt2 running in it."""
    from gpt2.data.text import prepare

    (tmp_path / "in.txt").write_text(
        "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 20, encoding="utf-8"
    )
    prepare([tmp_path / "in.txt"], tmp_path / "data", "char", progress=False)
    (tmp_path / "tiny.toml").write_text(
        'data = "data"\nout = "out-tiny"\nn-layer = 1\nn_head = 1\nn_embd = 8\nblock_size = 8\n'
        'batch_size = 2\ngrad_accum = 1\nmax_iters = 50\nwarmup_iters = 0\neval_iters = 1\ndevice = "cpu"\n'
    )
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_train_takes_a_recipe_and_the_flags_given_override_it(capsys, recipe_dir):
    from gpt2.training.loggers import read_log

    code, _, err = run(capsys, "train", "--recipe", "tiny.toml", "--max-iters", "2", "--no-progress")
    assert code == 0 and "its model in out-tiny " in err
    [settings] = [r["settings"] for r in read_log(recipe_dir / "out-tiny" / "log.jsonl") if "settings" in r]
    assert (
        settings["max_iters"] == 2
        and settings["n_layer"] == 1
        and settings["n_embd"] == 8
        and settings["data"] == "data"
    )
    assert settings["lr_decay_iters"] == 2 and settings["lr"] == 6e-4  # what the recipe leaves out: the defaults
    # a resume takes the recipe too: its values must be the run's, as flags' must
    code, _, err = run(capsys, "train", "--recipe", "tiny.toml", "--resume", "--max-iters", "3", "--no-progress")
    assert code == 0 and "gpt2: resuming from iteration 2" in err
    (recipe_dir / "tiny.toml").write_text((recipe_dir / "tiny.toml").read_text().replace("n_embd = 8", "n_embd = 16"))
    code, _, err = run(capsys, "train", "--recipe", "tiny.toml", "--resume", "--max-iters", "4")
    assert code == 2 and err.startswith("gpt2: error: --n-embd is 16, but the run was started with 8: ")


@pytest.mark.parametrize(
    "recipe, flags, message",
    [
        (
            "max_iter = 5\n",
            [],
            "has an unknown key 'max_iter' (did you mean max_iters?); the keys are the settings' names: ",
        ),
        (
            "lr = 1e-3\nmax_iters 5\n",
            [],
            "is not valid TOML: Expected '=' after a key in a key/value pair (at line 2, column 11)",
        ),
        ('max_iters = "5"\n', [], "sets max_iters (--max-iters) to '5', a str: max_iters must be an integer\n"),
        (
            None,
            [],
            "no recipe (--recipe) 'tiny.toml': give a TOML file, or one of gpt2's recipes: finetune_shakespeare, ",
        ),
        ('data = "data"\n', [], "the following arguments are required: --out (or out in the recipe)\n"),
        (
            'data = "data"\nout = "o"\n',
            ["--tensorboard", "tb"],
            "--tensorboard needs the tensorboard package: pip install 'gpt2[tensorboard]'\n",
        ),
        (
            'data = "data"\nout = "o"\n',
            ["--wandb", "p"],
            "--wandb needs the wandb package: pip install 'gpt2[wandb]'\n",
        ),
    ],
)
def test_train_bad_recipes_and_missing_loggers_are_one_line_and_exit_2(
    capsys, tmp_path, monkeypatch, recipe, flags, message
):
    monkeypatch.chdir(tmp_path)
    if recipe is not None:
        (tmp_path / "tiny.toml").write_text(recipe)
    monkeypatch.setitem(sys.modules, "wandb", None)  # neither logger's package installed: importing it fails
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    code, out, err = run(capsys, "train", "--recipe", "tiny.toml", *flags)
    assert (code, out) == (2, "") and err.count("\n") == 1 and err.startswith("gpt2: error: ")
    assert message in err and not (tmp_path / "o").exists()


# ------------------------------------------------------------------ gpt2 chat


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    """A tiny model saved with gpt2's default chat template, and transformers' model and tokenizer of it."""
    from transformers import AutoTokenizer

    from gpt2.tokenizer import Tokenizer
    from gpt2.tokenizer.chat import DEFAULT_TEMPLATE

    directory = tmp_path_factory.mktemp("chat")
    hf = make_hf_model(seed=4, vocab_size=50257, n_positions=64, n_embd=48, n_layer=2, n_head=3)
    hf.save_pretrained(directory)
    Tokenizer.gpt2().with_chat_template(DEFAULT_TEMPLATE).save_pretrained(directory)
    return str(directory), hf, AutoTokenizer.from_pretrained(directory)


def transformers_chat_reply(chat_dir, messages, n):
    """transformers' greedy reply of n tokens on apply_chat_template's ids, less the default template's
    space after "Assistant:"."""
    import torch

    _, hf, tokenizer = chat_dir
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=50256, eos_token_id=None)
    text = tokenizer.decode(out[0, len(ids) :])
    return text[1:] if text.startswith(" ") else text


def test_gpt2_chat_streams_replies_that_continue_the_history_and_resets(chat_dir, capsys, monkeypatch):
    stdin = "Hi there\nAnd then?\n/reset\n\nHi there\n"
    code, out, err = run(
        capsys,
        "chat",
        "--model",
        chat_dir[0],
        "--temperature",
        "0",
        "--max-new-tokens",
        "5",
        "--system",
        "Be brief.",
        "--device",
        "cpu",
        stdin=stdin.encode(),
        monkeypatch=monkeypatch,
    )
    assert code == 0, err
    system = {"role": "system", "content": "Be brief."}
    first = transformers_chat_reply(chat_dir, [system, {"role": "user", "content": "Hi there"}], 5)
    second = transformers_chat_reply(
        chat_dir,
        [
            system,
            {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": first},
            {"role": "user", "content": "And then?"},
        ],
        5,
    )
    assert out == f"{first}\n{second}\n{first}\n"  # after /reset, the first turn again; the empty line is no message
    assert err == "gpt2: the conversation starts over\n"


def test_gpt2_chat_leaves_out_the_oldest_turns_and_refuses_a_message_too_long_in_one_line(
    chat_dir, capsys, monkeypatch
):
    stdin = "".join("word " * 11 + f"{turn}\n" for turn in range(4)) + "word " * 60 + "\nHi\n"
    code, out, err = run(
        capsys,
        "chat",
        "--model",
        chat_dir[0],
        "--temperature",
        "0",
        "--max-new-tokens",
        "10",
        "--device",
        "cpu",
        stdin=stdin.encode(),
        monkeypatch=monkeypatch,
    )
    assert code == 0 and len(out.splitlines()) == 5  # four replies, then (the long message refused) the reply to Hi
    lines = err.splitlines()
    assert re.fullmatch(r"gpt2: the \d+ oldest messages are left out, to fit the model's context", lines[0]), err
    assert re.fullmatch(
        r"gpt2: error: the message does not fit: the conversation is \d+ tokens with it alone, and a reply of up to 10 "
        r"tokens makes \d+ more than the model's context of 64: send a shorter message, or give a lower "
        r"--max-new-tokens",
        lines[-1],
    ), err


def test_gpt2_chat_fits_its_default_reply_to_a_small_context(chat_dir, capsys, monkeypatch):
    """A context of 64 tokens: the default reply is half of it, 32 tokens, not 256 (which no message would fit)."""
    code, out, err = run(
        capsys,
        "chat",
        "--model",
        chat_dir[0],
        "--temperature",
        "0",
        "--device",
        "cpu",
        stdin=b"Hi there\n",
        monkeypatch=monkeypatch,
    )
    assert (code, err) == (0, "") and out == transformers_chat_reply(
        chat_dir, [{"role": "user", "content": "Hi there"}], 32
    ) + "\n"


def test_gpt2_chat_refuses_at_once_a_system_message_or_a_reply_that_leaves_no_room(chat_dir, capsys, monkeypatch):
    for flags, message in [
        (
            ["--system", "word " * 40],
            r"--system does not fit: with it and an empty message the conversation is \d+ tokens, and a reply "
            r"of up to 32 tokens makes \d+ more than the model's context of 64: give a shorter system "
            r"message, or a lower --max-new-tokens",
        ),
        (
            ["--max-new-tokens", "64"],
            r"--max-new-tokens must be a number of tokens below the model's context \(64\), i.e. from 1 to 63, "
            r"got 64",
        ),
    ]:  # before: exit 0, and every message refused
        code, out, err = run(
            capsys, "chat", "--model", chat_dir[0], *flags, "--device", "cpu", stdin=b"Hi\n", monkeypatch=monkeypatch
        )
        assert (code, out) == (2, "") and re.fullmatch(f"gpt2: error: {message}\n", err), err


def test_gpt2_chat_refusals_are_one_line(chat_dir, model_dir, capsys, monkeypatch, tmp_path):
    (tmp_path / "bad.jinja").write_text("{% if %}", encoding="utf-8")
    for argv, message in [
        (
            ["--model", model_dir],
            "the model's tokenizer has no chat template, so it cannot hold a conversation: "
            "give one with --chat-template (a Jinja2 file",
        ),
        (
            ["--model", str(tmp_path / "no-model"), "--chat-template", str(tmp_path / "bad.jinja")],
            f"{tmp_path / 'bad.jinja'} is not a valid template: ",
        ),
        (["--model", chat_dir[0], "--temperature", "-1"], "--temperature must be a finite number >= 0"),
    ]:
        code, out, err = run(capsys, "chat", *argv, "--device", "cpu", stdin=b"Hi\n", monkeypatch=monkeypatch)
        assert code == 2 and out == "" and err.startswith(f"gpt2: error: {message}") and err.count("\n") == 1, err


@pytest.mark.parametrize("flags, lacking", [(["--json-object"], "'{'"), (["--choice", "{x}"], "'{x}'")])
def test_a_constraint_the_shipped_character_model_cannot_write_is_one_line(capsys, flags, lacking):
    """shakespeare_char has no "{": refused before generating, one line naming it, exit 2 (was a
    traceback from sampling an empty distribution)."""
    code, out, err = run(capsys, "generate", "--model", "shakespeare_char", "A:", *flags, "--no-stream")
    assert (code, out) == (2, "")
    assert (
        err == f"gpt2: error: {flags[0]}: its text must begin {lacking}, "
        "and the model's vocabulary (65 tokens) has no '{'\n"
    )
