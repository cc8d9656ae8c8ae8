"""The standard experiments (gpt2.inspect.experiments): their built-in data checked with tiktoken,
their metrics against transformers' logits on the same weights, the greater-than metric on
logits made by hand, and `gpt2 inspect --experiment` end to end."""

from __future__ import annotations

import re

import pytest
import torch
from helpers import hf_and_ours

from gpt2 import GPT2Config, GPT2Error, InvalidArgumentError
from gpt2.cli import main
from gpt2.inspect.experiments import (
    ABBA_TEMPLATES,
    BABA_TEMPLATES,
    CORRUPTIONS,
    NAMES,
    OBJECTS,
    PLACES,
    START_YEARS,
    YEARS,
    ExperimentResult,
    greater_than_prompt,
    ioi_prompts,
    probability_difference,
    readable,
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


# ------------------------------------------------------------------ IOI's corruptions (issue 53)


def name_positions(tokens: list[int], *names: int) -> list[int]:
    return [i for i, t in enumerate(tokens) if t in names]


@pytest.mark.parametrize("form", ["templates", "demo"])
def test_the_clean_prompts_are_the_same_whichever_the_corruption_and_s2_io_is_the_default(form):
    default = ioi_prompts(form)
    assert CORRUPTIONS == ("s2_io", "abc", "swap")
    assert ioi_prompts(form, corruption="s2_io") == default
    for corruption in ("abc", "swap"):
        prompts = ioi_prompts(form, corruption=corruption)
        assert [(p.text, p.io, p.s, p.bos) for p in prompts] == [(p.text, p.io, p.s, p.bos) for p in default]
        assert all(p.corrupted != d.corrupted for p, d in zip(prompts, default))


@pytest.mark.parametrize("form", ["templates", "demo"])
def test_abc_fills_the_three_name_slots_with_three_other_names(form, tiktoken_gpt2):
    names = {tiktoken_gpt2.encode(" " + name)[0] for name in NAMES}
    drawn = set()
    for p in ioi_prompts(form, per_template=2, corruption="abc"):
        clean, corrupted = tiktoken_gpt2.encode(p.text), tiktoken_gpt2.encode(p.corrupted)
        io, s = tiktoken_gpt2.encode(p.io)[0], tiktoken_gpt2.encode(p.s)[0]
        assert len(corrupted) == len(clean)  # patching needs the same length
        slots = name_positions(clean, io, s)  # IO once, S twice
        assert len(slots) == 3
        assert [i for i, (a, b) in enumerate(zip(clean, corrupted)) if a != b] == slots  # the rest is the template's
        new = [corrupted[i] for i in slots]
        assert len(set(new)) == 3 and not {io, s} & set(new) and set(new) <= names
        assert not name_positions(corrupted, io, s)  # neither IO nor S anywhere
        drawn |= set(new)
    assert len(drawn) > 12  # drawn at random, not one fixed trio


@pytest.mark.parametrize("form", ["templates", "demo"])
def test_swap_exchanges_io_and_s_so_the_answer_is_the_other_name(form, tiktoken_gpt2):
    for p in ioi_prompts(form, corruption="swap"):
        clean, corrupted = tiktoken_gpt2.encode(p.text), tiktoken_gpt2.encode(p.corrupted)
        io, s = tiktoken_gpt2.encode(p.io)[0], tiktoken_gpt2.encode(p.s)[0]
        assert corrupted == [s if t == io else io if t == s else t for t in clean]
        # the flipped prompt is an IOI prompt whose answer is the clean one's S: its IO appears
        # once, its S (the clean IO) twice, the last time just before " gave"/" said"/...
        words = re.findall(r" \w+", p.corrupted)
        assert words.count(p.s) == 1 and words.count(p.io) == 2
        assert [w for w in words if w in (p.io, p.s)][-1] == p.io
    demo = ioi_prompts("demo", corruption="swap")[0]
    assert demo.corrupted == "When Mary and John went to the shops, Mary gave the bag to"  # answer: John


def hf_metric(hf, ids: list[int], io: int, s: int, patch: tuple[int, int, torch.Tensor] | None = None):
    """logit(IO) - logit(S) at the last position by transformers, with head (layer, head)'s output
    (its slice of c_proj's input, at every position) replaced by the given one if `patch`; and
    every layer's c_proj input (B, T, C) from this run."""
    inputs, handles = {}, []
    for layer, block in enumerate(hf.transformer.h):

        def keep(module, args, layer=layer):
            x = args[0].clone()
            if patch is not None and patch[0] == layer:
                d = x.shape[-1] // hf.config.n_head
                x[..., patch[1] * d : (patch[1] + 1) * d] = patch[2][..., patch[1] * d : (patch[1] + 1) * d]
            inputs[layer] = x
            return (x,)

        handles.append(block.attn.c_proj.register_forward_pre_hook(keep))
    try:
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0, -1].double()
    finally:
        for handle in handles:
            handle.remove()
    return float(logits[io] - logits[s]), inputs


