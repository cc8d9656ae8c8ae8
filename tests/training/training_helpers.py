"""What the training tests share: nanoGPT's learning rate written out, and a chat template."""

from __future__ import annotations

import math


def nanogpt_lr(it, learning_rate, warmup_iters, lr_decay_iters, min_lr):
    """nanoGPT's get_lr (train.py), written out here as the independent reference."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


# A template of GPT-2's own tokens, rendered the same by jinja2 alone and by transformers (no
# whitespace for trim_blocks or lstrip_blocks to take).
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m.role }}: {{ m.content }}{% if m.role == 'assistant' %}<|endoftext|>{% endif %}"
    "{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)
