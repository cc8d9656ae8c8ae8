"""`gpt2 inspect` (gpt2.cli.inspect): each token's probability, the walk through a forward pass, the head scores and
activation patching, against transformers' values."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest
from cli_helpers import run
from helpers import REPO, assert_walk_equals_transformers, head_score_written_out

if TYPE_CHECKING:
    import torch


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


def test_inspect_walk_json_prints_the_walk_with_transformers_values_and_the_merges(
    capsys, model_dir, tiktoken_gpt2, tmp_path
):
    import json

    from transformers import GPT2LMHeadModel

    pictures = tmp_path / "pics"
    code, out, err = run(
        capsys,
        "inspect",
        "Hello, world",
        "--model",
        model_dir,
        "--walk",
        "--json",
        "--top-k",
        "4",
        "--png",
        str(pictures),
    )
    assert code == 0 and "gpt2: wrote 4 pictures" in err and len(list(pictures.glob("*.png"))) == 4  # --png as ever
    answer = json.loads(out)
    assert answer["ids"] == tiktoken_gpt2.encode("Hello, world") and len(answer["next"]) == 4
    assert_walk_equals_transformers(
        answer, GPT2LMHeadModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    )
    assert [w["merges"][-1] for w in answer["bpe"]] == [["Hello"], [","], ["Ġworld"]]


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


# ------------------------------------------------------------------ a model that comes with no tokenizer: token ids

INDUCTION_2L = str(REPO / "tests" / "fixtures" / "induction_2l")  # trained here: 64 ids, no tokenizer
REPEATED = [3, 14, 15, 9, 26, 3, 14, 15]


def test_inspect_ids_of_a_model_with_no_tokenizer_give_transformers_log_probabilities(capsys):
    import json
    import math

    code, out, err = run(capsys, "inspect", "--ids", ",".join(map(str, REPEATED)), "--model", INDUCTION_2L, "--json")
    assert code == 0 and err == ""
    got = json.loads(out)
    expected = hf_log_probabilities(INDUCTION_2L, REPEATED)
    assert got["ids"] == REPEATED and got["tokens"] is None
    assert max(abs(got["logprobs"][t] - expected[t - 1, REPEATED[t]].item()) for t in range(1, len(REPEATED))) < 1e-4
    assert [[e["id"] for e in top] for top in got["top"]] == expected.topk(5).indices.tolist()
    code, out, _ = run(capsys, "inspect", "--ids", " ".join(map(str, REPEATED)), "--model", INDUCTION_2L)
    lines = out.splitlines()
    assert code == 0 and [line.split()[:2] for line in lines[1 : 1 + len(REPEATED)]] == [
        ["id", str(i)] for i in REPEATED
    ]
    best = expected[-1].argmax().item()
    assert lines[-1].split()[1:4] == ["id", str(best), f"{math.exp(expected[-1, best].item()):.1%},"]
    code, out, _ = run(capsys, "inspect", "--ids", "3 14 15", "--model", INDUCTION_2L, "--walk")
    assert code == 0 and "ids = [3, 14, 15]" in out and "the next token after id 15: id " in out


def test_inspect_heads_and_the_induction_experiment_need_no_tokenizer(capsys):
    """--heads --repeat N (random ids of the model's vocabulary, no <|endoftext|> to start from) and --heads on
    --ids give transformers' head scores; the induction experiment runs, and finds the head the model learned."""
    import json

    import torch

    half = torch.randint(0, 64, (20,), generator=torch.Generator().manual_seed(0)).tolist()  # the documented seed
    for flags, ids in ((["--repeat", "20"], half + half), (["--ids", "3,14,15,9,26,3,14,15"], REPEATED)):
        capsys.readouterr()  # transformers' progress bars
        code, out, err = run(capsys, "inspect", "--heads", *flags, "--model", INDUCTION_2L, "--json")
        assert code == 0 and err == ""
        got, expected = json.loads(out), hf_head_scores(INDUCTION_2L, ids)
        for kind in KINDS:
            assert max(abs(a - b) for r, e in zip(got[kind], expected[kind]) for a, b in zip(r, e)) < 1e-4, kind
    assert max(max(row) for row in expected["induction"]) > 0.5  # the tables compared are not all zeros
    capsys.readouterr()
    code, out, _ = run(capsys, "inspect", "--heads", "--repeat", "20", "--model", INDUCTION_2L)
    assert code == 0 and out.splitlines()[0] == "head scores on 20 random tokens written twice (seed 0, 40 tokens)"
    code, out, err = run(capsys, "inspect", "--experiment", "induction", "--model", INDUCTION_2L)
    top = out.splitlines()[-1]
    assert code == 0 and top.startswith("top heads (induction score on ")
    assert top.split("): ")[1].startswith("1.")  # a layer-1 head: the model grew two, 1.0 and 1.1


def test_inspect_patching_on_ids_gives_transformers_logit_differences(capsys):
    import json

    clean, corrupted = [3, 14, 15, 9, 26, 3, 14], [3, 14, 15, 9, 26, 7, 14]
    code, out, err = run(
        capsys,
        "inspect",
        "--ids",
        "--corrupted",
        " ".join(map(str, corrupted)),
        ",".join(map(str, clean)),
        "--answer",
        "15",
        "--other",
        "9",
        "--model",
        INDUCTION_2L,
        "--json",
    )
    assert code == 0 and err == ""
    got = json.loads(out)
    assert (got["answer"], got["other"], got["ids"], got["tokens"]) == (15, 9, clean, None)
    for name, ids in (("clean", clean), ("corrupted", corrupted)):
        last = hf_log_probabilities(INDUCTION_2L, ids)[-1]
        assert abs(got["logit_diff"][name] - float(last[15] - last[9])) < 1e-4
    assert abs(got["activation"][0][5] - got["logit_diff"]["clean"]) < 1e-4  # the one embedding that differs


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["3 14 15"],
            'the text needs one; give token ids with --ids (e.g. gpt2 inspect --ids "0 1 2"), or run --heads '
            "--repeat N",
        ),
        (["--heads", "a b a"], "the text needs one; give token ids with --ids"),
        (["--corrupted", "a b", "a c"], "the texts need one; give token ids with --ids"),
        (
            ["--experiment", "ioi"],
            "the ioi experiment's prompts are text, and the model INDUCTION comes with no tokenizer to read them: "
            "on token ids, run --experiment induction or --heads --repeat N",
        ),
        (["--ids", "3 x"], "the text (--ids) must be token ids, whole numbers separated by spaces or commas"),
        (["--ids", "3 64"], "token id 64"),
        (["--ids"], "no token ids: give them"),
        (["--ids", "--corrupted", "3 4", "3 5", "--answer", " Mary"], "--answer (--ids) must be token ids"),
    ],
)
def test_inspect_what_needs_a_tokenizer_is_refused_in_one_line(capsys, argv, message):
    code, out, err = run(capsys, "inspect", *argv, "--model", INDUCTION_2L)
    message = message.replace("INDUCTION", INDUCTION_2L)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("gpt2: error: ") and message in err, err
    if "needs one" in message or "need one" in message:
        assert f"the model {INDUCTION_2L} comes with no tokenizer" in err


