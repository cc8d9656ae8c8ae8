"""The field's standard experiments on GPT-2, with their data built in, ready to run.

    result = run_experiment(model, "ioi")      # or "greater-than", "induction"
    result.metrics                             # {"logit_diff": ..., "io_prob": ...}
    result.shown()                             # the same, readable: {"logit_diff": "3.5512", "io_prob": "49.12%"}
    result.heads                               # (n_layer, n_head): activation patching, or induction scores
    result.attribution                         # direct logit attribution (LogitAttribution), or None

    ioi           indirect object identification (Wang et al. 2023): "Then, Mary and John went to
                  the store. John gave a drink to" -> " Mary". The 15 templates of the paper, each
                  with its names in both orders (BABA, ABBA); or TransformerLens's 8-prompt demo.
                  Metrics: the mean logit difference logit(IO) - logit(S), the mean probability of IO.
    greater-than  Hanna et al. 2023: "The war lasted from the year 17YY to the year 17" for YY in
                  02..98. Metric: the probability on the years after YY less that on YY and before
                  ("00".."99", each one GPT-2 token), averaged over the prompts.
    induction     head scores (`circuits.head_scores`) on a random sequence written twice, and the
                  loss on its first and its repeated half (induction heads bring the second down).

Patching (`patching.activation_patching`, site `head`) takes each head's output from the clean
prompt into the corrupted one: for greater-than the one starting in 1701; for IOI the one its
`corruption` option names (the clean prompt "Then, Mary and John went to the store. John gave a
drink to", IO Mary, S John):

    s2_io  (the default) the second mention of S made IO: "Then, Mary and John went to the store.
           Mary gave a drink to" (the same names, the same first clause; the answer is now S).
           One token differs, at S2: patching finds what flows from there, which name is the
           repeated one (Wang et al.'s duplicate-token and induction heads at S2, the
           S-inhibition heads carrying it to the end, and through them the name movers).
    abc    Wang et al.'s ABC distribution: the three name slots filled with three other names,
           drawn from NAMES, none of them IO or S, all three distinct ("Then, Lisa and Kyle went
           to the store. Adam gave a drink to"), template, place and object kept. No name
           repeats and neither IO nor S is there: the sentence keeps its grammar and loses all
           its IOI information, so patching can find every head of the circuit (the paper's path
           patching and mean ablation use this distribution).
    swap   IO and S exchanged throughout ("Then, John and Mary went to the store. Mary gave a
           drink to"), the flipped prompt whose answer is the other name. Every role stays at
           its position and only the names' identities change: patching finds the heads whose
           output carries which name (the name movers), not where it stands (ARENA's IOI
           exercises and Wang et al. use such flipped prompts; the corrupted logit difference is
           about minus the clean one on a model that does IOI).

Each corrupted prompt has the clean one's length in tokens (every name is one GPT-2 token). Its
grid is normalised: 0 is the corrupted run's metric, 1 the clean run's (both averaged over the
prompts patched), the metric being logit(IO) - logit(S) with the clean prompt's IO and S. The
attribution is the direct effect of each part on the metric's logits: logit(IO) - logit(S) for
IOI, for greater-than the mean logit of the years after YY less the mean logit of the others.

Metrics are floats in `metrics`; `shown()` gives them as the CLI prints them: probabilities as
percentages ("49.12%"), other numbers to four decimals, and anything nonzero under 0.001 in
scientific form ("3.2e-05", not "0.0000").
"""

from __future__ import annotations

import inspect
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from gpt2.errors import InvalidArgumentError
from gpt2.inspect.circuits import LogitAttribution, head_scores, logit_attribution, repeated_tokens
from gpt2.inspect.patching import activation_patching
from gpt2.inspect.tracing import trace
from gpt2.model.model import GPT2
from gpt2.tokenizer import Tokenizer

