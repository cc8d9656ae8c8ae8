"""Evaluation: how well a model predicts text.

    tasks     the benchmarks' files (LAMBADA, HellaSwag, WikiText-2): where each is published,
              how it is read, the checks that name a bad line; no torch
    evaluate  the loss, perplexity and bits per byte of a text, and the tasks' zero-shot scores

`evaluate` builds on `tasks`; training scores its evaluations with the same code.
"""
