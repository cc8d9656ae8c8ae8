"""GPT-2 from scratch: OpenAI's tokenizer, model, weights, generation and training.

`gpt2.Tokenizer` and `gpt2.GPT2Config` import without torch; `gpt2.GPT2` imports torch
on first use, so the tokenizer and its command stay quick to start.
"""

from gpt2.checkpoints.config import GPT2Config
from gpt2.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    ConfigError,
    ContextLengthError,
    DataError,
    DisallowedSpecialTokenError,
    DistributedError,
    GPT2Error,
    GPT2Warning,
    InputTypeError,
    InvalidArgumentError,
    MemoryLimitError,
    MissingPackageError,
    NonFiniteError,
    RecipeError,
    RecipeNotFoundError,
    TokenIdError,
    UnknownModelError,
    UnwritablePathError,
    VocabularyError,
    VocabularyNotFoundError,
)
from gpt2.tokenizer import IncrementalDecoder, Tokenizer

__version__ = "0.1.0"

__all__ = [
    "GPT2",
    "CheckpointError",
    "CheckpointNotFoundError",
    "ConfigError",
    "ContextLengthError",
    "DataError",
    "DisallowedSpecialTokenError",
    "DistributedError",
    "GPT2Config",
    "GPT2Error",
    "GPT2Warning",
    "IncrementalDecoder",
    "InputTypeError",
    "InvalidArgumentError",
    "MemoryLimitError",
    "MissingPackageError",
    "NonFiniteError",
    "RecipeError",
    "RecipeNotFoundError",
    "TokenIdError",
    "Tokenizer",
    "UnknownModelError",
    "UnwritablePathError",
    "VocabularyError",
    "VocabularyNotFoundError",
]


def __getattr__(name: str):
    if name == "GPT2":
        from gpt2.model.model import GPT2

        return GPT2
    if name == "inspect":  # gpt2.inspect.trace(...) after `import gpt2`, torch imported then
        import importlib

        return importlib.import_module("gpt2.inspect")
    raise AttributeError(f"module 'gpt2' has no attribute {name!r}")
