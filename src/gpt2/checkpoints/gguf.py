"""GGUF, llama.cpp's file: a GPT-2 written as llama.cpp's `gpt2` architecture, and read back.

    write_gguf(config, tensors, tokenizer, "model.gguf", dtype="q8_0")   # tensors: hf_state_dict's
    file = open_gguf("model.gguf")          # its config, from the metadata, checked against its tensors
    for name, array in file.tensors(): ...  # under Hugging Face's names, in its layout, float32
    file.tokenizer()                        # the vocabulary inside (GPT-2's own Tokenizer where it is GPT-2's)

What llama.cpp's `gpt2` loader reads (src/models/gpt2.cpp, src/llama-model.cpp's hyperparameters,
src/llama-vocab.cpp), as its converter writes it from a Hugging Face GPT-2 (convert_hf_to_gguf.py's
GPT2Model); every name and key is taken from the `gguf` package's constants:

- metadata: general.architecture "gpt2"; gpt2.context_length, embedding_length, feed_forward_length
  (4 * n_embd), block_count, attention.head_count, attention.layer_norm_epsilon;
- the vocabulary: tokenizer.ggml.model "gpt2" (byte-level BPE) with its tokens in the files' printable
  form ("Ġthe"), their types, the merges ("Ġ t"), the pre-tokenizer "gpt-2" and the special ids
  (<|endoftext|> as bos, eos and unknown); ids the model has beyond its tokenizer's are unused
  "[PAD{i}]" tokens, as the converter pads them. A model without a vocabulary is "none" with
  gpt2.vocab_size (the converter's way): llama.cpp loads it and decodes token ids through its API,
  while its tools that read or write text cannot use it;
- the tensors: token_embd, position_embd, blk.N.{attn_norm, attn_qkv, attn_output, ffn_norm, ffn_up,
  ffn_down}, output_norm, each norm and linear layer with its bias; a linear layer's weight is stored
  (out, in) in NumPy's order, Hugging Face's Conv1D (in, out) transposed, as ggml multiplies. There is
  no `output`: llama.cpp takes token_embd for the head when it is absent, as GPT-2 ties the two.
  f16 and q8_0 narrow the 2-D weights but position_embd, and norms and biases stay f32 (the
  converter's rule); a weight whose rows are not whole q8_0 blocks of 32 is f16, as it falls back.

What llama.cpp's gpt2 cannot hold is refused: the exact GELU (its gpt2 graph computes the tanh
approximation) and a character vocabulary (it reads byte-level BPE, with an end-of-text id). A model
without biases, or with sinusoidal positions, is written with zero biases and the fixed table, as
`save_pretrained` writes them for transformers: it reads back as a model with both, computing the same.

Torch-free; the `gguf` package (the export extra) is imported where a file is read or written.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpt2._checks import require_package
from gpt2._files import atomic_path, writable_directory
from gpt2.checkpoints.config import GPT2Config, sinusoidal_positions
from gpt2.errors import CheckpointError, ConfigError, InvalidArgumentError, UnwritablePathError, VocabularyError
from gpt2.tokenizer import EOT, CharTokenizer, Tokenizer, assumed_tokenizer, same_vocabulary
from gpt2.tokenizer.load import from_file_form, to_file_form

DTYPES = ("f32", "f16", "q8_0")
MAGIC = b"GGUF"  # the first four bytes of every GGUF file
SUFFIX = ".gguf"
BPE = "gpt2"  # tokenizer.ggml.model of a byte-level BPE (llama-vocab.cpp's name, a value, not a key)
NO_VOCABULARY = "none"  # ... of a model without one (the converter's _set_vocab_none)
PRE_TOKENIZER = "gpt-2"  # tokenizer.ggml.pre: GPT-2's regular expression splits the text
_HEAD_TIED = 1e-2  # how far an `output` tensor may be from token_embd, of its largest value, to be the same head

# Hugging Face's modules in a block -> llama.cpp's tensor (a gguf.MODEL_TENSOR member), and whether
# it is a linear layer (a Conv1D, whose (in, out) weight GGUF stores (out, in)).
_LAYER = {
    "ln_1": ("ATTN_NORM", False),
    "attn.c_attn": ("ATTN_QKV", True),
    "attn.c_proj": ("ATTN_OUT", True),
    "ln_2": ("FFN_NORM", False),
    "mlp.c_fc": ("FFN_UP", True),
    "mlp.c_proj": ("FFN_DOWN", True),
}


def _gguf() -> Any:
    return require_package("gguf", "export", "GGUF files need")


def _architecture(gguf: Any) -> str:
    return gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.GPT2]  # "gpt2"


@dataclass(frozen=True)
class _Tensor:
    name: str  # ours, Hugging Face's
    gguf_name: str
    shape: tuple[int, ...]  # as the file holds it, in NumPy's order: llama.cpp's {ne0, ne1} reversed
    transposed: bool  # a linear layer's weight: ours (in, out), the file's (out, in)

    @property
    def ours(self) -> tuple[int, ...]:
        return self.shape[::-1] if self.transposed else self.shape


def _layout(config: GPT2Config, gguf: Any) -> list[_Tensor]:
    """Every tensor llama.cpp's gpt2 loader creates for a model of `config`, with the shape it asks."""
    C, V, names, member = config.n_embd, config.n_vocab, gguf.TENSOR_NAMES, gguf.MODEL_TENSOR
    tensors = [
        _Tensor("transformer.wte.weight", names[member.TOKEN_EMBD] + ".weight", (V, C), False),
        _Tensor("transformer.wpe.weight", names[member.POS_EMBD] + ".weight", (config.n_ctx, C), False),
    ]
    # (out, in) of each module's weight; a norm's is (C,), and every bias is (out,)
    shapes = {
        "ln_1": (C,),
        "attn.c_attn": (3 * C, C),
        "attn.c_proj": (C, C),
        "ln_2": (C,),
        "mlp.c_fc": (4 * C, C),
        "mlp.c_proj": (C, 4 * C),
    }
    for i in range(config.n_layer):
        for module, (tensor, linear) in _LAYER.items():
            base, shape = names[getattr(member, tensor)].format(bid=i), shapes[module]
            tensors.append(_Tensor(f"transformer.h.{i}.{module}.weight", base + ".weight", shape, linear))
            tensors.append(_Tensor(f"transformer.h.{i}.{module}.bias", base + ".bias", shape[:1], False))
    norm = names[member.OUTPUT_NORM]
    tensors.append(_Tensor("transformer.ln_f.weight", norm + ".weight", (C,), False))
    tensors.append(_Tensor("transformer.ln_f.bias", norm + ".bias", (C,), False))
    return tensors