EXPERIMENTS = ("induction", "ioi", "greater-than")
CORRUPTIONS = ("s2_io", "abc", "swap")  # IOI's corrupted prompts (the module's docstring)
CORRUPTION_NOTES = {
    "s2_io": "the second S made IO",
    "abc": "three other names (ABC)",
    "swap": "IO and S exchanged",
}

# ------------------------------------------------------------------ IOI data (Wang et al. 2023, appendix)

# [B] the subject (S), named twice; [A] the indirect object (IO), the answer. The prompt ends
# before the answer, as the paper's prompts do.
BABA_TEMPLATES = (
    "Then, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to",
    "Then, [B] and [A] had a lot of fun at the [PLACE]. [B] gave a [OBJECT] to",
    "Then, [B] and [A] were working at the [PLACE]. [B] decided to give a [OBJECT] to",
    "Then, [B] and [A] were thinking about going to the [PLACE]. [B] wanted to give a [OBJECT] to",
    "Then, [B] and [A] had a long argument, and afterwards [B] said to",
    "After [B] and [A] went to the [PLACE], [B] gave a [OBJECT] to",
    "When [B] and [A] got a [OBJECT] at the [PLACE], [B] decided to give it to",
    "When [B] and [A] got a [OBJECT] at the [PLACE], [B] decided to give the [OBJECT] to",
    "While [B] and [A] were working at the [PLACE], [B] gave a [OBJECT] to",
    "While [B] and [A] were commuting to the [PLACE], [B] gave a [OBJECT] to",
    "After the lunch, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to",
    "Afterwards, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to",
    "Then, [B] and [A] had a long argument. Afterwards [B] said to",
    "The [PLACE] [B] and [A] went to had a [OBJECT]. [B] gave it to",
    "Friends [B] and [A] found a [OBJECT] at the [PLACE]. [B] gave it to",
)
# The same with the first clause's names the other way round: "Then, [A] and [B] ..."
ABBA_TEMPLATES = tuple(t.replace("[B] and [A]", "[A] and [B]", 1) for t in BABA_TEMPLATES)

# Each one GPT-2 token after a space (tests/inspect/test_inspect_experiments.py checks it with tiktoken).
NAMES = (
    "Michael",
    "Christopher",
    "Jessica",
    "Matthew",
    "Ashley",
    "Jennifer",
    "Joshua",
    "Amanda",
    "Daniel",
    "David",
    "James",
    "Robert",
    "John",
    "Joseph",
    "Andrew",
    "Ryan",
    "Brandon",
    "Jason",
    "Justin",
    "Sarah",
    "William",
    "Jonathan",
    "Stephanie",
    "Brian",
    "Nicole",
    "Nicholas",
    "Anthony",
    "Heather",
    "Eric",
    "Elizabeth",
    "Adam",
    "Megan",
    "Melissa",
    "Kevin",
    "Steven",
    "Thomas",
    "Timothy",
    "Christina",
    "Kyle",
    "Rachel",
    "Laura",
    "Lauren",
    "Amber",
    "Richard",
    "Amy",
    "Crystal",
    "Michelle",
    "Jeremy",
    "Benjamin",
    "Mark",
    "Emily",
    "Aaron",
    "Charles",
    "Rebecca",
    "Jacob",
    "Stephen",
    "Patrick",
    "Sean",
    "Erin",
    "Kelly",
    "Nathan",
    "Paul",
    "Tyler",
    "Scott",
    "Mary",
    "Lisa",
    "Alexander",
    "Jesse",
    "Katie",
    "Samuel",
)
PLACES = ("store", "garden", "restaurant", "school", "hospital", "office", "house", "station")
OBJECTS = ("ring", "kiss", "bone", "basketball", "computer", "necklace", "drink", "snack")

