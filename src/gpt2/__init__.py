"""GPT-2 from scratch: OpenAI's tokenizer, model, weights, generation and training."""

from gpt2.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    ConfigError,
    ContextLengthError,
    GPT2Error,
    InputTypeError,
    InvalidArgumentError,
    TokenIdError,
    UnknownModelError,
    VocabularyError,
    VocabularyNotFoundError,
)
from gpt2.tokenizer import IncrementalDecoder, Tokenizer

__version__ = "0.1.0"

__all__ = [
    "GPT2Error",
    "IncrementalDecoder",
    "InputTypeError",
    "InvalidArgumentError",
    "TokenIdError",
    "Tokenizer",
    "VocabularyError",
    "VocabularyNotFoundError",
]