def is_gguf(path: str | os.PathLike) -> bool:
    """Whether a file is one to read as GGUF: its name ends in .gguf, or it begins with GGUF's magic."""
    path = Path(path)
    if path.suffix.lower() == SUFFIX:
        return True
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def check_dtype(dtype: object) -> str:
    """The GGUF type the weights are written in: f32, f16 or q8_0."""
    if dtype not in DTYPES:
        raise InvalidArgumentError(
            f"dtype must be one of {', '.join(DTYPES)} (the weights' type in the GGUF file), got {dtype!r}", "dtype"
        )
    return dtype  # type: ignore[return-value]


# ------------------------------------------------------------------ writing


def write_gguf(
    config: GPT2Config,
    tensors: Mapping[str, Any],
    tokenizer: Tokenizer | CharTokenizer | None,
    path: str | os.PathLike,
    dtype: str = "f32",
    *,
    name: str | None = None,
) -> Path:
    """Write a model of `config` as llama.cpp's `gpt2` GGUF file at `path` (atomically: nothing is left
    there if it fails) and return the path. `tensors`: our names -> arrays (NumPy's, or anything
    `np.asarray` takes, e.g. `hf_state_dict`'s CPU tensors), in our layout; `tokenizer` None is GPT-2's
    for a model of GPT-2's vocabulary, else none (the file's vocabulary is then "none"); `dtype` the
    2-D weights' type (f32, f16, q8_0); `name` general.name (the file's stem by default).
    What llama.cpp's gpt2 cannot hold raises InvalidArgumentError before anything is written."""
    dtype = check_dtype(dtype)
    tokenizer = _vocabulary_to_write(config, tokenizer)
    if config.activation != "gelu_tanh":
        raise InvalidArgumentError(
            f"llama.cpp's gpt2 architecture computes GELU's tanh approximation (gelu_tanh), and this model "
            f"uses the exact GELU ({config.activation!r}): llama.cpp would compute another function",
            "config",
        )
    gguf, path = _gguf(), Path(path)
    if path.is_dir():
        raise UnwritablePathError(f"cannot write {path}: {path} is a directory; give a file's path (model.gguf)")
    writable_directory(path.parent)  # before the work: an unwritable place fails at once
    arrays = [(t.gguf_name, *_encode(_array(config, tensors, t), t, dtype, gguf)) for t in _layout(config, gguf)]
    file_type = {
        "f32": gguf.LlamaFileType.ALL_F32,
        "f16": gguf.LlamaFileType.MOSTLY_F16,
        "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    }[dtype]
    with atomic_path(path) as tmp:
        writer = gguf.GGUFWriter(tmp, _architecture(gguf))
        try:
            _add_metadata(writer, config, path.stem if name is None else name, file_type, gguf)
            _add_vocabulary(writer, tokenizer, config.n_vocab, gguf)
            for gguf_name, array, ggml_type in arrays:
                writer.add_tensor(gguf_name, array, raw_dtype=ggml_type)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
    return path


def _vocabulary_to_write(config: GPT2Config, tokenizer: Tokenizer | CharTokenizer | None) -> Tokenizer | None:
    """The BPE vocabulary the file will hold (None: none), or InvalidArgumentError for one llama.cpp cannot read."""
    tokenizer = assumed_tokenizer(config.n_vocab) if tokenizer is None else tokenizer
    if isinstance(tokenizer, CharTokenizer):
        raise InvalidArgumentError(
            f"llama.cpp's gpt2 architecture reads GPT-2's byte-level BPE vocabulary (tokenizer.ggml.model "
            f"'gpt2', with an end-of-text id), and this model's is a character vocabulary of "
            f"{tokenizer.n_vocab} characters, which it cannot hold",
            "tokenizer",
        )
    if tokenizer is None:
        return None
    if tokenizer.n_vocab > config.n_vocab:
        raise InvalidArgumentError(
            f"the tokenizer has {tokenizer.n_vocab} ids, more than the model's vocabulary of {config.n_vocab}",
            "tokenizer",
        )
    if not tokenizer.merges:
        raise InvalidArgumentError(
            "llama.cpp reads a byte-level BPE through its merges (tokenizer.ggml.merges), and this vocabulary has none",
            "tokenizer",
        )
    return tokenizer


def _array(config: GPT2Config, tensors: Mapping[str, Any], tensor: _Tensor) -> np.ndarray:
    """One tensor as the file holds it (float32, transposed where it is a linear layer's weight); the
    zero biases and the fixed position table of a model that has neither, as save_pretrained writes them."""
    if tensor.name in tensors:
        value = np.asarray(tensors[tensor.name], dtype=np.float32)
    elif tensor.name == "transformer.wpe.weight" and config.positions == "sinusoidal":
        value = sinusoidal_positions(config.n_ctx, config.n_embd)
    elif tensor.name.endswith(".bias") and not config.bias:
        value = np.zeros(tensor.ours, dtype=np.float32)
    else:
        raise InvalidArgumentError(f"the tensors lack {tensor.name}, which a model of this config has", "tensors")
    if value.shape != tensor.ours:
        raise InvalidArgumentError(
            f"tensor {tensor.name} has shape {list(value.shape)}, but the config (n_embd={config.n_embd}, "
            f"n_vocab={config.n_vocab}, n_ctx={config.n_ctx}) needs {list(tensor.ours)}",
            "tensors",
        )
    return np.ascontiguousarray(value.T if tensor.transposed else value)


def _encode(array: np.ndarray, tensor: _Tensor, dtype: str, gguf: Any) -> tuple[np.ndarray, Any]:
    """(the bytes' array, its GGML type) as the converter chooses: 2-D weights in `dtype` but
    position_embd; norms and biases in f32; q8_0 rows not whole blocks in f16."""
    types = gguf.GGMLQuantizationType
    if dtype == "f32" or array.ndim != 2 or tensor.name == "transformer.wpe.weight":
        return array, types.F32
    if dtype == "q8_0":
        try:
            return gguf.quants.quantize(array, types.Q8_0), types.Q8_0
        except gguf.QuantError:  # a row of n_embd (or 4 n_embd) not a multiple of 32
            pass
    with np.errstate(over="ignore"):  # said below, in words
        half = array.astype(np.float16)
    if not np.isfinite(half).all() and np.isfinite(array).all():
        raise InvalidArgumentError(
            f"tensor {tensor.name} has values beyond float16's range (largest {np.abs(array).max():.4g}, "
            f"float16's 65504): write it with dtype f32",
            "dtype",
        )
    return half, types.F16


def _add_metadata(writer: Any, config: GPT2Config, name: str, file_type: int, gguf: Any) -> None:
    writer.add_name(name)
    writer.add_context_length(config.n_ctx)
    writer.add_embedding_length(config.n_embd)
    writer.add_feed_forward_length(4 * config.n_embd)
    writer.add_block_count(config.n_layer)
    writer.add_head_count(config.n_head)
    writer.add_layer_norm_eps(config.layer_norm_epsilon)
    writer.add_vocab_size(config.n_vocab)  # the ids, the tokenizer's and any beyond (llama.cpp reads it first)
    writer.add_file_type(file_type)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _add_vocabulary(writer: Any, tokenizer: Tokenizer | None, n_vocab: int, gguf: Any) -> None:
    if tokenizer is None:
        writer.add_tokenizer_model(NO_VOCABULARY)  # llama.cpp makes gpt2.vocab_size ids of no text, for its API
        return
    kinds = gguf.TokenType
    special = {i: token for token, i in tokenizer.special_tokens.items()}
    tokens = [special[i] if i in special else to_file_form(tokenizer.token_bytes(i)) for i in range(tokenizer.n_vocab)]
    types = [int(kinds.CONTROL if i in special else kinds.NORMAL) for i in range(tokenizer.n_vocab)]
    padding = range(tokenizer.n_vocab, n_vocab)  # the model's ids beyond the tokenizer's (a vocabulary rounded up)
    writer.add_tokenizer_model(BPE)
    writer.add_tokenizer_pre(PRE_TOKENIZER)
    writer.add_token_list(tokens + [f"[PAD{i}]" for i in padding])
    writer.add_token_types(types + [int(kinds.UNUSED)] * len(padding))
    writer.add_token_merges([f"{to_file_form(a)} {to_file_form(b)}" for a, b in tokenizer.merges])
    for add in (writer.add_bos_token_id, writer.add_eos_token_id, writer.add_unk_token_id):
        add(tokenizer.eot_token)
    writer.add_add_bos_token(False)  # GPT-2 begins a text with its first token, as its tokenizer encodes it
    if tokenizer.chat_template is not None:
        writer.add_chat_template(tokenizer.chat_template)


# ------------------------------------------------------------------ reading


@dataclass
class GGUFFile:
    """A GGUF file of llama.cpp's gpt2 architecture, opened (`open_gguf`): its config and metadata,
    and its tensors (their types and shapes, their bytes mapped), from which `tensors` and
    `tokenizer` read the rest."""

    path: Path
    config: GPT2Config
    metadata: dict[str, Any] = field(repr=False)  # key -> value (a list for an array)
    stored: dict[str, Any] = field(repr=False)  # GGUF's name -> the gguf package's ReaderTensor

    def tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        """(our name, float32 array in our layout) of each weight, one at a time, dequantized: f16 and
        q8_0 (and the other types the gguf package dequantizes) read as float32 copies of their own."""
        gguf = _gguf()
        head = self.stored.get(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.OUTPUT] + ".weight")
        for tensor in _layout(self.config, gguf):
            array = _dequantize(self.stored[tensor.gguf_name], self.path, gguf)
            if head is not None and tensor.name == "transformer.wte.weight":
                self._check_tied(_dequantize(head, self.path, gguf), array, head.name)
            yield tensor.name, np.ascontiguousarray(array.T) if tensor.transposed else array

    def _check_tied(self, head: np.ndarray, wte: np.ndarray, name: str) -> None:
        """An `output` head is read only as what GPT-2 has: token_embd itself (maybe in another type)."""
        if not np.allclose(head, wte, rtol=0.0, atol=_HEAD_TIED * float(np.abs(wte).max())):
            raise CheckpointError(
                f"{self.path}: its head ({name}) is not its token embeddings (token_embd.weight); GPT-2 ties "
                f"the two, and gpt2 reads no model with a head of its own"
            )

    def tokenizer(self) -> Tokenizer | None:
        """The vocabulary inside, a Tokenizer (`Tokenizer.gpt2()` itself where it is GPT-2's), with
        the file's chat template; None for a file without one (tokenizer.ggml.model "none")."""
        keys = _gguf().Keys.Tokenizer

        def value(key: str, *default: Any) -> Any:
            return _value(self.metadata, key, self.path, *default)

        model = value(keys.MODEL, NO_VOCABULARY)
        if model in (NO_VOCABULARY, "no_vocab"):  # llama.cpp's two names for none
            return None
        if model != BPE:
            raise CheckpointError(
                f"{self.path}: its tokenizer is llama.cpp's {model!r}, not GPT-2's byte-level BPE ({BPE!r})"
            )
        if (pre := value(keys.PRE, PRE_TOKENIZER)) != PRE_TOKENIZER:
            raise CheckpointError(
                f"{self.path}: its tokenizer splits text with llama.cpp's {pre!r} pre-tokenizer, not GPT-2's "
                f"({PRE_TOKENIZER!r}), which gpt2's tokenizer is"
            )
        tokenizer = _bpe(value(keys.LIST), value(keys.TOKEN_TYPE, None), value(keys.MERGES), self.path)
        if tokenizer.n_vocab == Tokenizer.gpt2().n_vocab and same_vocabulary(tokenizer, Tokenizer.gpt2()):
            tokenizer = Tokenizer.gpt2()  # the shared instance
        template = value(keys.CHAT_TEMPLATE, None)
        return tokenizer if template is None else tokenizer.with_chat_template(template)


