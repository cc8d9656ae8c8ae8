"""The standard experiments (gpt2.inspect.experiments): their built-in data checked with tiktoken,
their metrics against transformers' logits on the same weights, the greater-than metric on
logits made by hand, and `gpt2 inspect --experiment` end to end."""

from __future__ import annotations

import re

import pytest
import torch
from helpers import hf_and_ours

from gpt2 import GPT2Config, GPT2Error
from gpt2.cli import main
from gpt2.inspect.experiments import (
    ABBA_TEMPLATES,
    BABA_TEMPLATES,
    NAMES,
    OBJECTS,
    PLACES,
    START_YEARS,
    YEARS,
    greater_than_prompt,
    ioi_prompts,
    probability_difference,
    run_experiment,
)
from gpt2.model.model import GPT2


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """transformers' tiny GPT-2 of GPT-2's vocabulary, and ours on its weights (GPT-2's tokenizer)."""
    directory = tmp_path_factory.mktemp("experiments")
    hf, ours = hf_and_ours(directory, seed=5, vocab_size=50257, n_positions=64, n_embd=32, n_layer=2, n_head=2)
    return hf, ours, str(directory)


# ------------------------------------------------------------------ the data


def test_the_fifteen_templates_in_both_orders():
    assert len(BABA_TEMPLATES) == len(ABBA_TEMPLATES) == 15
    assert BABA_TEMPLATES[0] == "Then, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to"  # Wang et al.'s first
    for baba, abba in zip(BABA_TEMPLATES, ABBA_TEMPLATES):
        assert baba.count("[B]") == 2 and baba.count("[A]") == 1 and baba.endswith(" to")
        assert abba == baba.replace("[B] and [A]", "[A] and [B]", 1) and abba.index("[A]") < abba.index("[B]")


def test_names_places_objects_and_years_are_one_gpt2_token_each(tiktoken_gpt2):
    for word in (*NAMES, *PLACES, *OBJECTS):
        assert len(tiktoken_gpt2.encode(" " + word)) == 1, word
    assert len(set(NAMES)) == len(NAMES) >= 50
    for year in YEARS:  # "00".."99"
        assert len(tiktoken_gpt2.encode(year)) == 1, year
    for yy in START_YEARS:  # ... 17YY to the year 17: " 17" then "YY"
        ids = tiktoken_gpt2.encode(greater_than_prompt(yy))
        assert tiktoken_gpt2.decode(ids[-6:-4]) == f" 17{yy:02d}" and ids[-5] == tiktoken_gpt2.encode(f"{yy:02d}")[0]
    assert START_YEARS == tuple(range(2, 99))


def test_ioi_prompts_name_io_once_and_s_twice(tiktoken_gpt2):
    prompts = ioi_prompts()
    assert len(prompts) == 30 and len({p.text for p in prompts}) == 30
    for p in prompts:
        words = re.findall(r" \w+", p.text)
        assert words.count(p.io) == 1 and words.count(p.s) == 2 and p.io != p.s
        clean, corrupted = tiktoken_gpt2.encode(p.text), tiktoken_gpt2.encode(p.corrupted)
        assert len(clean) == len(corrupted)  # patching needs the same length
        differ = [i for i, (a, b) in enumerate(zip(clean, corrupted)) if a != b]
        assert (
            len(differ) == 1
            and clean[differ[0]] == tiktoken_gpt2.encode(p.s)[0]
            and corrupted[differ[0]] == tiktoken_gpt2.encode(p.io)[0]
        )
        assert differ[0] == max(i for i, t in enumerate(clean) if t == tiktoken_gpt2.encode(p.s)[0])  # the second S


def test_ioi_demo_is_transformer_lens_eight_prompts():
    demo = ioi_prompts("demo")
    assert len(demo) == 8 and all(p.bos for p in demo)
    assert (demo[0].text, demo[0].io, demo[0].s) == (
        "When John and Mary went to the shops, John gave the bag to",
        " Mary",
        " John",
    )
    assert (demo[1].text, demo[1].io, demo[1].s) == (
        "When John and Mary went to the shops, Mary gave the bag to",
        " John",
        " Mary",
    )
    assert (demo[7].text, demo[7].io, demo[7].s) == (
        "After Martin and Amy went to the park, Martin gave a drink to",
        " Amy",
        " Martin",
    )
    assert demo[0].corrupted == demo[1].text  # the demo's corruption: the prompt with the answers swapped


def test_probability_difference_on_hand_made_logits():
    logits = torch.full((120,), -1e9)
    year_ids = list(range(10, 110))  # "00".."99" at ids 10..109
    logits[[10 + 20, 10 + 60, 5]] = 0.0  # years 20 and 60, and one token that is no year: 1/3 each
    assert probability_difference(logits, year_ids, 10) == pytest.approx(2 / 3)  # both after 10
    assert probability_difference(logits, year_ids, 20) == pytest.approx(0.0)  # 60 after, 20 not (<= YY)
    assert probability_difference(logits, year_ids, 60) == pytest.approx(-2 / 3)


# ------------------------------------------------------------------ the metrics, against transformers


def hf_last_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0, -1].double()


