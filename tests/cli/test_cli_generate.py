"""`gpt2 generate` (gpt2.cli.generate): what it prints is what the Python API generates, streamed or not, with its
samples, drafts, constraints and penalties; Ctrl-C keeps what was printed; bad input is one line and exit 2."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
from cli_helpers import run
from helpers import REPO, Watched, heed_ctrl_c, make_hf_model, transformers_greedy, transformers_sampled


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
    # tqdm pads its last draw with spaces where an earlier one was longer (a slow first token: "s/tok")
    assert re.match(r"generating: 100%\|█+\| 50/50 \[[0-9:]+<00:00, +[0-9.]+tok/s\] *\n\[gpt2: 50 tokens in ", bar), (
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


# ------------------------------------------------------------------ --ids: token ids in, token ids out

INDUCTION_2L = str(REPO / "tests" / "fixtures" / "induction_2l")  # trained here: 64 ids, no tokenizer
PROMPT_IDS = [3, 14, 15, 9, 26, 3, 14]


@pytest.fixture(scope="module")
def induction_hf():
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel.from_pretrained(INDUCTION_2L).eval()  # the same file, read by transformers


def test_generate_ids_of_a_model_with_no_tokenizer_are_transformers(capsys, monkeypatch, induction_hf):
    """Greedy, streamed (the prompt's ids, then the new ones) and sampled with the one seed rule (sample i from
    seed + i), not streamed, from standard input: transformers' ids."""
    greedy = transformers_greedy(induction_hf, PROMPT_IDS, 10)
    argv = ["generate", "--ids", "--model", INDUCTION_2L, "--max-new-tokens", "10"]
    capsys.readouterr()  # transformers' progress bar
    code, out, err = run(capsys, *argv, "3,14,15,9,26,3,14", "--temperature", "0")
    assert code == 0 and out == " ".join(map(str, PROMPT_IDS + greedy)) + "\n"
    assert err.startswith("[gpt2: 10 tokens in ")
    sampling = ["--temperature", "1.5", "--top-k", "64", "--seed", "7", "--num-samples", "2", "--no-stream"]
    code, out, _ = run(
        capsys, *argv, "-", *sampling, "--no-progress", stdin=b"3 14 15 9 26 3 14\n", monkeypatch=monkeypatch
    )
    samples = [line for line in out.splitlines() if not line.startswith("=")]
    expected = [transformers_sampled(induction_hf, PROMPT_IDS, 10, seed, temperature=1.5) for seed in (7, 8)]
    assert code == 0 and samples == [" ".join(map(str, ids)) for ids in expected] and expected[0] != expected[1]


def test_generate_ids_of_a_model_with_a_tokenizer_are_the_text_api_s_tokens(capsys, model_dir, tiktoken_gpt2):
    ids = tiktoken_gpt2.encode("The dog")
    code, out, _ = run(
        capsys,
        "generate",
        "--ids",
        ",".join(map(str, ids)),
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
    assert tiktoken_gpt2.decode([int(i) for i in out.split()]) == expected_text(
        model_dir, "The dog", max_new_tokens=12, temperature=0
    )


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["3 14 15"],
            f"the model {INDUCTION_2L} comes with no tokenizer (encoder.json + vocab.bpe, or chars.json), and its "
            "vocabulary of 64 ids is not GPT-2's: a text prompt needs one; give token ids with --ids "
            '(e.g. gpt2 generate --ids "0 1 2")',
        ),
        (["--ids", "3 x"], "the prompt (--ids) must be token ids, whole numbers separated by spaces or commas"),
        (["--ids", " , "], "the prompt (--ids) holds no token ids"),
        (["--ids", "3 64"], "token id 64 in prompt 0 is out of range: ids are 0..63"),
        (["--ids"], 'no prompt: give token ids (e.g. gpt2 generate --ids "464 3290")'),
        (
            ["--ids", "3", "--stop", "x"],
            "--stop is text, which --ids has none of: the prompt and the output are token ids",
        ),
        (["--ids", "3", "--json-object"], "--json-object is text, which --ids has none of"),
    ],
)
def test_generate_what_needs_a_tokenizer_is_refused_in_one_line(capsys, flags, message):
    code, out, err = run(capsys, "generate", *flags, "--model", INDUCTION_2L)
    assert (code, out) == (2, "") and err.startswith(f"gpt2: error: {message}") and err.count("\n") == 1, err


def test_generate_steer_adds_the_features_decoder_directions(capsys, model_dir, tmp_path):
    """--steer against transformers' greedy text with each vector added by a forward hook (the directions read
    from the files written here: circuit-tracer's W_dec rows, SAELens's)."""
    import sae_lens
    import torch
    from helpers import circuit_tracer_layer, write_circuit_tracer
    from sae_lens.saes.sae import SAEMetadata
    from transformers import GPT2LMHeadModel

    from gpt2 import Tokenizer

    layers = {i: circuit_tracer_layer(i, False, False, d_model=48) for i in range(2)}
    write_circuit_tracer(tmp_path / "tc", layers)
    sae = sae_lens.StandardSAE(
        sae_lens.StandardSAEConfig(d_in=48, d_sae=16, metadata=SAEMetadata(hook_name="blocks.0.hook_resid_post"))
    )
    with torch.no_grad():
        sae.W_dec.normal_(generator=torch.Generator().manual_seed(0))
    sae.save_model(tmp_path / "sae")
    hf = GPT2LMHeadModel.from_pretrained(model_dir).eval()
    adds = {1: 30.0 * layers[1]["W_dec"][5], 0: -20.0 * sae.W_dec[3].detach()}
    handles = [
        hf.transformer.h[b].register_forward_hook(
            lambda m, a, out, v=v: (out[0] + v, *out[1:]) if isinstance(out, tuple) else out + v
        )
        for b, v in adds.items()
    ]
    enc = Tokenizer.gpt2()
    ids = enc.encode("The dog")
    expected = enc.decode(transformers_greedy(hf, ids, 10))
    for h in handles:
        h.remove()
    assert expected != enc.decode(transformers_greedy(hf, ids, 10))  # the steering changes the text
    flags = ["--model", model_dir, "--max-new-tokens", "10", "--temperature", "0", "--no-stream", "--no-progress"]
    steer = ["--steer", f"{tmp_path / 'tc'}:1:5:30", "--steer", f"{tmp_path / 'sae'}:3:-20"]
    code, out, _ = run(capsys, "generate", "The dog", *flags, *steer)
    assert code == 0 and out == expected + "\n"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("dir:x:1", "is not SAE_DIR:FEATURE:COEFF or TRANSCODERS_DIR:LAYER:FEATURE:COEFF"),
        ("MISSING:1:2", "MISSING"),
        ("TC:5:1:1.0", "layer"),
    ],
)
def test_generate_steer_errors(capsys, model_dir, tmp_path, spec, message):
    from helpers import circuit_tracer_layer, write_circuit_tracer

    write_circuit_tracer(tmp_path / "tc", {i: circuit_tracer_layer(i, False, False, d_model=48) for i in range(2)})
    names = {"MISSING": str(tmp_path / "missing"), "TC": str(tmp_path / "tc")}
    spec = spec.replace("MISSING", names["MISSING"]).replace("TC", names["TC"])
    code, out, err = run(capsys, "generate", "The dog", "--model", model_dir, "--steer", spec, "--no-progress")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert message.replace("MISSING", names["MISSING"]) in err