# The last file opened, by its path and identity: `read_config` and then `from_pretrained` parse it once.
_OPENED: dict[tuple[str, int, int, int], GGUFFile] = {}


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    """Open a GGUF file of llama.cpp's gpt2 architecture: its header parsed, its config read from the
    metadata and every tensor's name and shape checked against it. CheckpointError (naming the file)
    for a file that is not GGUF, is truncated, is of another architecture or does not fit."""
    path = Path(path)
    try:
        status = path.stat()
        identity = (str(path.resolve()), status.st_ino, status.st_size, status.st_mtime_ns)
    except OSError:
        identity = None  # _read_header says why
    if identity in _OPENED:
        return _OPENED[identity]
    gguf = _gguf()
    metadata, stored = _read_header(path, gguf)
    architecture = _value(metadata, gguf.Keys.General.ARCHITECTURE, path)
    if architecture != _architecture(gguf):
        raise CheckpointError(
            f"{path} is a GGUF file of llama.cpp's {architecture!r} architecture, not {_architecture(gguf)!r} "
            f"(GPT-2's): gpt2 reads GPT-2's only"
        )
    config = _config(metadata, path, gguf)
    _check_tensors(stored, config, path, gguf)
    _OPENED.clear()
    _OPENED[identity] = opened = GGUFFile(path, config, metadata, stored)  # type: ignore[index]
    return opened


