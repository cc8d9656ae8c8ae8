"""Looking inside a model: `gpt2 inspect`, and `gpt2.inspect.trace(model, text)` in Python.

    tracing  a traced forward pass: every activation by name, patches, the logit lens, the
             next-token report and the walkthrough
    circuits what heads attend to (head scores) and each part's direct effect on a logit
    patching activation patching: each activation of a site taken from a clean run into a
             corrupted one, the metric of each (logit differences ready made), and its
             first-order estimate from one backward pass (attribution patching)
    figures  its pictures, drawn with matplotlib: attention, the logit lens, the next token

`circuits`, `patching` and `figures` build on `tracing`. The names of `tracing`, `circuits` and
`patching` are this package's (`gpt2.inspect.trace`, `gpt2.inspect.head_scores`, ...); `figures`
is imported as `gpt2.inspect.figures`, since it needs matplotlib.
"""

from gpt2.inspect.circuits import HEAD_SCORES, LogitAttribution, head_scores, logit_attribution, repeated_tokens
from gpt2.inspect.patching import SITES, activation_patching, attribution_patching, logit_diff, normalised_logit_diff
from gpt2.inspect.tracing import (
    BLOCK_STEPS,
    ON_REQUEST,
    STEP_MATH,
    Patch,
    Trace,
    activation_names,
    alternatives,
    logit_lens_top,
    next_token_report,
    token_ids,
    token_label,
    trace,
    walkthrough,
)

__all__ = [
    "BLOCK_STEPS",
    "HEAD_SCORES",
    "LogitAttribution",
    "ON_REQUEST",
    "SITES",
    "STEP_MATH",
    "Patch",
    "Trace",
    "activation_names",
    "activation_patching",
    "attribution_patching",
    "alternatives",
    "head_scores",
    "logit_attribution",
    "logit_diff",
    "logit_lens_top",
    "next_token_report",
    "normalised_logit_diff",
    "repeated_tokens",
    "token_ids",
    "token_label",
    "trace",
    "walkthrough",
]