def test_inspect_prepend_bos_runs_the_text_after_endoftext(capsys, model_dir, tiktoken_gpt2):
    import json

    text = "The dog chased the cat"
    code, out, err = run(capsys, "inspect", text, "--model", model_dir, "--json", "--prepend-bos")
    assert code == 0 and err == ""
    ids = [50256, *tiktoken_gpt2.encode(text)]  # TransformerLens's to_tokens, by default
    got = json.loads(out)
    assert got["ids"] == ids
    expected = hf_log_probabilities(model_dir, ids)
    assert max(abs(got["logprobs"][t] - expected[t - 1, ids[t]].item()) for t in range(1, len(ids))) < 1e-4


@pytest.mark.parametrize("site", ["head_v", "resid_mid"])
def test_inspect_corrupted_patches_the_new_sites_as_the_python_api(capsys, model_dir, tiktoken_gpt2, site):
    import json

    import torch

    from gpt2 import GPT2
    from gpt2.inspect import activation_patching, logit_diff

    clean, corrupted = "When Mary and John went out, John gave it to", "When Mary and John went out, Mary gave it to"
    mary, john = (tiktoken_gpt2.encode(name)[0] for name in (" Mary", " John"))
    argv = ["--corrupted", corrupted, clean, "--answer", " Mary", "--other", " John", "--site", site, "--json"]
    code, out, err = run(capsys, "inspect", *argv, "--model", model_dir)
    assert code == 0, err
    model = GPT2.from_pretrained(model_dir)
    expected = activation_patching(model, clean, corrupted, logit_diff(mary, john), site)
    assert torch.allclose(torch.tensor(json.loads(out)["activation"]), expected, atol=1e-5)


