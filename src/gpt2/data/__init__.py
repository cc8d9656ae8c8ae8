"""Training data: text and conversations to token ids on disk, and back.

    corpora  records streamed from JSON Lines, Parquet and Hugging Face datasets, and llm.c's
             shards written and read as one stream
    files    the token files' format: a prepared directory written atomically (train.bin and
             val.bin, their masks, meta.json, the tokenizer's files), and `open_data`, which reads
             ours, nanoGPT's and llm.c's back
    text     `prepare`: text to token files, documents read in chunks, encoded, split by documents
    chat     `prepare_chat`: conversations to token files, with their replies' mask
    synthetic `prepare_synthetic`: rows drawn from a stated distribution (the induction model's
             runs and copies), with the mask of the ids the loss counts
    batches  `get_batch`: the windows training draws

`files` builds on `corpora`, `text` on `files`, `chat` on both, `synthetic` on `files`; `batches`
stands alone. `from gpt2.data import prepare, prepare_chat, prepare_synthetic` is the library's
door (docs/prepare.md); the rest is imported from its module.
"""

from gpt2.data.chat import prepare_chat
from gpt2.data.synthetic import prepare_synthetic
from gpt2.data.text import prepare

__all__ = ["prepare", "prepare_chat", "prepare_synthetic"]
