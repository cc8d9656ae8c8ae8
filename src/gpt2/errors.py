"""The one exception family of `gpt2`: catch `GPT2Error` to catch them all.

Each subclass also derives from the built-in exception a Python user would
expect (`ValueError`, `TypeError`, `FileNotFoundError`), so existing
`except ValueError:` code keeps working.
"""


class GPT2Error(Exception):
    """Base class of every error `gpt2` raises on purpose."""


class VocabularyError(GPT2Error, ValueError):
    """A vocabulary (encoder.json / vocab.bpe) is missing, corrupt or inconsistent."""


class VocabularyNotFoundError(VocabularyError, FileNotFoundError):
    """A vocabulary file does not exist."""


class TokenIdError(GPT2Error, ValueError):
    """A token id is negative, not below n_vocab, or not an integer."""


class InputTypeError(GPT2Error, TypeError):
    """An argument has the wrong type (e.g. bytes given where str is expected)."""


class InvalidArgumentError(GPT2Error, ValueError):
    """An argument has the right type but a value that cannot be used."""