# TransformerLens's "Exploratory Analysis Demo": 4 sentences, each with either name as S; the
# demo runs them after <|endoftext|> (its to_tokens prepends it).
DEMO_SENTENCES = (
    ("When John and Mary went to the shops,{} gave the bag to", " Mary", " John"),
    ("When Tom and James went to the park,{} gave the ball to", " Tom", " James"),
    ("When Dan and Sid went to the shops,{} gave an apple to", " Dan", " Sid"),
    ("After Martin and Amy went to the park,{} gave a drink to", " Martin", " Amy"),
)
EOT = "<|endoftext|>"


@dataclass(frozen=True)
class IOIPrompt:
    """One IOI prompt: its text, the answer (" Mary") and the other name (" John"), and the
    corrupted text that patching takes activations into (by `ioi_prompts`' corruption)."""

    text: str
    io: str
    s: str
    corrupted: str
    bos: bool = False  # whether it runs after <|endoftext|>


def _fill(template: str, io: str, s: str, s2: str, place: str, obj: str) -> str:
    text = template.replace("[A]", io).replace("[PLACE]", place).replace("[OBJECT]", obj)
    return text.replace("[B]", s, 1).replace("[B]", s2, 1)


def check_corruption(corruption: object) -> str:
    """`corruption` if it is one of CORRUPTIONS; else the error naming them."""
    if corruption not in CORRUPTIONS:
        raise InvalidArgumentError(
            f"corruption must be one of {', '.join(CORRUPTIONS)}, got {corruption!r}", "corruption"
        )
    return corruption


def corrupt(text: str, io: str, s: str, corruption: str, draw: random.Random) -> str:
    """The clean IOI prompt `text` (IO " Mary" once, S " John" twice) corrupted: `s2_io`, `abc`
    or `swap` (the module's docstring); `draw` picks abc's three names."""
    io, s = io.strip(), s.strip()
    slots = list(re.finditer(rf"\b(?:{re.escape(io)}|{re.escape(s)})\b", text))  # the name slots, in order
    names = [m.group() for m in slots]
    if corruption == "s2_io":
        names[max(i for i, name in enumerate(names) if name == s)] = io  # the second S
    elif corruption == "swap":
        names = [s if name == io else io for name in names]
    else:  # abc
        names = draw.sample([name for name in NAMES if name not in (io, s)], len(slots))
    pieces, end = [], 0
    for m, name in zip(slots, names):
        pieces += [text[end : m.start()], name]
        end = m.end()
    return "".join(pieces) + text[end:]


def ioi_prompts(
    form: str = "templates", per_template: int = 1, seed: int = 0, corruption: str = "s2_io"
) -> list[IOIPrompt]:
    """The IOI prompts: `templates`, each of the 15 templates in both orders (BABA, ABBA),
    `per_template` times with names, place and object drawn by `seed`; or `demo`, the 8 prompts
    of TransformerLens's demo. Each is corrupted by `corruption` (one of CORRUPTIONS); the
    clean prompts are the same whichever it is (abc draws its names from a stream of its own)."""
    check_corruption(corruption)
    if form not in ("templates", "demo"):
        raise InvalidArgumentError(f"form must be templates or demo, got {form!r}", "form")
    draw, names = random.Random(seed), random.Random(f"ioi-abc-{seed}")
    if form == "demo":
        clean = [(text.format(s), io, s, True) for text, a, b in DEMO_SENTENCES for io, s in ((a, b), (b, a))]
    else:
        clean = []  # (text, io, s, bos)
        for _ in range(per_template):
            for baba, abba in zip(BABA_TEMPLATES, ABBA_TEMPLATES):
                for template in (baba, abba):
                    io, s = draw.sample(NAMES, 2)
                    place, obj = draw.choice(PLACES), draw.choice(OBJECTS)
                    clean.append((_fill(template, io, s, s, place, obj), f" {io}", f" {s}", False))
    return [IOIPrompt(text, io, s, corrupt(text, io, s, corruption, names), bos) for text, io, s, bos in clean]


# ------------------------------------------------------------------ greater-than data (Hanna et al. 2023)

