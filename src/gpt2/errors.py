"""The one exception family of `gpt2`: catch `GPT2Error` to catch them all.

Each subclass also derives from the built-in exception a Python user would
expect (`ValueError`, `TypeError`, `FileNotFoundError`, `OSError`), so existing
`except ValueError:` code keeps working. The warnings `gpt2` gives derive from
`GPT2Warning`, so that one filter (`warnings.simplefilter("ignore", GPT2Warning)`)
silences them all.
"""

from __future__ import annotations

import os
import sys
import warnings


class Concerning:
    """What an error or a warning of `gpt2` is about: `param` names the argument it concerns,
    as the library calls it ("max_new_tokens"), where there is one; `also`, any other arguments
    its message names (every one it names as an argument: the command line can then say each as
    its flag). The server answers `param` as OpenAI's `param` field; the command line names the
    flag that sets each in its place ("--max-iters must be ...", "pass --resume"), since messages
    name no flags (`gpt2.cli.flags.with_flags`)."""

    def __init__(self, message: str = "", param: str | None = None, also: tuple[str, ...] = ()):
        super().__init__(message)
        self.param = param
        self.also = tuple(also)


class GPT2Error(Concerning, Exception):
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


class DisallowedSpecialTokenError(GPT2Error, ValueError):
    """Text that spells a special token (e.g. "<|endoftext|>") given to `Tokenizer.encode` without
    saying how to read it: tiktoken's ValueError, with tiktoken's message."""


class ConfigError(GPT2Error, ValueError):
    """A model configuration is invalid (e.g. n_embd not divisible by n_head)."""


class UnknownModelError(GPT2Error, ValueError):
    """A model name is neither a released GPT-2 nor a local directory."""


class CheckpointError(GPT2Error, ValueError):
    """A weights file is corrupt, truncated, or does not fit the model."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A weights file or directory does not exist."""


class ContextLengthError(GPT2Error, ValueError):
    """A sequence is longer than the model's context (n_ctx)."""


class NonFiniteError(GPT2Error, FloatingPointError):
    """A model produced NaN or infinite values (weights holding NaN or inf, or a dtype that overflowed)."""


class DataError(GPT2Error, ValueError):
    """Training data is missing, corrupt, or does not fit (a data directory, a corpus, a split)."""


class UnwritablePathError(GPT2Error, OSError):
    """A file or directory cannot be written: a read-only file system, no permission, a file where a directory is
    needed."""


class DistributedError(GPT2Error, RuntimeError):
    """Training on several processes failed: a bad launch, or a process that died or stopped answering."""


class ClusterError(GPT2Error, RuntimeError):
    """Serving on a Ray cluster failed: the cluster cannot be started or reached, or the replicas fail to start."""


class RecipeError(GPT2Error, ValueError):
    """A recipe file (a run's settings in TOML) is not TOML, or holds an unknown key or a value of the wrong type."""


class RecipeNotFoundError(RecipeError, FileNotFoundError):
    """A recipe is neither a file nor the name of a recipe shipped with gpt2."""


class ChatTemplateError(GPT2Error, ValueError):
    """A chat template (Jinja2) that cannot be read, compiled or rendered; the message gives the line."""


class MissingPackageError(GPT2Error, ImportError):
    """An optional feature's package is not installed (the message names the extra that installs it)."""


class MemoryLimitError(GPT2Error, MemoryError):
    """A size that cannot fit the device's memory (a batch, a KV cache), refused before anything is allocated."""


class GPT2Warning(Concerning, UserWarning):
    """Base class of every warning `gpt2` gives; give it as an instance to name its parameter:
    `warnings.warn(WarmupWarning(message, "warmup_iters"))`."""


PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep  # gpt2's own source files
# the frames decorators add around gpt2's functions: contextlib's, torch.no_grad's (its _contextlib.py)
WRAPPERS = "contextlib.py"


def warn(message: str | Warning, category: type[Warning] | None = None) -> None:
    """`warnings.warn`, pointed at the first line outside gpt2 (and its decorators): the caller's
    line that asked. A fixed stacklevel cannot do that where doors reach one check at different
    depths (`GPT2.generate`, `generate_text`, `TextGeneration` all reach the context's check)."""
    frame, stacklevel = sys._getframe(1), 2  # stacklevel 2 is warn's caller
    while frame.f_back is not None and _in_gpt2(frame.f_code.co_filename):
        frame, stacklevel = frame.f_back, stacklevel + 1
    warnings.warn(message, category, stacklevel=stacklevel)


def _in_gpt2(filename: str) -> bool:
    """A frame of gpt2's, or of a decorator around one of its functions."""
    return filename.startswith(PACKAGE) or filename.endswith(WRAPPERS)
