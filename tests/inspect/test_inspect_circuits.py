"""Head scores and direct logit attribution (gpt2.inspect.circuits), against transformers' own
modules on the same weights: its attention probabilities, and its activations read with hooks;
and the induction head that head scores find in a 2-layer model trained here."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from helpers import head_score_written_out, hf_and_ours, transformer_lens_from_hf

from gpt2 import GPT2Error
from gpt2.inspect.circuits import HEAD_SCORES, head_scores, logit_attribution, repeated_tokens
from gpt2.inspect.experiments import induction_losses
from gpt2.model.model import GPT2

CONFIG = dict(vocab_size=50257, n_positions=64, n_embd=32, n_layer=2, n_head=4)
TEXT = "When Mary and John went to the store, John gave a drink to"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return hf_and_ours(tmp_path_factory.mktemp("circuits"), seed=3, **CONFIG)


def hf_patterns(hf, ids: list[int]) -> torch.Tensor:
    """(L, H, T, T): transformers' attention probabilities."""
    hf.set_attn_implementation("eager")
    with torch.no_grad():
        return torch.stack(hf(torch.tensor([ids]), output_attentions=True).attentions)[:, 0]


def hf_head_scores(hf, ids: list[int], kind: str) -> torch.Tensor:
    """(L, H): the issue's definition of `kind`, one query at a time, on transformers' patterns."""
    A = hf_patterns(hf, ids)
    return torch.tensor(
        [[head_score_written_out(A[l, h], ids, kind) for h in range(A.shape[1])] for l in range(A.shape[0])]
    )


@pytest.mark.parametrize("kind", HEAD_SCORES)
def test_head_scores_are_the_definitions_on_transformers_patterns(models, kind):
    hf, ours = models
    ids = repeated_tokens(12, 50257, seed=1, start=50256) + [7, 7, 9]  # a repeat, and a token right after itself
    assert torch.allclose(head_scores(ours, ids, kind), hf_head_scores(hf, ids, kind), atol=1e-5)


def hf_pieces(hf, ids: list[int], position: int) -> dict[str, torch.Tensor]:
    """What the stream leaving the last block is made of at `position`, read from transformers'
    modules with hooks: each head through its rows of c_proj, c_proj's biases, each MLP, the
    embeddings; and that stream, before ln_f."""
    z, mlp, final = [], [], []
    hooks = [
        block.attn.c_proj.register_forward_pre_hook(lambda m, args: z.append(args[0][0, position]))
        for block in hf.transformer.h
    ]
    hooks += [
        block.mlp.register_forward_hook(lambda m, args, out: mlp.append(out[0, position])) for block in hf.transformer.h
    ]
    hooks.append(hf.transformer.ln_f.register_forward_pre_hook(lambda m, args: final.append(args[0][0, position])))
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0, position]
    for hook in hooks:
        hook.remove()
    H, C = hf.config.n_head, hf.config.n_embd
    d = C // H
    heads = torch.stack(
        [
            torch.stack([z[l][h * d : (h + 1) * d] @ block.attn.c_proj.weight[h * d : (h + 1) * d] for h in range(H)])
            for l, block in enumerate(hf.transformer.h)
        ]
    )
    t = torch.tensor(ids)
    embed = hf.transformer.wte.weight[t[position]] + hf.transformer.wpe.weight[position % len(ids)]
    biases = torch.stack([block.attn.c_proj.bias for block in hf.transformer.h])
    return {
        "heads": heads,
        "mlps": torch.stack(mlp),
        "embed": embed,
        "biases": biases,
        "final": final[0],
        "logits": logits,
    }


def direct(hf, pieces: torch.Tensor, final: torch.Tensor, answer: int, other: int | None) -> torch.Tensor:
    """(..., C) pieces -> their direct effect through ln_f at the scale of `final`, then the unembedding."""
    ln_f, wte = hf.transformer.ln_f, hf.transformer.wte.weight
    scale = (final.var(unbiased=False) + ln_f.eps).sqrt()
    direction = wte[answer] - (0 if other is None else wte[other])
    return ((pieces - pieces.mean(-1, keepdim=True)) / scale * ln_f.weight) @ direction


