"""`gpt2 train` (gpt2.cli.train): recipes and the flags that override them, loggers, and a batch refused before
anything is made (training itself: tests/training/)."""

from __future__ import annotations

import sys

import pytest
from cli_helpers import run


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


@pytest.mark.parametrize("flags, auto_resume", [([], None), (["--auto-resume"], True), (["--no-auto-resume"], False)])
def test_train_passes_auto_resume_on_off_or_unsaid(capsys, tmp_path, monkeypatch, flags, auto_resume):
    """--auto-resume is train()'s auto_resume, not a setting of the run; unsaid, train() decides (on under torchrun)."""
    import gpt2.training.train
    from gpt2.training.train import TrainResult

    called = {}

    def fake_train(out, **kwargs):
        called.update(kwargs)
        return TrainResult(out, 1, 2.0, None, False)

    monkeypatch.setattr(gpt2.training.train, "train", fake_train)
    code, _, _ = run(capsys, "train", "--data", "d", "--out", str(tmp_path / "out"), *flags)
    assert code == 0 and called["auto_resume"] is auto_resume
    assert {k: v for k, v in called.items() if k not in ("resume", "overwrite", "auto_resume", "progress")} == {
        "data": "d"
    }
