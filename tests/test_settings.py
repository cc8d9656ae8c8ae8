"""TrainSettings: a run's settings checked by name, the architecture they give, what a resume may
change, and recipes (settings in TOML files)."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import pytest
from helpers import REPO

from gpt2 import InvalidArgumentError, RecipeError, RecipeNotFoundError
from gpt2.checkpoints.config import GPT2Config
from gpt2.settings import (
    RESUME_OVERRIDES,
    TrainSettings,
    check_setting_names,
    read_recipe,
    recipe_keys,
    recipe_names,
    resumed_settings,
)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(batch_size=0), "batch_size must be a positive integer, got 0"),
        (dict(grad_accum=-1), "grad_accum must be a positive integer, got -1"),
        (dict(max_iters=0), "max_iters must be a positive integer, got 0"),
        (dict(lr=0.0), "lr must be a positive number, got 0.0"),
        (dict(lr=float("nan")), "lr must be a positive number"),
        (dict(n_layer=0), "n_layer must be a positive integer, got 0"),
        (dict(block_size=-4), "block_size must be a positive integer, got -4"),
        (dict(dropout=1.0), r"dropout must be a number in \[0, 1\)"),
        (dict(beta2=1.0), r"beta2 must be a number in \[0, 1\)"),
        (dict(config="gpt5"), "config must be one of gpt2, gpt2-medium, gpt2-large, gpt2-xl"),
        (dict(compile="yes"), "compile must be one of auto, on, off"),
        (dict(dtype="int8"), "dtype must be one of auto, float32, bfloat16, float16, got 'int8'"),
        (dict(positions="rotary"), "positions must be one of learned, sinusoidal, got 'rotary'"),
        (dict(timeout=0), "timeout must be a positive number, got 0"),
        (dict(fsdp="yes"), "fsdp must be True or False, got 'yes'"),
        (dict(checkpoint_activations=1), "checkpoint_activations must be True or False, got 1"),
        (dict(init="gpt2", n_layer=3), "init: the architecture comes from the model being fine-tuned; drop n_layer"),
        (dict(eval_task="mmlu"), "eval_task must be one of hellaswag, got 'mmlu'"),
        (dict(eval_task="hellaswag", eval_task_limit=0), "eval_task_limit must be a positive integer, got 0"),
        (dict(eval_task="hellaswag", eval_task_limit=2.5), "eval_task_limit must be a positive integer, got 2.5"),
        (dict(eval_task="hellaswag", eval_task_limit=True), "eval_task_limit must be a positive integer, got True"),
        (dict(eval_task="hellaswag", eval_task_data=3), "eval_task_data must be a path, got 3"),
        (
            dict(eval_task_limit=100),
            r"eval_task_limit is a setting of eval_task, which is not set: give eval_task too \(or drop "
            r"eval_task_limit\)",
        ),
        (dict(eval_task_limit=100, eval_task_data="h.jsonl"), r"\(or drop eval_task_limit and eval_task_data\)"),
    ],
)
def test_bad_settings_are_named(changes, message):
    with pytest.raises(InvalidArgumentError, match=message) as e:
        TrainSettings(data="unused", **changes)
    if "eval_task" in str(e.value):
        assert e.value.param == str(e.value).split()[0]  # the setting the message starts with


def test_the_architecture_of_a_run_from_scratch():
    """nanoGPT's choices (no biases, the exact GELU) by default, GPT-2's with a released shape."""
    assert TrainSettings(data="d", n_layer=2, block_size=64).model_config(65) == GPT2Config(
        n_vocab=65, n_ctx=64, n_layer=2, n_head=12, n_embd=768, dropout=0.0, bias=False, activation="gelu"
    )
    assert TrainSettings(data="d", config="gpt2-medium").model_config(50257) == GPT2Config(
        n_layer=24, n_head=16, n_embd=1024, dropout=0.0, bias=True, activation="gelu_tanh"
    )
    with pytest.raises(InvalidArgumentError, match=r"n_embd \(30\) must be divisible by n_head \(4\)"):
        TrainSettings(data="d", n_embd=30, n_head=4).model_config(65)


def test_a_resume_changes_only_what_leaves_the_losses_alone():
    stored = TrainSettings(data="d", max_iters=10, lr=1e-3, min_lr=1e-4).to_dict()
    del stored["timeout"]  # a setting added since the run started takes its default
    resumed = resumed_settings(stored, {"max_iters": 20, "eval_interval": 5, "lr": 1e-3})
    assert (resumed.max_iters, resumed.eval_interval, resumed.lr, resumed.timeout) == (20, 5, 1e-3, 600.0)
    assert resumed.lr_decay_iters == 10  # fixed when the run started
    with pytest.raises(
        InvalidArgumentError, match=r"lr is 0.01, but the run was started with 0.001: a resumed run keeps"
    ) as e:
        resumed_settings(stored, {"lr": 1e-2})
    assert (e.value.param, e.value.also) == ("lr", ("overwrite",))
    assert set(RESUME_OVERRIDES) <= set(stored) | {"timeout"}


def test_unknown_setting_names_are_named():
    """The names a run is given (gpt2.training.train.train checks them, once, as they come in)."""
    with pytest.raises(InvalidArgumentError, match=re.escape("unknown training setting(s): learning_rate, n_layers")):
        check_setting_names(["n_layer", "n_layers", "learning_rate"])
    check_setting_names(f.name for f in dataclasses.fields(TrainSettings))


def test_a_resume_may_start_stop_or_change_the_eval_task():
    """A benchmark scored at each evaluation leaves the losses alone: a resume may change it."""
    stored = TrainSettings(data="d", eval_task="hellaswag", eval_task_limit=100).to_dict()
    assert (resumed_settings(stored, {}).eval_task, resumed_settings(stored, {}).eval_task_limit) == ("hellaswag", 100)
    resumed = resumed_settings(stored, {"eval_task_limit": 500, "eval_task_data": "h.jsonl"})
    assert (resumed.eval_task, resumed.eval_task_limit, resumed.eval_task_data) == ("hellaswag", 500, "h.jsonl")
    assert resumed_settings(stored, {"eval_task": None, "eval_task_limit": None}).eval_task is None
    fresh = TrainSettings(data="d").to_dict()
    del fresh["eval_task"], fresh["eval_task_limit"], fresh["eval_task_data"]  # a run started before they existed
    assert resumed_settings(fresh, {"eval_task": "hellaswag"}).eval_task == "hellaswag"


def test_the_settings_import_without_torch():
    """The command line offers the dtype names and the settings' defaults before torch is loaded."""
    code = "import sys, gpt2.settings; assert 'torch' not in sys.modules"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr.decode()