YEARS = tuple(f"{yy:02d}" for yy in range(100))  # the two-digit tokens "00".."99"
START_YEARS = tuple(range(2, 99))  # YY = 02..98: some year on either side
CORRUPTED_YEAR = 1  # the corrupted prompts start in 1701: every year after it


def greater_than_prompt(yy: int) -> str:
    return f"The war lasted from the year 17{yy:02d} to the year 17"


def probability_difference(logits: torch.Tensor, year_ids: list[int], yy: int) -> float:
    """The greater-than metric on the next-token logits (V,): the probability (over the whole
    vocabulary) of the years after yy less that of yy and the years before; `year_ids` are the
    token ids of "00".."99"."""
    p = torch.softmax(logits.double(), dim=-1)[year_ids]
    return float(p[yy + 1 :].sum() - p[: yy + 1].sum())


# ------------------------------------------------------------------ results


def readable(value: float, kind: str = "number") -> str:
    """A metric as people read it: a `probability` as a percentage ("49.12%"), a `number` to
    four decimals ("3.5512"); either in scientific form when nonzero and under 0.001 in size
    ("3.2e-05": GPT-2's tiny probabilities would print as 0.0000)."""
    if kind not in ("number", "probability"):
        raise InvalidArgumentError(f"kind must be number or probability, got {kind!r}", "kind")
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"  # 0, nan, inf
    if abs(value) < 1e-3:
        return f"{value:.1e}"
    return f"{value:.2%}" if kind == "probability" else f"{value:.4f}"


@dataclass
class ExperimentResult:
    """What an experiment measured: `metrics` by name, and how each reads (`formats`: a
    `readable` kind, "number" when absent); `heads` (n_layer, n_head) and what it holds
    (`heads_title`); `attribution`, the direct logit attribution averaged over its prompts (None
    for induction)."""

    name: str
    metrics: dict[str, float]
    heads: torch.Tensor
    heads_title: str
    attribution: LogitAttribution | None = None
    prompts: int = 0
    notes: list[str] = field(default_factory=list)
    formats: dict[str, str] = field(default_factory=dict)

    def shown(self) -> dict[str, str]:
        """The metrics as strings to print, by name: `readable` of each by its format."""
        return {key: readable(value, self.formats.get(key, "number")) for key, value in self.metrics.items()}


def check_gpt2_tokenizer(model: GPT2, experiment: str, model_name: str = "the model") -> Tokenizer:
    """The model's tokenizer, if it is GPT-2's: the IOI and greater-than prompts and answers are
    GPT-2 tokens (one name, one year each)."""
    gpt2 = Tokenizer.gpt2()
    tokenizer = model.tokenizer
    probe = " ".join((*NAMES, *PLACES, *OBJECTS, *YEARS, greater_than_prompt(32)))
    if (
        not isinstance(tokenizer, Tokenizer)
        or tokenizer.n_vocab != gpt2.n_vocab
        or tokenizer.encode_ordinary(probe) != gpt2.encode_ordinary(probe)
    ):
        what = "no tokenizer" if tokenizer is None else f"a tokenizer of {tokenizer.n_vocab} tokens that is not GPT-2's"
        raise InvalidArgumentError(
            f"the {experiment} experiment needs a model with GPT-2's tokenizer, and {model_name} has {what}", "model"
        )
    return tokenizer


def run_experiment(model: GPT2, name: str, model_name: str = "the model", **options) -> ExperimentResult:
    """Run experiment `name` (one of EXPERIMENTS) on the model; `options` go to its function
    (`ioi`, `greater_than`, `induction`)."""
    runs: dict[str, Callable[..., ExperimentResult]] = {
        "ioi": ioi,
        "greater-than": greater_than,
        "induction": induction,
    }
    if name not in runs:
        raise InvalidArgumentError(
            f"unknown experiment {name!r}: the experiments are {', '.join(EXPERIMENTS)}", "experiment"
        )
    taken = list(inspect.signature(runs[name]).parameters)[1:]  # after the model
    for option in options:
        if option not in taken:
            raise InvalidArgumentError(
                f"the {name} experiment takes no option {option!r}: its options are {', '.join(taken)}", option
            )
    if name != "induction":
        check_gpt2_tokenizer(model, name, model_name)
    return runs[name](model, **options)


