"""GPT-2's tokenizer, in rooms as tiktoken's: `core` (byte-level BPE: encode, decode, special tokens),
`load` (the files: OpenAI's, Hugging Face's, chars.json), `registry` (a tokenizer by its name or its
directory), `pool` (encode_batch's worker processes), `native` (the first pass in C, compiled once),
`char` (a character vocabulary), `trainer` (learning BPE merges) and `chat` (the chat template a tokenizer
carries, rendered; import it as `gpt2.tokenizer.chat`, which brings Jinja2, so that `import gpt2` stays quick).
"""

from gpt2.tokenizer.char import CharTokenizer
from gpt2.tokenizer.core import (
    GPT2_PATTERN,
    CarriesChatTemplate,
    IncrementalDecoder,
    Tokenizer,
    disallowed_special_message,
    special_sets,
    token_text,
)
from gpt2.tokenizer.load import CHARS_FILE, EOT, GPT2_VOCAB_DIR, TOKENIZER_FILES, bytes_to_unicode, read_chat_template
from gpt2.tokenizer.registry import SPECS, assumed_tokenizer, load_tokenizer, parse_tokenizer_spec, same_vocabulary

__all__ = [
    "CHARS_FILE",
    "EOT",
    "GPT2_PATTERN",
    "GPT2_VOCAB_DIR",
    "SPECS",
    "TOKENIZER_FILES",
    "CarriesChatTemplate",
    "CharTokenizer",
    "IncrementalDecoder",
    "Tokenizer",
    "assumed_tokenizer",
    "bytes_to_unicode",
    "disallowed_special_message",
    "load_tokenizer",
    "parse_tokenizer_spec",
    "read_chat_template",
    "same_vocabulary",
    "special_sets",
    "token_text",
]
