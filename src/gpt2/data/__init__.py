"""Training data: text and conversations to token ids on disk, and back.

    corpora  records streamed from JSON Lines, Parquet and Hugging Face datasets, and llm.c's
             shards written and read as one stream
    tokens   `prepare` and `prepare_chat` (text to train.bin and val.bin, conversations with
             their replies' mask), `open_data` (ours, nanoGPT's and llm.c's files read back),
             and the batches training draws

`tokens` builds on `corpora`. `from gpt2.data import prepare, prepare_chat` is the library's
door (docs/prepare.md); the rest is imported from its module.
"""

from gpt2.data.tokens import prepare, prepare_chat

__all__ = ["prepare", "prepare_chat"]