def test_ioi_patching_is_normalised_by_the_corruption_asked_for(models, tiktoken_gpt2):
    hf, ours, _ = models
    grids = {}
    for corruption in CORRUPTIONS:
        result = run_experiment(ours, "ioi", form="demo", patch_prompts=1, corruption=corruption)
        assert f"corrupted by {corruption}" in "; ".join(result.notes)
        p = ioi_prompts("demo", corruption=corruption)[0]  # the one prompt patched (the first)
        clean_ids, corrupted_ids = ([50256] + tiktoken_gpt2.encode(text) for text in (p.text, p.corrupted))
        io, s = tiktoken_gpt2.encode(p.io)[0], tiktoken_gpt2.encode(p.s)[0]
        clean, kept = hf_metric(hf, clean_ids, io, s)
        corrupted, _ = hf_metric(hf, corrupted_ids, io, s)
        assert abs(clean - corrupted) > 1e-3  # something to normalise by
        expected = torch.tensor(
            [
                [
                    (hf_metric(hf, corrupted_ids, io, s, (layer, head, kept[layer]))[0] - corrupted)
                    / (clean - corrupted)
                    for head in range(2)
                ]
                for layer in range(2)
            ],
            dtype=torch.float64,
        )
        assert torch.allclose(result.heads.double(), expected, atol=1e-3), (corruption, result.heads, expected)
        grids[corruption] = expected
    assert not torch.allclose(grids["abc"], grids["s2_io"], atol=1e-2)  # the corruption changes the grid
    assert not torch.allclose(grids["swap"], grids["s2_io"], atol=1e-2)


def test_metrics_are_shown_readably_tiny_probabilities_in_scientific_form(models):
    assert readable(3.2e-5, "probability") == "3.2e-05"  # not 0.0000
    assert readable(0.4912, "probability") == "49.12%"
    assert readable(0.817, "probability") == "81.70%"
    assert readable(-0.0123, "probability") == "-1.23%"
    assert readable(3.55123) == readable(3.55123, "number") == "3.5512"
    assert readable(-2.5e-4) == "-2.5e-04" and readable(0.0) == "0"
    result = ExperimentResult(
        "x", {"io_prob": 0.49, "loss": 6.5, "tiny": 1e-7}, torch.zeros(1, 1), "", formats={"io_prob": "probability"}
    )
    assert result.shown() == {"io_prob": "49.00%", "loss": "6.5000", "tiny": "1.0e-07"}
    with pytest.raises(GPT2Error, match="kind must be number or probability, got 'percent'"):
        readable(0.5, "percent")
    # a random model of GPT-2's vocabulary puts about 1 / 50257 on IO: 0.0000 at four decimals
    _, ours, _ = models
    result = run_experiment(ours, "ioi", form="demo", patch_prompts=1)
    shown = result.shown()
    assert list(shown) == ["logit_diff", "io_prob"]
    assert 1e-6 < result.metrics["io_prob"] < 1e-3 and re.fullmatch(r"\d\.\de-0\d", shown["io_prob"])
    assert float(shown["io_prob"]) == pytest.approx(result.metrics["io_prob"], rel=0.05)
    assert float(shown["logit_diff"]) == pytest.approx(result.metrics["logit_diff"], abs=1e-4, rel=0.05)


def test_an_unknown_corruption_is_refused_naming_the_choices(models):
    _, ours, _ = models
    message = "corruption must be one of s2_io, abc, swap, got 'ABC'"
    for call in (
        lambda: ioi_prompts(corruption="ABC"),
        lambda: ioi_prompts("demo", corruption="ABC"),
        lambda: run_experiment(ours, "ioi", form="demo", corruption="ABC"),
    ):
        with pytest.raises(GPT2Error, match=re.escape(message)) as caught:
            call()
        assert caught.value.param == "corruption"


def test_cli_ioi_takes_a_corruption_and_prints_io_prob_readably(models, capsys):
    hf, ours, directory = models
    assert main(["inspect", "--experiment", "ioi", "--model", directory, "--corruption", "abc"]) == 0
    out = capsys.readouterr().out
    io_prob = run_experiment(ours, "ioi").metrics["io_prob"]  # a random model: about 1/50257
    printed = re.search(r"^io_prob +(\S+)$", out, re.M).group(1)
    assert printed != "0.0000" and float(printed) == pytest.approx(io_prob, rel=0.05)  # 2.0e-05, not 0.0000
    assert "corrupted by abc" in out
    assert main(["inspect", "--experiment", "induction", "--model", directory, "--corruption", "abc"]) == 2
    assert capsys.readouterr().err == "gpt2: error: --corruption is the ioi experiment's, not induction's\n"


def test_an_option_an_experiment_does_not_take_is_refused_naming_it(models):
    _, ours, _ = models
    with pytest.raises(
        InvalidArgumentError, match="the induction experiment takes no option 'corruption': its options are n, seed"
    ):
        run_experiment(ours, "induction", corruption="abc")