# ------------------------------------------------------------------ the experiments


def _last_logits(model: GPT2, ids: list[int]) -> torch.Tensor:
    return trace(model, ids, names=()).logits[-1].float().cpu()


def _spread(n: int, k: int) -> list[int]:
    """k indices spread evenly over range(n) (all of them if k >= n)."""
    return list(range(n)) if k >= n else [round(i * (n - 1) / (k - 1)) if k > 1 else 0 for i in range(k)]


def _normalised(grid: torch.Tensor, clean: float, corrupted: float) -> torch.Tensor:
    if clean == corrupted:
        raise InvalidArgumentError(
            f"clean and corrupted prompts give the same metric ({clean:.6g}): patching has nothing to normalise by",
            "model",
        )
    return (grid - corrupted) / (clean - corrupted)


def _mean_attribution(parts: list[LogitAttribution]) -> LogitAttribution:
    n = len(parts)
    return LogitAttribution(
        heads=sum(p.heads for p in parts) / n,
        mlps=sum(p.mlps for p in parts) / n,
        embed=sum(p.embed for p in parts) / n,
        biases=sum(p.biases for p in parts) / n,
        total=sum(p.total for p in parts) / n,
    )


def ioi(
    model: GPT2,
    form: str = "templates",
    per_template: int = 1,
    seed: int = 0,
    patch_prompts: int = 8,
    corruption: str = "s2_io",
) -> ExperimentResult:
    """IOI: the mean logit difference logit(IO) - logit(S) and IO probability over the prompts;
    head patching (into the prompts corrupted by `corruption`, one of CORRUPTIONS) and direct
    logit attribution over `patch_prompts` of them, spread evenly."""
    tokenizer = model.tokenizer
    prompts = ioi_prompts(form, per_template, seed, corruption)
    eot = [tokenizer.eot_token]

    def ids(text: str, bos: bool) -> list[int]:
        return (eot if bos else []) + tokenizer.encode_ordinary(text)

    diffs, probs = [], []
    for p in prompts:
        logits = _last_logits(model, ids(p.text, p.bos))
        io, s = tokenizer.encode_ordinary(p.io)[0], tokenizer.encode_ordinary(p.s)[0]
        diffs.append(float(logits[io] - logits[s]))
        probs.append(float(torch.softmax(logits.double(), -1)[io]))
    grids, clean, corrupted, parts = [], [], [], []
    for p in (prompts[i] for i in _spread(len(prompts), patch_prompts)):
        io, s = tokenizer.encode_ordinary(p.io)[0], tokenizer.encode_ordinary(p.s)[0]
        clean_ids, corrupted_ids = ids(p.text, p.bos), ids(p.corrupted, p.bos)
        metric = lambda logits, io=io, s=s: float(logits[-1, io] - logits[-1, s])  # noqa: E731
        grids.append(activation_patching(model, clean_ids, corrupted_ids, metric, "head"))
        clean.append(metric(trace(model, clean_ids, names=()).logits))
        corrupted.append(metric(trace(model, corrupted_ids, names=()).logits))
        parts.append(logit_attribution(model, clean_ids, io, s))
    n = len(grids)
    heads = _normalised(sum(grids) / n, sum(clean) / n, sum(corrupted) / n)
    return ExperimentResult(
        "ioi",
        {"logit_diff": sum(diffs) / len(diffs), "io_prob": sum(probs) / len(probs)},
        heads,
        "head patching: share of the clean logit difference restored",
        _mean_attribution(parts),
        len(prompts),
        [
            f"patching and attribution over {n} of the {len(prompts)} prompts",
            f"corrupted by {corruption}: {CORRUPTION_NOTES[corruption]}",
        ],
        {"logit_diff": "number", "io_prob": "probability"},
    )