def _read_header(path: Path, gguf: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metadata, tensors by name) of a GGUF file, as the gguf package's reader parses them."""
    try:
        with open(path, "rb") as f:
            magic = f.read(len(MAGIC))
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror or e}") from None
    if magic != MAGIC:
        raise CheckpointError(
            f"{path} is not a GGUF file: it does not begin with GGUF's magic bytes {MAGIC!r} (it begins {magic!r})"
        )

    class Reader(gguf.GGUFReader):
        """gguf's reader over a plain view of its memory map: it slices it a million times for GPT-2's
        vocabulary, three times faster than slicing np.memmap (whose __array_finalize__ runs on each)."""

        @property
        def data(self) -> np.ndarray:
            return self._view

        @data.setter
        def data(self, mapped: np.memmap) -> None:
            self._view = mapped.view(np.ndarray)  # the same bytes, still mapped

    try:
        reader = Reader(path)
        metadata = {key: entry.contents() for key, entry in reader.fields.items()}
    except Exception as e:  # the reader's own checks, or bytes ending early: any exception of the parse
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(f"{path} is truncated or corrupt ({why}); export or download it again") from None
    return metadata, {tensor.name: tensor for tensor in reader.tensors}


_REQUIRED = object()


def _value(metadata: Mapping[str, Any], key: str, path: Path, default: Any = _REQUIRED) -> Any:
    """A metadata value (a list for an array); `default` where the key is absent, else CheckpointError."""
    if key in metadata:
        return metadata[key]
    if default is _REQUIRED:
        raise CheckpointError(f"{path} lacks the metadata key {key}, which llama.cpp's gpt2 loader needs")
    return default


