"""Plain helpers shared by the tests of gpt2.data (tests/data/), imported by bare name as tests/helpers.py is:
GPT-2's <|endoftext|> id, prepared ids read back with numpy, made-up conversations' ids and masks, and QA, the
conversations that prepare_chat's tests render."""

from __future__ import annotations

import numpy as np

EOT = 50256


def read_ids(path, dtype="<u2") -> list[int]:
    return np.fromfile(path, dtype=dtype).tolist()


TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"


def chat_splits(n_train: int = 600, n_val: int = 200, seed: int = 0) -> tuple[dict, dict]:
    """GPT-2 ids (0 .. n - 1, each its own position) and a mask of random spans by split."""
    rng = np.random.default_rng(seed)
    ids = {"train": np.arange(n_train), "val": np.arange(n_val)}
    masks = {split: np.repeat(rng.integers(0, 2, size=len(v) // 10 + 1), 10)[: len(v)] for split, v in ids.items()}
    return ids, masks


QA = [
    [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "Paris."}],
    [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Capital of Spain?", "name": "ana"},  # a key the templates do not read: ignored
        {"role": "assistant", "content": "Madrid.", "weight": 1},
        {"role": "user", "content": "And of Japan, 日本?"},
        {"role": "assistant", "content": "Tōkyō 東京 — surely.\n\nYes."},
    ],
    [
        {"role": "user", "content": "  spaces  and\ttabs "},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "Again?"},
    ],
    *[
        [
            {"role": "user", "content": f"What is {i} plus {i + 3}?"},
            {"role": "assistant", "content": f"It is {2 * i + 3}."},
        ]
        for i in range(9)
    ],
]