def greater_than(model: GPT2, patch_prompts: int = 8) -> ExperimentResult:
    """Greater-than: the mean probability difference over YY = 02..98; head patching (from the
    1701 prompts) and direct logit attribution over `patch_prompts` of them, spread evenly."""
    tokenizer = model.tokenizer
    year_ids = [tokenizer.encode_ordinary(y)[0] for y in YEARS]
    diffs = [
        probability_difference(_last_logits(model, tokenizer.encode_ordinary(greater_than_prompt(yy))), year_ids, yy)
        for yy in START_YEARS
    ]
    grids, clean, corrupted, parts = [], [], [], []
    corrupted_ids = tokenizer.encode_ordinary(greater_than_prompt(CORRUPTED_YEAR))
    for yy in (START_YEARS[i] for i in _spread(len(START_YEARS), patch_prompts)):
        clean_ids = tokenizer.encode_ordinary(greater_than_prompt(yy))
        metric = lambda logits, yy=yy: probability_difference(logits[-1].float(), year_ids, yy)  # noqa: E731
        grids.append(activation_patching(model, clean_ids, corrupted_ids, metric, "head"))
        clean.append(metric(trace(model, clean_ids, names=()).logits))
        corrupted.append(metric(trace(model, corrupted_ids, names=()).logits))
        parts.append(logit_attribution(model, clean_ids, year_ids[yy + 1 :], year_ids[: yy + 1]))  # mean logits
    n = len(grids)
    heads = _normalised(sum(grids) / n, sum(clean) / n, sum(corrupted) / n)
    return ExperimentResult(
        "greater-than",
        {"prob_diff": sum(diffs) / len(diffs)},
        heads,
        "head patching: share of the clean probability difference restored",
        _mean_attribution(parts),
        len(START_YEARS),
        [f"patching and attribution over {n} of the {len(START_YEARS)} prompts"],
        {"prob_diff": "probability"},
    )


def induction_losses(model: GPT2, ids: list[int], half: int, patch: dict | None = None) -> tuple[float, float]:
    """The mean next-token loss on the first copy and on the repeated copy of a sequence of
    `half` tokens written twice at the end of `ids`; each copy's first token is left out (the
    repeat cannot be foreseen before it starts)."""
    logits = trace(model, ids, patch=patch or {}, names=()).logits.float().cpu()  # (T, V)
    start = len(ids) - 2 * half
    targets = torch.tensor(ids)
    losses = torch.nn.functional.cross_entropy(logits[:-1], targets[1:], reduction="none")  # [t]: predicting ids[t + 1]
    first = losses[start : start + half - 1]
    repeated = losses[start + half : start + 2 * half - 1]
    return float(first.mean()), float(repeated.mean())


def induction(model: GPT2, n: int = 50, seed: int = 0) -> ExperimentResult:
    """Induction: head scores on n random tokens written twice (after <|endoftext|> where the
    model has GPT-2's), and the loss on the first and the repeated half."""
    n_ctx = model.config.n_ctx
    tokenizer = model.tokenizer
    start = tokenizer.eot_token if tokenizer is not None and tokenizer.eot_token is not None else None
    n = min(n, (n_ctx - (start is not None)) // 2)
    if n < 2:
        raise InvalidArgumentError(
            f"the induction test needs a context of at least 4 tokens, the model's is {n_ctx}", "model"
        )
    ids = repeated_tokens(n, model.config.n_vocab if tokenizer is None else tokenizer.n_vocab, seed, start)
    first, repeated = induction_losses(model, ids, n)
    scores = head_scores(model, ids, "induction")
    return ExperimentResult(
        "induction",
        {"loss_first_half": first, "loss_repeated_half": repeated},
        scores,
        f"induction score on {n} random tokens written twice",
        None,
        1,
    )