def _integer(metadata: Mapping[str, Any], key: str, path: Path, default: Any = _REQUIRED) -> Any:
    """An integer key, or one per layer (llama.cpp's get_key_or_arr) with the same value in each: GPT-2's layers
    are alike."""
    if key not in metadata:
        return _value(metadata, key, path, default)
    value = metadata[key]
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise CheckpointError(f"{path}: {key} differs between layers ({value}), and GPT-2's layers are alike")
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckpointError(f"{path}: {key} is {value!r}, not an integer")
    return value


def _config(metadata: Mapping[str, Any], path: Path, gguf: Any) -> GPT2Config:
    """The config the metadata describes, with what GPT-2's architecture fixes checked."""
    llm, attention, arch = gguf.Keys.LLM, gguf.Keys.Attention, _architecture(gguf)
    key = lambda template: template.format(arch=arch)  # noqa: E731
    n_embd, n_head = (
        _integer(metadata, key(llm.EMBEDDING_LENGTH), path),
        _integer(metadata, key(attention.HEAD_COUNT), path),
    )
    if (kv := _integer(metadata, key(attention.HEAD_COUNT_KV), path, n_head)) != n_head:
        raise CheckpointError(
            f"{path}: {key(attention.HEAD_COUNT_KV)} is {kv}, but GPT-2's attention has a key and value "
            f"head for each of its {n_head} heads"
        )
    if (ff := _integer(metadata, key(llm.FEED_FORWARD_LENGTH), path, 4 * n_embd)) != 4 * n_embd:
        raise CheckpointError(
            f"{path}: {key(llm.FEED_FORWARD_LENGTH)} is {ff}, but GPT-2's MLP is 4 * n_embd = {4 * n_embd}"
        )
    n_vocab = _integer(metadata, key(llm.VOCAB_SIZE), path, None)  # as llama.cpp: the key, else the tokens
    if n_vocab is None:
        n_vocab = len(_value(metadata, gguf.Keys.Tokenizer.LIST, path))
    epsilon = _value(metadata, key(attention.LAYERNORM_EPS), path)
    if isinstance(epsilon, float):  # a float32: its shortest decimal, so that 1e-5 reads back as 1e-5
        epsilon = float(str(np.float32(epsilon)))
    fields = {
        "n_vocab": n_vocab,
        "n_ctx": _integer(metadata, key(llm.CONTEXT_LENGTH), path),
        "n_embd": n_embd,
        "n_head": n_head,
        "n_layer": _integer(metadata, key(llm.BLOCK_COUNT), path),
        "layer_norm_epsilon": epsilon,
    }
    try:
        return GPT2Config(**fields)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def _check_tensors(stored: Mapping[str, Any], config: GPT2Config, path: Path, gguf: Any) -> None:
    """Every tensor llama.cpp's gpt2 loader asks for is there, in the shape the metadata says, and no
    other but `output` (llama.cpp stops at a tensor it has no use for). Shapes are named as GGUF's
    tools and llama.cpp name them: ggml's dimensions, the innermost first."""
    required = {tensor.gguf_name: tensor.shape for tensor in _layout(config, gguf)}
    layout = {**required, gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.OUTPUT] + ".weight": (config.n_vocab, config.n_embd)}
    described = f"n_layer={config.n_layer}, n_embd={config.n_embd}, n_vocab={config.n_vocab}, n_ctx={config.n_ctx}"
    for name, tensor in stored.items():
        if name not in layout:
            raise CheckpointError(
                f"{path}: unexpected tensor {name!r}, which llama.cpp's gpt2 architecture does not have"
            )
        dims, expected = [int(n) for n in tensor.shape], list(layout[name][::-1])
        if dims != expected:
            raise CheckpointError(
                f"{path}: tensor {name!r} has shape {dims}, but the metadata ({described}) needs {expected}"
            )
    missing = [name for name in required if name not in stored]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise CheckpointError(f"{path} lacks tensor(s) {', '.join(missing[:3])}{more}")