# ------------------------------------------------------------------ recipes


@pytest.mark.parametrize("name", recipe_names())
def test_every_shipped_recipe_builds_valid_settings(name):
    settings = read_recipe(name)
    assert settings.pop("out").startswith("out-") and settings["data"].startswith("data/")
    TrainSettings(**settings)  # raises on a bad value


@pytest.mark.parametrize("name", recipe_names())
def test_a_recipe_prepares_its_data_from_what_gpt2_ships(name):
    """The `gpt2 prepare` its comment gives reads a corpus gpt2 ships (no input.txt the docs never made) or
    draws synthetic data gpt2 makes (--synthetic KIND), into the recipe's data; a recipe without one names
    the other project's script that makes its data."""
    from gpt2.data.synthetic import SYNTHETIC
    from gpt2.examples import CORPORA

    text = (REPO / "recipes" / f"{name}.toml").read_text(encoding="utf-8")
    commands = [line.split() for line in re.findall(r"^#\s+gpt2 prepare (.+?)\s*(?:#.*)?$", text, re.M)]
    assert commands or re.search(r"^#\s+python \S+\.py", text, re.M), name
    for args in commands:
        assert args.count("--out") == 1 and args[args.index("--out") + 1] == read_recipe(name)["data"], (name, args)
        at = args.index("--out")
        rest = args[:at] + args[at + 2 :]  # the command less --out OUT
        if "--synthetic" in rest:
            assert rest == ["--synthetic", rest[1]] and rest[1] in SYNTHETIC, (name, args)
        else:
            assert rest[0] in CORPORA, (name, args)
    if name == "induction_2l":  # the one recipe of synthetic data, checked here
        assert commands == [["--out", "data/induction_2l", "--synthetic", "induction"]]