@pytest.mark.parametrize("other, position", [(" John", -1), (None, -1), (" John", 5)])
def test_logit_attribution_is_transformers_pieces_through_ln_f_and_sums_to_the_logit(models, other, position):
    hf, ours = models
    ids = ours.tokenizer.encode(TEXT)
    answer, other_id = ours.tokenizer.encode(" Mary")[0], None if other is None else ours.tokenizer.encode(other)[0]
    parts = logit_attribution(ours, TEXT, " Mary", other, position=position)
    p = hf_pieces(hf, ids, position)
    with torch.no_grad():
        assert torch.allclose(parts.heads.float(), direct(hf, p["heads"], p["final"], answer, other_id), atol=1e-4)
        assert torch.allclose(parts.mlps.float(), direct(hf, p["mlps"], p["final"], answer, other_id), atol=1e-4)
        assert abs(parts.embed - float(direct(hf, p["embed"], p["final"], answer, other_id))) < 1e-4
        ln_f_bias = hf.transformer.ln_f.bias @ (
            hf.transformer.wte.weight[answer] - (0 if other_id is None else hf.transformer.wte.weight[other_id])
        )
        expected_biases = torch.cat([direct(hf, p["biases"], p["final"], answer, other_id), ln_f_bias[None]])
        assert torch.allclose(parts.biases.float(), expected_biases, atol=1e-4)
    logit = float(p["logits"][answer] - (0 if other_id is None else p["logits"][other_id]))
    assert abs(parts.total - logit) < 1e-5  # the pieces sum to transformers' own logit (difference)
    summed = float(parts.heads.sum() + parts.mlps.sum() + parts.biases.sum()) + parts.embed
    assert abs(summed - logit) < 1e-5


@pytest.mark.parametrize(
    "call, param, message",
    [
        (
            lambda m: head_scores(m, [1, 2, 3], "copying"),
            "kind",
            "kind must be one of previous_token, duplicate_token, induction, got 'copying'",
        ),
        (
            lambda m: head_scores(m, [1, 2, 3], "induction"),
            "ids",
            "the text has no position a induction score looks at",
        ),
        (
            lambda m: logit_attribution(m, TEXT, " Mary Ann"),
            "answer",
            "answer must be one token of the model's vocabulary, but ' Mary Ann' is 2",
        ),
        (
            lambda m: logit_attribution(m, TEXT, 50257),
            "answer",
            "token id 50257 in answer is out of range: ids are 0..50256",
        ),
        (
            lambda m: logit_attribution(m, TEXT, " Mary", " John", position=99),
            "position",
            "position must be a whole number in 0..13",
        ),
        (
            lambda m: logit_attribution(m, list(range(65)), 1),
            None,
            "sequence of 65 tokens is longer than the model.s context of n_ctx=64",
        ),
        (
            lambda m: repeated_tokens(50, 65, start=50256),
            "start",
            "start must be a token id from 0 to 64, got 50256",
        ),  # GPT-2's <|endoftext|>, a character model's 65
        (lambda m: repeated_tokens(50, 65, start=-1), "start", "start must be a token id from 0 to 64, got -1"),
        (lambda m: repeated_tokens(0, 65), "n", "n must be a positive integer, got 0"),
        (lambda m: repeated_tokens(50, 0), "n_vocab", "n_vocab must be a positive integer, got 0"),
    ],
)
def test_bad_input_is_one_clear_error_naming_its_param(models, call, param, message):
    with pytest.raises(GPT2Error, match=message) as caught:
        call(models[1])
    assert caught.value.param == param


@pytest.mark.parametrize(
    "answer, other", [(" Mary", " Mary"), (" Mary", 5335), ([11, " Mary"], [5335, 11])]
)  # " Mary" is 5335
def test_an_answer_that_is_the_other_is_refused_naming_both(models, answer, other):
    """logit(answer) - logit(other) of one token is 0 whatever the model does (on a character
    model, " Mary" and " John" as their first characters are both " ")."""
    with pytest.raises(GPT2Error, match="^answer and other are the same token") as caught:
        logit_attribution(models[1], TEXT, answer, other)
    assert (caught.value.param, caught.value.also) == ("other", ("answer",))  # as gpt2 serve names them


# ------------------------------------------------------------------ a model trained here (issue 38, item 6)

INDUCTION_2L = Path(__file__).parents[1] / "fixtures" / "induction_2l"  # made by recipes/induction_2l.toml
PROBES = [(16, 1), (12, 2), (20, 3)]  # (n, seed) of repeated_tokens: not the probe the docs print (seed 0)
# Measured on these probes: layer 1 holds two induction heads (1.0: 0.95-0.96, 1.1: 0.93-0.96), every layer-0 head at
# most 0.06, so the margin is 0.90-0.92; head 0.1 is a previous-token head (0.98-0.99). Each induction head is enough
# alone (zeroing one moves the repeated half's loss by -0.7..+0.1); zeroing both takes it from 0.7, 0.8, 3.8 to
# 7.3, 7.6, 6.9 (rises of 6.7, 6.8, 3.2). Seed 3's 3.8 (the old fixture's 2.6) is six confident misses at the
# tokens its first half holds twice, where copying the latest occurrence is wrong (the other 13 are right, as with
# the old fixture): below uniform guessing's ln 64 = 4.16, not 1 nat below it as the old fixture's was.
INDUCTION_MARGIN = 0.5
ABLATION_RISE = 3.0


@pytest.fixture(scope="module")
def induction_2l():
    return GPT2.from_pretrained(INDUCTION_2L, device="cpu")


@pytest.fixture(scope="module")
def induction_2l_hf():
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel.from_pretrained(INDUCTION_2L)  # the same file, read by transformers