def test_ioi_metrics_are_transformers_logit_difference_and_probability(models, tiktoken_gpt2):
    hf, ours, _ = models
    diffs, probs = [], []
    for p in ioi_prompts("demo"):
        logits = hf_last_logits(hf, [50256] + tiktoken_gpt2.encode(p.text))
        io, s = tiktoken_gpt2.encode(p.io)[0], tiktoken_gpt2.encode(p.s)[0]
        diffs.append(float(logits[io] - logits[s]))
        probs.append(float(logits.softmax(-1)[io]))
    result = run_experiment(ours, "ioi", form="demo", patch_prompts=2)
    assert result.metrics["logit_diff"] == pytest.approx(sum(diffs) / 8, abs=1e-4)
    assert result.metrics["io_prob"] == pytest.approx(sum(probs) / 8, abs=1e-6)
    assert result.heads.shape == (2, 2) and result.attribution.heads.shape == (2, 2)


def test_greater_than_metric_is_transformers_probability_difference(models, tiktoken_gpt2):
    hf, ours, _ = models
    year_ids = [tiktoken_gpt2.encode(y)[0] for y in YEARS]
    expected = []
    for yy in START_YEARS:
        p = hf_last_logits(hf, tiktoken_gpt2.encode(greater_than_prompt(yy))).softmax(-1)
        expected.append(
            sum(float(p[year_ids[y]]) for y in range(yy + 1, 100)) - sum(float(p[year_ids[y]]) for y in range(yy + 1))
        )
    result = run_experiment(ours, "greater-than", patch_prompts=2)
    assert result.metrics["prob_diff"] == pytest.approx(sum(expected) / len(expected), abs=1e-6)


def test_ioi_and_greater_than_need_gpt2s_tokenizer():
    model = GPT2(GPT2Config(n_vocab=64, n_ctx=32, n_embd=32, n_head=2, n_layer=2))  # no tokenizer
    for name in ("ioi", "greater-than"):
        with pytest.raises(
            GPT2Error, match=f"the {name} experiment needs a model with GPT-2's tokenizer, and tiny-char has no"
        ):
            run_experiment(model, name, model_name="tiny-char")
    with pytest.raises(GPT2Error, match="unknown experiment 'ioj': the experiments are induction, ioi, greater-than"):
        run_experiment(model, "ioj")
    assert run_experiment(model, "induction").heads.shape == (2, 2)  # induction needs no tokenizer


# ------------------------------------------------------------------ gpt2 inspect --experiment


def test_cli_experiment_prints_its_metrics_and_draws_its_pictures(models, capsys, tmp_path, tiktoken_gpt2):
    hf, _, directory = models
    assert main(["inspect", "--experiment", "ioi", "--model", directory, "--png", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    diffs = []
    for p in ioi_prompts():  # the 15 templates both ways, as the command runs them
        logits = hf_last_logits(hf, tiktoken_gpt2.encode(p.text))
        diffs.append(float(logits[tiktoken_gpt2.encode(p.io)[0]] - logits[tiktoken_gpt2.encode(p.s)[0]]))
    printed = float(re.search(r"^logit_diff +(\S+)$", out, re.M).group(1))
    assert printed == pytest.approx(sum(diffs) / len(diffs), abs=1e-4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ioi-attribution.png", "ioi-heads.png"]
    assert main(["inspect", "--experiment", "ioj", "--model", directory]) == 2
    assert "invalid choice: 'ioj'" in capsys.readouterr().err
    assert main(["inspect", "--experiment", "ioi", "--model", directory, "some text"]) == 2
    assert "--experiment runs on its own data: give no text" in capsys.readouterr().err


def test_induction_losses_are_transformers_on_the_repeated_sequence(models):
    hf, ours, _ = models
    from gpt2.inspect.circuits import repeated_tokens

    n = (64 - 1) // 2  # the context (64) holds <|endoftext|> and the two copies
    ids = repeated_tokens(n, 50257, seed=0, start=50256)
    with torch.no_grad():
        losses = torch.nn.functional.cross_entropy(
            hf(torch.tensor([ids])).logits[0, :-1], torch.tensor(ids[1:]), reduction="none"
        )
    result = run_experiment(ours, "induction")
    # loss[t] predicts ids[t + 1]: the first copy is ids[1..n], the repeat ids[n+1..2n];
    # each copy's first token left out
    assert result.metrics["loss_first_half"] == pytest.approx(float(losses[1:n].mean()), abs=1e-4)
    assert result.metrics["loss_repeated_half"] == pytest.approx(float(losses[n + 1 : 2 * n].mean()), abs=1e-4)


def test_attribution_of_lists_of_tokens_sums_to_transformers_mean_logit_difference(models, tiktoken_gpt2):
    hf, ours, _ = models
    from gpt2.inspect.circuits import logit_attribution

    ids = tiktoken_gpt2.encode(greater_than_prompt(32))
    year_ids = [tiktoken_gpt2.encode(y)[0] for y in YEARS]
    logits = hf_last_logits(hf, ids)
    parts = logit_attribution(ours, ids, year_ids[33:], year_ids[:33])  # the years after 32 against the others
    expected = float(logits[year_ids[33:]].mean() - logits[year_ids[:33]].mean())
    assert parts.total == pytest.approx(expected, abs=1e-4)
    assert float(parts.heads.sum() + parts.mlps.sum() + parts.biases.sum()) + parts.embed == pytest.approx(
        expected, abs=1e-4
    )
    with pytest.raises(GPT2Error, match="answer must be a token or a non-empty list of tokens"):
        logit_attribution(ours, ids, [], year_ids[:33])
