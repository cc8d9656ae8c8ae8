"""`gpt2 train-sae` (gpt2.cli.train_sae): dictionaries trained from the command line, saved where SAELens, gpt2
and circuit-tracer's layout read them, its lines equal to the run's metrics, and its errors one line each."""

from __future__ import annotations

import json

import pytest
from cli_helpers import run

FLAGS = ["--steps", "4", "--batch-size", "64", "--context", "16", "--eval-interval", "2", "--expansion", "2"]


def test_train_sae_writes_saelens_and_reports_each_evaluation(capsys, model_dir, gpt2_data, tmp_path):
    from gpt2.inspect import load_sae

    out = tmp_path / "sae"
    code, stdout, err = run(
        capsys,
        "train-sae",
        "--model",
        model_dir,
        "--data",
        str(gpt2_data),
        "--site",
        "blocks.1.hook_resid_mid",
        "--architecture",
        "topk",
        "--k",
        "4",
        "--out",
        str(out),
        *FLAGS,
    )
    assert code == 0 and f"wrote {out}" in err
    record = json.loads((out / "training.json").read_text())
    lines = stdout.strip().splitlines()
    assert [int(line.split()[1]) for line in lines] == [m["step"] for m in record["metrics"]] == [2, 4]
    d = record["metrics"][-1]["dictionaries"][0]
    assert f"L0 {d['l0']:.1f}, explained variance {d['explained_variance']:.3f}" in lines[-1]
    assert lines[-1].split()[2:5] == ["h.1.resid_mid", "->", "h.1.resid_mid:"]
    sae = load_sae(out / "saelens")
    assert sae.d_sae == 2 * 48 and sae.hook_name == "blocks.1.hook_resid_mid"


def test_train_sae_transcoders_for_the_graph(capsys, model_dir, gpt2_data, tmp_path):
    from gpt2.inspect import load_transcoders

    out = tmp_path / "tc"
    code, stdout, _ = run(
        capsys,
        "train-sae",
        "--model",
        model_dir,
        "--data",
        str(gpt2_data),
        "--transcoders",
        "--skip",
        "--architecture",
        "jumprelu",
        "--out",
        str(out),
        *FLAGS,
    )
    assert code == 0 and len(stdout.strip().splitlines()) == 2 * 2  # two evaluations of two blocks
    a, b = load_transcoders(out / "circuit-tracer"), load_transcoders(out / "saelens")
    assert len(a) == len(b) == 2 and a[0].W_skip is not None and a.input_step == "ln_2"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--site", "h.1", "--skip"], "--skip is a transcoder's"),
        (["--site", "h.0.attn.pattern"], "--site 'h.0.attn.pattern' is not one"),
        (["--site", "h.1", "--out", "EXISTS"], "already exists"),
        (["--site", "h.1", "--data", "MISSING"], "does not exist"),
        (["--site", "h.1", "--architecture", "topk", "--k", "500"], "--k 500 is more than"),
    ],
)
def test_train_sae_errors(capsys, model_dir, gpt2_data, tmp_path, flags, message):
    (tmp_path / "exists").mkdir()
    (tmp_path / "exists" / "f").write_text("x")
    names = {"EXISTS": str(tmp_path / "exists"), "MISSING": str(tmp_path / "missing")}
    flags = [names.get(f, f) for f in flags]
    base = ["--model", model_dir, "--data", str(gpt2_data), "--out", str(tmp_path / "out"), *FLAGS]
    code, out, err = run(capsys, "train-sae", *base, *flags)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and message in err
