"""OUT/loss.png: the training and validation losses against iterations, and HellaSwag's accuracy where the run
scored it, drawn with matplotlib from log.jsonl; OUT/heads.png: each head's scores on the run's probe, from
probes.jsonl.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from gpt2._files import atomic_path
from gpt2.training.loggers import read_log

# HellaSwag's acc_norm of OpenAI's 124M on all 10,042 examples, completion style (llm.c; docs/eval.md)
HELLASWAG_GPT2 = 0.2955


def _how_often(iterations: list[int], param: str) -> str:
    """ "(every 10 iterations, log_interval)": how often a log's records come, from their commonest
    gap (the interval they were written at; the last iteration's comes off the beat)."""
    gaps = Counter(b - a for a, b in zip(iterations, iterations[1:]) if b > a)
    if not gaps:
        return f"({param})"
    gap = min(gaps, key=lambda g: (-gaps[g], g))
    return f"(every iteration, {param})" if gap == 1 else f"(every {gap:,} iterations, {param})"


def plot_losses(log: Path, png: Path, note=print) -> Any:
    """Training loss at each logged step (faint) and the evaluations' train and validation losses,
    against iterations; beside them, as llm.c's plots, HellaSwag's accuracies where the run scored
    it. Returns the matplotlib figure drawn, or None without matplotlib."""
    try:
        from matplotlib.figure import Figure  # not pyplot: no global state (it draws in the writer's thread), no window
    except ImportError:
        if not getattr(plot_losses, "warned", False):
            note("gpt2: note: loss.png needs matplotlib: pip install 'gpt2[train]'")
            plot_losses.warned = True
        return None
    records = read_log(log)
    steps = [r for r in records if "loss" in r]
    evals = [r for r in records if "val_loss" in r]
    scored = [r for r in evals if "hellaswag_acc_norm" in r]
    fig = Figure(figsize=(15 if scored else 8, 5))
    axes = fig.subplots(1, 2 if scored else 1, squeeze=False)
    ax = axes[0, 0]
    if steps:
        label = f"train loss of a step {_how_often([r['iter'] for r in steps], 'log_interval')}"
        ax.plot(
            [r["iter"] for r in steps], [r["loss"] for r in steps], color="tab:blue", alpha=0.25, lw=0.8, label=label
        )
    how_often = _how_often([r["iter"] for r in evals], "eval_interval")
    for key, color in (("train_loss", "tab:blue"), ("val_loss", "tab:orange")):
        label = f"{key.split('_')[0]} loss at each evaluation {how_often}"
        ax.plot([r["iter"] for r in evals], [r[key] for r in evals], "o-", color=color, label=label)
    ax.set_xlabel("iteration")
    ax.set_ylabel("loss (nats per token)")
    ax.grid(alpha=0.3)
    ax.legend()
    if scored:
        _plot_hellaswag(axes[0, 1], scored, how_often)
    with atomic_path(png) as tmp:
        fig.savefig(tmp, format="png", dpi=100, bbox_inches="tight")  # drawn by Agg, matplotlib's canvas for files
    return fig


def _plot_hellaswag(ax: Any, scored: list[dict[str, Any]], how_often: str) -> None:
    """HellaSwag's acc_norm (and acc, faint) at each evaluation, with OpenAI's 124M for scale."""
    iters = [r["iter"] for r in scored]
    ax.plot(
        iters,
        [r["hellaswag_acc_norm"] for r in scored],
        "o-",
        color="tab:green",
        label=f"acc_norm at each evaluation {how_often}",
    )
    ax.plot(
        iters,
        [r["hellaswag_acc"] for r in scored],
        "o-",
        color="tab:green",
        alpha=0.3,
        label="acc (least total loss, not per token)",
    )
    ax.axhline(
        HELLASWAG_GPT2,
        color="tab:red",
        ls="--",
        lw=1,
        label=f"OpenAI's GPT-2 124M: {HELLASWAG_GPT2} (all 10,042 examples)",
    )
    ax.set_xlabel("iteration")
    ax.set_ylabel("HellaSwag accuracy")
    ax.grid(alpha=0.3)
    ax.legend()


HEAD_SCORE_TITLES = {"previous_token": "previous-token", "duplicate_token": "duplicate-token", "induction": "induction"}


def plot_head_scores(probes: Path, png: Path) -> Any:
    """OUT/heads.png: each head's scores on the run's probe (probes.jsonl) against iterations, a
    panel per kind, a line per head: an induction head forming is its line jumping. Returns the
    figure, or None without matplotlib or probes (plot_losses says what is missing)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    records = read_log(probes)
    if not records:
        return None
    iters = [r["iter"] for r in records]
    fig = Figure(figsize=(15, 4.5))
    for ax, (kind, title) in zip(fig.subplots(1, len(HEAD_SCORE_TITLES)), HEAD_SCORE_TITLES.items()):
        scores = [r["head_scores"][kind] for r in records]  # (evaluations, L, H)
        for layer, heads in enumerate(scores[0]):
            for head in range(len(heads)):
                ax.plot(iters, [s[layer][head] for s in scores], ".-", label=f"head {layer}.{head}")
        ax.set_title(f"{title} score")
        ax.set_xlabel("iteration")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        if len(scores[0]) * len(scores[0][0]) <= 12:  # a legend of a few heads; 144 would hide the lines
            ax.legend(fontsize="small")
    fig.suptitle(f"each head on the probe ({len(records[0]['ids'])} tokens; probes.jsonl)")
    with atomic_path(png) as tmp:
        fig.savefig(tmp, format="png", dpi=100, bbox_inches="tight")
    return fig