@pytest.mark.parametrize("n, seed", PROBES)
def test_a_2_layer_model_trained_here_has_an_induction_head_that_head_scores_finds(
    induction_2l, induction_2l_hf, n, seed
):
    ids = repeated_tokens(n, induction_2l.config.n_vocab, seed=seed)
    scores = head_scores(induction_2l, ids, "induction")
    assert torch.allclose(scores, hf_head_scores(induction_2l_hf, ids, "induction"), atol=1e-5)
    assert float(scores[1].max()) > float(scores[0].max()) + INDUCTION_MARGIN
    assert (
        float(head_scores(induction_2l, ids, "previous_token")[0].max()) > 0.9
    )  # what it reads: layer 0's previous-token head


@pytest.mark.parametrize("n, seed", PROBES)
def test_zeroing_the_induction_heads_raises_the_loss_on_the_repeated_half(induction_2l, n, seed):
    """Every layer-1 head head_scores finds (above 0.5) zeroed at once: each of the two does the copying alone."""
    ids = repeated_tokens(n, induction_2l.config.n_vocab, seed=seed)
    heads = (head_scores(induction_2l, ids, "induction")[1] > 0.5).nonzero()[:, 0]
    _, repeated = induction_losses(induction_2l, ids, n)
    zeroed = {"h.1.attn.z": lambda z: z.index_fill(0, heads, 0.0)}  # z (H, T, d): those heads' output
    _, ablated = induction_losses(induction_2l, ids, n, patch=zeroed)
    assert len(heads) >= 1
    assert repeated < math.log(induction_2l.config.n_vocab)  # the repeat is foreseen: below uniform guessing ...
    assert ablated > repeated + ABLATION_RISE  # ... and far less without those heads


# ------------------------------------------------------------------ TransformerLens's convention, batches


@pytest.fixture(scope="module")
def tl_model(models):
    hf, _ = models
    return transformer_lens_from_hf(hf)


@pytest.mark.parametrize("kind", HEAD_SCORES)
@pytest.mark.parametrize("exclude_bos, exclude_current_token", [(False, False), (True, False), (False, True)])
def test_head_scores_in_transformer_lens_convention_equal_its_head_detector(
    models, tl_model, kind, exclude_bos, exclude_current_token
):
    from transformer_lens import head_detector

    _, ours = models
    ids = repeated_tokens(9, 50257, seed=4, start=50256)
    _, cache = tl_model.run_with_cache(torch.tensor([ids]), remove_batch_dim=True)
    detection = getattr(head_detector, f"get_{kind}_head_detection_pattern")(torch.tensor([ids]))
    theirs = torch.tensor(
        [
            [
                head_detector.compute_head_attention_similarity_score(
                    cache["pattern", layer][head].clone(),
                    detection,
                    exclude_bos=exclude_bos,
                    exclude_current_token=exclude_current_token,
                    error_measure="mul",
                )
                for head in range(CONFIG["n_head"])
            ]
            for layer in range(CONFIG["n_layer"])
        ]
    )
    mine = head_scores(
        ours,
        ids,
        kind,
        convention="transformer_lens",
        exclude_bos=exclude_bos,
        exclude_current_token=exclude_current_token,
    )
    assert (mine - theirs).abs().max() < 1e-5
    assert (head_scores(ours, ids, kind) - theirs).abs().max() > 1e-3  # gpt2's convention is another number


def test_batched_head_scores_and_attribution_equal_each_prompt_alone(models):
    _, ours = models
    prompts = [repeated_tokens(n, 50257, seed=n) for n in (4, 7, 5)]
    per_prompt = head_scores(ours, prompts, "induction", per_prompt=True)
    alone = torch.stack([head_scores(ours, ids, "induction") for ids in prompts])
    assert per_prompt.shape == (3, 2, 4) and (per_prompt - alone).abs().max() < 1e-5
    assert (head_scores(ours, prompts, "induction") - alone.mean(0)).abs().max() < 1e-5
    texts = [TEXT, "When Tom and James went to the park, James gave the ball to", "After Martin and Amy"]
    answers, others = [" Mary", " Tom", " Martin"], [" John", " James", " Amy"]
    batch = logit_attribution(ours, texts, answers, others, per_prompt=True)
    mean = logit_attribution(ours, texts, answers, others)
    for b, text in enumerate(texts):
        one = logit_attribution(ours, text, answers[b], others[b])
        assert (batch.heads[b] - one.heads).abs().max() < 1e-5
        assert (batch.mlps[b] - one.mlps).abs().max() < 1e-5
        assert abs(float(batch.total[b]) - one.total) < 1e-5
    assert abs(mean.total - float(batch.total.mean())) < 1e-9
    with pytest.raises(GPT2Error, match="takes one answer for all, or a list of 3, one per prompt; got a list of 2"):
        logit_attribution(ours, texts, [" Mary", " Tom"])
