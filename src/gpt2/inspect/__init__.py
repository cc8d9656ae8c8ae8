"""Looking inside a model: `gpt2 inspect`, and `gpt2.inspect.trace(model, text)` in Python.

    tracing  a traced forward pass: every activation by name, patches, the logit lens, the
             next-token report and the walkthrough
    figures  its pictures, drawn with matplotlib: attention, the logit lens, the next token

`figures` builds on `tracing`. `tracing`'s names are this package's (`gpt2.inspect.trace`,
`gpt2.inspect.Trace`, ...), as they were when it was one module; `figures` is imported as
`gpt2.inspect.figures`, since it needs matplotlib.
"""

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
    token_label,
    trace,
    walkthrough,
)

__all__ = [
    "BLOCK_STEPS",
    "ON_REQUEST",
    "STEP_MATH",
    "Patch",
    "Trace",
    "activation_names",
    "alternatives",
    "logit_lens_top",
    "next_token_report",
    "token_label",
    "trace",
    "walkthrough",
]