def _dequantize(tensor: Any, path: Path, gguf: Any) -> np.ndarray:
    """A tensor's values as float32, in an array of its own (nothing keeps the file mapped)."""
    try:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as error:
        raise CheckpointError(
            f"{path}: tensor {tensor.name!r} is of type {tensor.tensor_type.name}, which the gguf package "
            f"does not dequantize"
        ) from error
    return np.array(values, dtype=np.float32)


def _bpe(tokens: Sequence[str], types: Sequence[int] | None, merges: Sequence[str], path: Path) -> Tokenizer:
    """The byte-level BPE of a file's tokens (their printable form), their types and its merges; the
    unused tokens a model's vocabulary is padded with at its end are left out."""
    kinds = _gguf().TokenType
    types = list(types) if types is not None else [int(kinds.NORMAL)] * len(tokens)
    used = next((i for i, kind in enumerate(types) if kind == kinds.UNUSED), len(tokens))
    if any(kind != kinds.UNUSED for kind in types[used:]):
        raise CheckpointError(
            f"{path}: token {used} is unused, yet tokens after it are not; "
            "unused ids come last (a vocabulary's padding)"
        )
    encoder: dict[bytes, int] = {}
    special: dict[str, int] = {}
    for i, (text, kind) in enumerate(zip(tokens[:used], types)):
        if kind in (kinds.CONTROL, kinds.USER_DEFINED) or text == EOT:
            special[text] = i
        elif kind != kinds.NORMAL:
            kind = kinds(kind).name if kind in set(kinds) else kind
            raise CheckpointError(f"{path}: token {i} ({text!r}) is of type {kind}, which a byte-level BPE has not")
        else:
            encoder[_token_bytes(text, f"token {i}", path)] = i
    pairs = []
    for rank, merge in enumerate(merges):
        halves = merge.split(" ")
        if len(halves) != 2 or not all(halves):
            raise CheckpointError(f"{path}: merge {rank} is {merge!r}, not two tokens separated by a space")
        pairs.append((_token_bytes(halves[0], f"merge {rank}", path), _token_bytes(halves[1], f"merge {rank}", path)))
    try:
        return Tokenizer(encoder, pairs, special)
    except VocabularyError as e:
        raise VocabularyError(f"{path}: {e}") from None


def _token_bytes(text: str, what: str, path: Path) -> bytes:
    try:
        return from_file_form(text)
    except KeyError:
        raise CheckpointError(f"{path}: {what} ({text!r}) has characters outside GPT-2's byte alphabet") from None