def test_inspect_graph_writes_circuit_tracers_files(capsys, model_dir, tmp_path):
    import json

    from helpers import circuit_tracer_layer, write_circuit_tracer

    from gpt2 import GPT2
    from gpt2.inspect import attribution_graph, load_transcoders

    layers = {i: circuit_tracer_layer(i, False, True, d_model=48, b_enc=-0.8) for i in range(2)}
    write_circuit_tracer(tmp_path / "tc", layers)
    text = "The dog chased the"
    flags = ["--transcoders", str(tmp_path / "tc"), "--model", model_dir, "--slug", "dog", "--node-threshold", "0.6"]
    code, out, err = run(
        capsys, "inspect", "--graph", str(tmp_path / "out"), *flags, "--png", str(tmp_path / "png"), text
    )
    assert code == 0 and err == ""
    assert (tmp_path / "png" / "dog.png").stat().st_size > 10_000  # figures.attribution_graph of the file
    model = GPT2.from_pretrained(model_dir, device="cpu")
    graph = attribution_graph(model, text, load_transcoders(tmp_path / "tc"))
    expected = graph.to_json("dog", scan=str(tmp_path / "tc"), node_threshold=0.6)
    assert json.loads((tmp_path / "out" / "dog.json").read_text()) == expected
    index = json.loads((tmp_path / "out" / "graph-metadata.json").read_text())
    assert index == {"graphs": [expected["metadata"]]}
    replacement, completeness = graph.scores()
    summary = f"{len(expected['nodes'])} nodes and {len(expected['links'])} links kept of {len(graph.adjacency)}"
    assert summary in out and f"replacement score {replacement:.3f}, completeness {completeness:.3f}" in out
    assert f"top logit {graph.logit_texts[0]!r}" in out


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--graph", "OUT"], "--graph needs --transcoders"),
        (["--transcoders", "TC"], "--transcoders is read by --graph"),
        (["--graph", "OUT", "--transcoders", "TC", "--sae", "x"], "give it without --sae"),
        (["--graph", "OUT", "--transcoders", "MISSING"], "MISSING"),
        (["--graph", "OUT", "--transcoders", "TC", "--node-threshold", "2"], "--node-threshold must be a number"),
        (["--graph", "OUT", "--transcoders", "TC", "--ids"], "--ids"),
    ],
)
def test_inspect_graph_errors(capsys, model_dir, tmp_path, flags, message):
    from helpers import circuit_tracer_layer, write_circuit_tracer

    write_circuit_tracer(tmp_path / "tc", {i: circuit_tracer_layer(i, False, False, d_model=48) for i in range(2)})
    names = {"OUT": str(tmp_path / "out"), "TC": str(tmp_path / "tc"), "MISSING": str(tmp_path / "missing")}
    code, out, err = run(capsys, "inspect", *[names.get(f, f) for f in flags], "--model", model_dir, "The dog")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert message.replace("MISSING", names["MISSING"]) in err