def test_the_shipped_recipes_are_the_peers_settings():
    """Each against its source, as written there (nanoGPT's configs and README, llm.c's script)."""
    char = read_recipe("shakespeare_char")
    assert {
        k: char[k]
        for k in (
            "n_layer",
            "n_head",
            "n_embd",
            "block_size",
            "batch_size",
            "max_iters",
            "lr",
            "min_lr",
            "warmup_iters",
            "beta2",
            "dropout",
            "eval_interval",
            "eval_iters",
            "grad_accum",
        )
    } == dict(
        n_layer=4,
        n_head=4,
        n_embd=128,
        block_size=64,
        batch_size=12,
        max_iters=2000,
        lr=1e-3,
        min_lr=1e-4,
        warmup_iters=100,
        beta2=0.99,
        dropout=0.0,
        eval_interval=250,
        eval_iters=20,
        grad_accum=1,
    )
    owt = read_recipe("gpt2_124m_owt")
    assert owt["batch_size"] * owt["block_size"] * owt["grad_accum"] == 12 * 1024 * 5 * 8  # 491,520 tokens a step
    fineweb = read_recipe("gpt2_124m_fineweb")
    assert fineweb["batch_size"] * fineweb["block_size"] * fineweb["grad_accum"] == 524288  # llm.c's -d
    assert (fineweb["max_iters"], fineweb["warmup_iters"], fineweb["min_lr"], fineweb["lr"]) == (18865, 700, 0.0, 6e-4)
    assert sorted(p.stem for p in (REPO / "recipes").glob("*.toml")) == recipe_names()  # the repository's recipes/


def test_a_recipe_takes_the_flags_names_with_dashes_or_underscores(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('max-iters = 5\nlr = 1\nout = "o"\nbias = true\nsample_prompt = "A"\n')
    assert read_recipe(recipe) == {"max_iters": 5, "lr": 1.0, "out": "o", "bias": True, "sample_prompt": "A"}
    assert isinstance(read_recipe(recipe)["lr"], float)  # an integer where a number goes: TOML's 1 is lr 1.0


@pytest.mark.parametrize(
    "text, error, message",
    [
        (
            "max_iter = 5\n",
            RecipeError,
            r"has an unknown key 'max_iter' \(did you mean max_iters\?\); the keys are the "
            r"settings' names: activation, batch_size, .*, max_iters, .*, out, .*, weight_decay$",
        ),
        ("lr = 1e-3\nmax_iters 5\n", RecipeError, r"is not valid TOML: .*\(at line 2, column 11\)$"),
        ('max_iters = "5"\n', RecipeError, r"sets max_iters to '5', a str: max_iters must be an integer$"),
        ("lr = true\n", RecipeError, r"sets lr to True, a bool: lr must be a number$"),
        ("n_layer = 2.0\n", RecipeError, r"sets n_layer to 2.0, a float: n_layer must be an integer$"),
        ("[model]\nn_layer = 2\n", RecipeError, r"has an unknown key 'model'"),
        ("max_iters = 5\nmax-iters = 6\n", RecipeError, r"sets max_iters twice$"),
    ],
)
def test_a_bad_recipe_is_named_with_its_file_and_key(tmp_path, text, error, message):
    recipe = tmp_path / "r.toml"
    recipe.write_text(text)
    with pytest.raises(error, match=rf"^the recipe {re.escape(str(recipe))} {message}"):
        read_recipe(recipe)


def test_a_missing_recipe_names_the_shipped_ones(tmp_path):
    with pytest.raises(
        RecipeNotFoundError,
        match=r"^no recipe '.*nothing.toml': give a TOML file, or one of gpt2's recipes: "
        r"finetune_shakespeare, gpt2_124m_fineweb, .*shakespeare_char",
    ):
        read_recipe(tmp_path / "nothing.toml")
    assert issubclass(RecipeNotFoundError, FileNotFoundError)


def test_a_setting_added_to_train_settings_is_a_recipe_key():
    """The keys come from TrainSettings' fields: another part's setting (a new optimizer) needs no list kept here."""
    keys = recipe_keys()
    assert set(keys) == {f.name for f in dataclasses.fields(TrainSettings)} | {"out"}
    assert (keys["max_iters"], keys["lr"], keys["bias"], keys["init"], keys["wandb"]) == (int, float, bool, str, str)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(wandb=""), "wandb must be a name"),
        (dict(tensorboard=3), "tensorboard must be a name"),
        (
            dict(wandb_run_name="x"),
            "wandb_run_name names a run of the Weights & Biases project given as wandb: give wandb too",
        ),
    ],
)
def test_bad_logger_settings_are_named(changes, message):
    with pytest.raises(InvalidArgumentError, match=message):
        TrainSettings(data="unused", **changes)
